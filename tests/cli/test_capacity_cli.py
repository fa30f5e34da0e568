"""`inferlab capacity` through the real entry point."""

import json
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=120)


def test_capacity_json_is_the_case_study_table(tmp_path):
    png = tmp_path / "cap.png"
    r = run("capacity", "llama-2-7b", "--on", "a100-40gb", "--engine", "vllm", "--ctx", "2000,4000,6000,8000,10000,12000",
            "--kv", "f16,int8", "--window", "2048", "--target-sessions", "80", "--weights-gb", "14", "--plot", str(png), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kind"] == "CapacityReport" and out["engine_version"] == "0.33.0"
    base = out["rows"][0]
    assert base["strategy"].startswith("baseline") and [c["sessions"] for c in base["cells"]] == [24, 12, 8, 6, 4, 4]
    assert out["pool"]["log_line"].startswith("GPU KV cache size:")
    assert png.stat().st_size > 10_000


def test_capacity_text_and_bad_input():
    r = run("capacity", "llama-2-7b", "--on", "a100-40gb", "--engine", "sglang", "--ctx", "4000")
    assert r.returncode == 0 and "max_total_num_tokens=" in r.stdout and "mem_fraction_static 0.82" in r.stdout
    bad = run("capacity", "llama-2-7b", "--on", "a100-40gb", "--ctx", "4k")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--ctx" in bad.stderr
    bad = run("capacity", "llama-2-7b", "--on", "a100-40gb", "--kv", "int3")
    assert bad.returncode == 2 and "int3" in bad.stderr and bad.stderr.count("\n") == 1
    bad = run("capacity", "llama-2-7b", "--on", "a100-40gb", "--plot", "/nonexistent-dir/x.png")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1

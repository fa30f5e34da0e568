"""`inferlab advise` through the real entry point: each printed command parses against its engine's table."""

import json
import subprocess
import sys

from inferlab.advise.flags import parse_command


def run(*args):
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=180)


def test_advise_json_commands_parse():
    r = run("advise", "llama-3.1-8b", "--on", "rtx4090", "--users", "8", "--shared-prefix", "1500", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["engine"] == "sglang" and out["recipe"] == "shared-prefix"
    for e in out["engines"]:
        parse_command(e["engine"], e["command"]["argv"])


def test_advise_text_ranks_placements():
    r = run("advise", "qwen3-30b-a3b", "--on", "rtx4060ti", "--ctx", "8192")
    assert r.returncode == 0, r.stderr
    assert "placements ranked" in r.stdout and "--n-cpu-moe" in r.stdout and "--fit default" in r.stdout
    bad = run("advise", "llama-3.1-8b", "--on", "rtx4090", "--users", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "users" in bad.stderr
    bad = run("advise", "llama-3.1-8b", "--on", "nosuchgpu")
    assert bad.returncode == 2 and "nosuchgpu" in bad.stderr

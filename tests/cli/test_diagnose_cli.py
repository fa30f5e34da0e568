"""`inferlab diagnose` through the real entry point."""

import json
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=120)


def test_diagnose_names_the_row_and_the_effect():
    r = run("diagnose", "qwen2.5-14b", "--on", "rtx3060", "--json", "--", "-c", "32768")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {f["row"]: f for f in out["findings"]}
    assert "partial-offload" in rows and any(e.startswith("q8_0 KV: -ngl") for e in rows["partial-offload"]["effects"])
    t = run("diagnose", "llama-3.1-70b", "--on", "rtx4090", "--error", "cudaMalloc failed: out of memory", "--", "-ngl", "99", "-c", "8192")
    assert t.returncode == 0 and "allocation" in t.stdout and "drop -ngl" in t.stdout


def test_diagnose_bad_flags_one_line():
    r = run("diagnose", "llama-3.1-8b", "--on", "rtx4090", "--", "-ngl", "99", "--bogus-flag", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--bogus-flag" in r.stderr
    r = run("diagnose", "llama-3.1-8b", "--on", "rtx4090", "--", "-ctv", "q4_0", "-fa", "off")
    assert r.returncode == 2 and "flash attention" in r.stderr

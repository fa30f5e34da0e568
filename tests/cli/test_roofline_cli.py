"""`inferlab roofline` through the real entry point (a subprocess)."""

import json
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=120)


def test_roofline_json_ridge_and_points():
    r = run("roofline", "--on", "rtx3060", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # the lesson's Try This 1: RTX 3060 at Q4_K (4.5 bpw): 25.6 TFLOP/s over 360 GB/s = 71.1 FLOP/byte -> batch 20
    from inferlab.hardware.catalog import MACHINES

    g = MACHINES["rtx3060"].gpu
    ridge = g.fp16_flops / g.bandwidth_bytes_per_s
    assert out["ridge_flop_per_byte"] == pytest.approx(ridge) and out["ridge_batch"] == pytest.approx(ridge * 4.5 / 16)
    assert [p["batch"] for p in out["points"] if p["phase"] == "decode"] == [1, 8, 32, 128]


def test_roofline_with_a_model_human_output_and_plot(tmp_path):
    png = tmp_path / "roof.png"
    r = run("roofline", "--on", "a100-40gb", "--model", "llama-2-7b", "--quant", "type:F16", "--ctx", "4096", "--batch", "1,2,4",
            "--context", "1024", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert "ridge" in r.stdout and "prefill, 2048 tokens" in r.stdout and "compute" in r.stdout
    assert "refused: batch 4 x context 1,024" not in r.stdout  # 4 x 1,024 = 4,096 fits -c 4096 exactly
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,needle", [
    (("roofline", "--on", "rtx4090", "--batch", "1,0"), "batches"),
    (("roofline", "--on", "rtx4090", "--batch", "one"), "--batch"),
    (("roofline", "--on", "rtx4909"), "rtx4090"),
    (("roofline", "--on", "rtx4090", "--quant", "Q9_K"), "Q"),
])
def test_bad_roofline_input_is_one_line_and_exit_2(args, needle):
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr

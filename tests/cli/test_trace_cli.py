"""`inferlab trace load|prefill|decode` through the real entry point (a subprocess), and the
answers of issue 13 s.6 that looked valid but were not (-c 0, fp8, V cache without flash attention,
--n-cpu-moe on a dense model, a context beyond the trained length or the allocated cache)."""

import json
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=120)


def one_line_error(r, needle):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_decode_trace_json_adds_up_to_the_library_speed_model():
    from inferlab.api.setup import configure
    from inferlab.perf.speed import decode_step_time

    r = run("trace", "decode", "qwen2.5-32b", "--on", "rtx4060ti", "--ctx", "8192", "--context", "2000", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kind"] == "TraceReport" and out["phase"] == "decode"
    s = configure("qwen2.5-32b", "rtx4060ti", n_ctx=8192)
    d = decode_step_time(s.placement, s.machine, 2000, 1, s.speed)
    assert sum(st["s"] for st in out["steps"]) == pytest.approx(d["total_s"], rel=1e-9)
    assert out["total_s"] == pytest.approx(d["total_s"], rel=1e-12) and out["speed_model_s"] == pytest.approx(d["total_s"])
    assert {st["bound"] for st in out["steps"]} <= {"memory", "compute", "cpu-kernels", "overhead"}
    assert {c["kv_type"] for c in out["curve"]} == {"f16", "q8_0"}


def test_human_traces_show_steps_and_totals():
    r = run("trace", "prefill", "qwen2.5-32b", "--on", "rtx4060ti", "--ctx", "8192", "--prompt", "2000")
    assert r.returncode == 0, r.stderr
    assert "op offload" in r.stdout and "= the speed model's" in r.stdout and "tok/s" in r.stdout
    r = run("trace", "load", "llama-3.1-8b", "--on", "m4max", "--ctx", "8192")
    assert r.returncode == 0, r.stderr
    assert "map 32 blocks" in r.stdout and "second launch" in r.stdout and "PCIe" not in r.stdout


def test_a_configuration_that_does_not_fit_shows_no_speed_and_exits_1():
    r = run("trace", "decode", "qwen2.5-32b", "--on", "rtx4060ti", "--ctx", "8192", "--ngl", "99")
    assert r.returncode == 1
    assert "does not fit" in r.stdout and "tok/s" not in r.stdout
    r = run("trace", "load", "qwen2.5-32b", "--on", "rtx4060ti", "--ctx", "8192", "--ngl", "99", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["steps"][-1]["name"].startswith("allocation fails")
    r = run("fit", "qwen2.5-32b", "--on", "rtx4060ti", "--ctx", "8192", "--ngl", "99", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["decode"] is None


def test_plot_paths_are_checked_before_the_computation(tmp_path):
    # the model name is wrong too: the plot path's error comes first, so nothing was computed
    one_line_error(run("trace", "decode", "no-such-model", "--on", "rtx4090", "--plot", str(tmp_path / "nope" / "x.png")), "does not exist")
    one_line_error(run("trace", "load", "no-such-model", "--on", "rtx4090", "--plot", str(tmp_path / "x.jpg")), ".png or .svg")
    one_line_error(run("roofline", "--on", "rtx4090", "--model", "no-such-model", "--plot", str(tmp_path)), "plot")
    assert list(tmp_path.iterdir()) == []
    out = tmp_path / "decode.svg"
    r = run("trace", "decode", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "8192", "--plot", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes().lstrip().startswith((b"<?xml", b"<svg")) and [p.name for p in tmp_path.iterdir()] == ["decode.svg"]


@pytest.mark.parametrize("args,needle", [
    (("trace", "decode", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "8192", "--context", "4096", "--batch", "4"), "-c 8,192"),
    (("trace", "decode", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "8192", "--contexts", "0,x"), "--contexts"),
    (("trace", "decode", "llama-3.1-8b", "--on", "rtx4090", "--batch", "0"), "batch"),
    (("trace", "prefill", "llama-3.1-8b", "--on", "rtx4090", "--prompt", "0"), "n_tokens"),
    (("trace", "load", "llama-3.1-8b", "--on", "rtx4090", "--disk-gbps", "-1"), "disk_gbps"),
    (("trace", "decode", "llama-3.1-8bb", "--on", "rtx4090"), "llama-3.1-8b"),
    (("trace", "decode", "llama-3.1-8b", "--on", "rtx4090", "--curve-kv", "f16,q9_0"), "q8_0"),
])
def test_bad_trace_input_is_one_line_and_exit_2(args, needle):
    one_line_error(run(*args), needle)


# ---- issue 13 s.6: answers that looked valid but were not


def test_ctx_0_is_the_trained_context_as_in_llama_cpp():
    a = json.loads(run("fit", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "0", "--json").stdout)
    b = json.loads(run("fit", "llama-3.1-8b", "--on", "rtx4090", "--json").stdout)
    assert a["n_ctx"] == b["n_ctx"] == 131072  # Llama 3.1's trained 131,072 tokens (16 GiB of f16 KV) fit a 24 GB card at Q4_K_M


def test_llama_cpp_cache_rules():
    one_line_error(run("fit", "llama-3.1-8b", "--on", "rtx4090", "--kv", "q8_0", "--flash-attn", "off"), "flash")
    one_line_error(run("trace", "decode", "llama-3.1-8b", "--on", "rtx4090", "--kv", "q4_0", "-fa", "off"), "quantized V cache")
    one_line_error(run("fit", "llama-3.1-8b", "--on", "rtx4090", "--kv", "fp8"), "vLLM")
    assert run("fit", "llama-3.1-8b", "--on", "rtx4090", "--kv", "q8_0", "--ctx", "8192").returncode == 0  # -fa auto turns it on
    assert run("fit", "llama-3.1-8b", "--on", "rtx4090", "--kv", "f16", "-fa", "off", "--ctx", "8192").returncode == 0


def test_notes_for_settings_that_do_nothing_or_need_care():
    out = json.loads(run("fit", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "8192", "--n-cpu-moe", "4", "--json").stdout)
    assert any("--n-cpu-moe 4 does nothing" in n and "dense" in n for n in out["notes"])
    moe = json.loads(run("fit", "qwen3-30b-a3b", "--on", "rtx4060ti", "--ctx", "8192", "--n-cpu-moe", "4", "--json").stdout)
    assert not any("does nothing" in n for n in moe["notes"])
    long = json.loads(run("fit", "llama-2-7b", "--on", "rtx4090", "--ctx", "8192", "--json").stdout)
    assert any("trained length of 4,096" in n and "RoPE" in n for n in long["notes"])  # Llama 2: 4,096 trained
    ok = json.loads(run("fit", "llama-2-7b", "--on", "rtx4090", "--ctx", "4096", "--json").stdout)
    assert not any("RoPE" in n for n in ok["notes"])


def test_decode_context_beyond_the_allocated_cache_is_refused_not_clipped():
    one_line_error(run("fit", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "8192", "--context", "9000"), "raise -c to at least 9,000")


def test_the_case_studys_kv_cache_bytes_reading():
    from inferlab.models.catalog import MODELS
    from inferlab.perf.kv_size import kv_cache_bytes, kv_cache_bytes_per_batch

    m = MODELS["llama-2-7b"]  # the case study's 7B: 32 layers x 32 heads x 128, MHA
    # 2 x 32 x 32 x 128 x 8,000 x 1 x 2 = 4,194,304,000 bytes ("4.19 GB"); x 80 sessions = 335.5 GB
    assert kv_cache_bytes_per_batch(m, 8000, 1, 2) == 4_194_304_000
    assert kv_cache_bytes_per_batch(m, 8000, 80) == 80 * 4_194_304_000
    # int8 (1 byte) and a 2,048-token window per session: 2 x 32 x 32 x 128 x 2,048 x 1 = 536,870,912 B (0.54 GB);
    # at B = 80: 42.9 GB, not "under 3 GB"
    assert kv_cache_bytes_per_batch(m, 2048, 80, 1) == pytest.approx(42.95e9, rel=1e-3)
    # llama.cpp's own reading (third argument: a cache type) gives the same for one f16 sequence
    assert kv_cache_bytes(m, 8000, "f16") == 4_194_304_000

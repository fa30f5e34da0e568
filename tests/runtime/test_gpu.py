"""The runtime on a CUDA device: device selection, a cached generation equal to the CPU's, and
peak memory from torch.cuda statistics."""

import pytest
import torch

from inferlab.runtime.device import select_device


def needs_cuda(f):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")(f))


@needs_cuda
def test_auto_selects_cuda():
    assert select_device("auto").type == "cuda"


@needs_cuda
def test_generation_on_gpu_matches_cpu(smollm, smollm_file):
    from inferlab.runtime.case_study import measure_vram_mb
    from inferlab.runtime.generate import generate
    from inferlab.runtime.llama import load_gguf

    cpu_model, tok = smollm
    gpu_model, _ = load_gguf(smollm_file, device=select_device("cuda"), n_ctx=1024)
    ids = tok.encode("The three primary colors are")
    for cache in ("contiguous", "paged", "int8"):
        assert generate(gpu_model, ids, 8, cache=cache).token_ids == generate(cpu_model, ids, 8, cache=cache).token_ids
    vram = measure_vram_mb(gpu_model, batch_size=4, context_len=256, n_new_tokens=4)
    assert "torch.cuda" in vram["source"]
    # the cache (exact bytes) is part of the measured peak above the weights already resident
    assert vram["peak_mb"] >= vram["model_mb"] + vram["cache_mb"]


def test_cuda_request_without_gpu_is_a_clear_error():
    """Holds on every machine: a fresh process that sees no CUDA device (CUDA_VISIBLE_DEVICES empty,
    which hides any GPU from torch) asks for "cuda" and gets the typed error, and "auto" gives the CPU."""
    import os
    import subprocess
    import sys

    code = ("import torch; from inferlab.runtime.device import select_device; from inferlab.errors import NotSupportedError\n"
            "assert not torch.cuda.is_available()\n"
            "print(select_device('auto').type)\n"
            "try:\n    select_device('cuda')\nexcept NotSupportedError as e:\n    print('error:', e)\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "cpu"
    assert lines[1].startswith("error:") and "no CUDA device" in lines[1], lines


def test_cpu_peak_memory_sees_an_allocation():
    """In a fresh process (a long-lived one may reuse freed, still-resident pages)."""
    import subprocess
    import sys

    code = ("import torch; from inferlab.runtime.device import PeakMemory\n"
            "with PeakMemory(torch.device('cpu')) as mem:\n"
            "    x = torch.ones(256 * 2**20 // 4); x += 1\n"
            "print(mem.peak_bytes - mem.baseline_bytes)")
    grew = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grew >= 250 * 2**20

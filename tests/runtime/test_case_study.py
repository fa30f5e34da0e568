"""The KV-cache case study's verification cells (seed 004: 3.4.1, 3.4.2, 3.7.1), run against the
runtime with the case study's own SmallTransformer and with the real SmolLM2, and its profiling
sweep (3.5) on the CPU."""

import pytest
import torch

from inferlab.runtime.case_study import (
    apply_sliding_window,
    dequantise_kv_cache_int8,
    generate_naive,
    generate_with_cache,
    measure_vram_mb,
    profile_generation_methods,
    quantise_kv_cache_int8,
)
from inferlab.runtime.kv_cache import Int8KVCache
from inferlab.runtime.small_transformer import SmallTransformer

SEED = 42


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(SEED)
    return SmallTransformer().eval()  # the case study's default size: d_model 512, 8 heads, 6 layers


@pytest.fixture(params=["small", "smollm"])
def any_model(request, small_model):
    if request.param == "small":
        return small_model
    return request.getfixturevalue("smollm")[0]


def test_verification_3_4_1_generate_naive(any_model):
    torch.manual_seed(SEED)
    _test_prompt = torch.randint(0, 32000, (1, 16))
    with torch.no_grad():
        _out_ids, _times = generate_naive(any_model, _test_prompt, n_new_tokens=5)
    assert _out_ids.shape == (1, 21), f"Expected shape (1, 21), got {_out_ids.shape}"
    assert len(_times) == 5, f"Expected 5 timing entries, got {len(_times)}"
    assert torch.equal(_out_ids[:, :16], _test_prompt)


def test_verification_3_4_2_generate_with_cache(any_model):
    torch.manual_seed(SEED)
    _test_prompt2 = torch.randint(0, 32000, (1, 16))
    with torch.no_grad():
        _out_ids2, _times2, _prefill = generate_with_cache(any_model, _test_prompt2, n_new_tokens=5)
    assert _out_ids2.shape == (1, 21), f"Expected shape (1, 21), got {_out_ids2.shape}"
    assert isinstance(_prefill, float), "prefill_time_ms should be a float"
    assert len(_times2) == 4 and _prefill > 0
    # the case study's premise: both generators are mathematically identical
    naive_ids, _ = generate_naive(any_model, _test_prompt2, n_new_tokens=5)
    assert torch.equal(naive_ids, _out_ids2)


def test_verification_3_7_1_measure_vram(small_model):
    _vram = measure_vram_mb(small_model, batch_size=1, context_len=128, n_new_tokens=5)
    for key in ("peak_mb", "model_mb", "cache_mb"):
        assert key in _vram, f"Missing {key!r} key"
    assert _vram["peak_mb"] > 0
    # exact figures: 26.9M fp32 parameters; K and V for 6 layers x 512 dims x 133 positions
    assert _vram["model_mb"] == pytest.approx(sum(p.numel() for p in small_model.parameters()) * 4 / 1e6)
    assert _vram["cache_mb"] == pytest.approx(2 * 6 * 512 * (128 + 5) * 4 / 1e6)
    assert _vram["peak_mb"] > _vram["model_mb"]  # the process holds the weights


def test_cat_cache_and_runtime_caches_agree(small_model):
    """The case study's torch.cat cache (its own forward) and the runtime's preallocated caches
    give the same logits."""
    prompt = torch.randint(0, 32000, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, caches = small_model(prompt)
        step_logits, _ = small_model(prompt[:, -1:] * 0 + 7, kv_caches=caches, position_offset=12)
        for kind in ("contiguous", "paged:4"):
            kv = small_model.new_cache(kind, batch=2, capacity=16)
            a = small_model.step(prompt, kv, all_logits=True)
            b = small_model.step(prompt[:, -1:] * 0 + 7, kv)
            torch.testing.assert_close(a, logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(b, step_logits, rtol=1e-4, atol=1e-4)


def test_profiling_sweep_runs(small_model):
    """Section 3.5's sweep, shortened: the keys, one value per context, and the case study's
    finding that a cached step is cheaper than a naive one."""
    data = profile_generation_methods(small_model, [32, 128], n_new_tokens=4, n_warmup=1)
    assert set(data) == {"context_lengths", "naive_ttft_ms", "naive_mean_step_ms", "cached_prefill_ms", "cached_mean_step_ms"}
    assert all(len(v) == 2 for v in data.values())
    assert data["cached_mean_step_ms"][1] < data["naive_mean_step_ms"][1]


def test_per_token_int8_beats_the_case_studys_per_tensor_scale():
    """Same tensor with one outlier token: per-token, per-head scales keep the other tokens precise."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 8, 256, 64, generator=g)
    k[:, :, 7] *= 50  # an outlier token, as real keys have
    kq, _, ks, _ = quantise_kv_cache_int8((k, k))
    per_tensor, _ = dequantise_kv_cache_int8(kq, kq, ks, ks)
    q, scale = Int8KVCache.quantize(k)
    per_token = q.float() * scale
    err_tensor = (per_tensor - k).abs().mean().item()
    err_token = (per_token - k).abs().mean().item()
    assert err_token < err_tensor / 5
    assert (per_token - k).abs().max() <= scale.max() / 2 + 1e-6  # rounding error bound


def test_apply_sliding_window_matches_window_cache_contents(small_model):
    prompt = torch.randint(0, 32000, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, caches = small_model(prompt)
    k, v = apply_sliding_window(caches[0], 8)
    assert k.shape[2] == 8
    ring = small_model.new_cache("window:8", capacity=32)
    with torch.no_grad():
        for t in prompt[0]:
            small_model.step(t.view(1, 1), ring)
    order = torch.argsort(ring.slot_pos)  # the ring holds the same 8 positions, rotated
    torch.testing.assert_close(ring.k[0][:, :, order], k, rtol=1e-5, atol=1e-5)

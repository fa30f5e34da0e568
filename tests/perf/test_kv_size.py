"""KV-cache sizes against published figures and a brute-force recount."""

import pytest

from inferlab.errors import InvalidValueError, UnknownNameError
from inferlab.perf.kv_size import KV_TYPES, kv_bytes_per_token, kv_cache_bytes, kv_bytes_per_value, layer_kv_bytes
from inferlab.models.catalog import MODELS


def test_llama31_8b_published_sizes():
    m = MODELS["llama-3.1-8b"]
    # the lesson: 2 * 32 layers * 8 KV heads * 128 * 2 bytes = 131,072 bytes per token
    assert kv_bytes_per_token(m, "f16") == 131072
    # 16 GiB of f16 cache at the trained 131,072-token context (the lesson's pitfall 1)
    assert kv_cache_bytes(m, 131072, "f16") == 16 * 2**30


@pytest.mark.parametrize("kv,bytes_per_value", [("f32", 4), ("f16", 2), ("bf16", 2), ("q8_0", 34 / 32), ("q4_0", 18 / 32),
                                                 ("q4_1", 20 / 32), ("q5_0", 22 / 32), ("q5_1", 24 / 32), ("iq4_nl", 18 / 32), ("fp8", 1)])
def test_block_sizes(kv, bytes_per_value):
    # ggml-common.h: block_q8_0 = fp16 scale + 32 int8 = 34 bytes; q4_0 = 2 + 16; q4_1 = 2+2+16; q5_0 = 2+4+16; q5_1 = 2+2+4+16
    assert kv_bytes_per_value(kv) == pytest.approx(bytes_per_value)


def test_brute_force_recount_for_every_catalog_model():
    for m in MODELS.values():
        expect = 0.0
        for i in range(m.n_layers):
            if m.is_mla:
                expect += (m.kv_lora_rank + m.qk_rope_head_dim) * 2
            else:
                expect += 2 * m.n_kv_heads * m.head_dim * 2  # K and V, f16
        assert kv_bytes_per_token(m, "f16") == pytest.approx(expect), m.name


def test_deepseek_v3_mla_latent_is_70kb_per_token():
    # MLA caches the 512-wide latent + 64-wide rope key per layer: 61 * 576 * 2 bytes = 70,272 bytes
    assert kv_bytes_per_token(MODELS["deepseek-v3"], "f16") == 61 * 576 * 2


def test_sliding_window_layers_hold_only_the_window():
    g = MODELS["gemma-3-27b"]  # 62 layers, every 6th global, window 1024
    n_global = sum(1 for i in range(g.n_layers) if not g.layer_is_swa(i))
    assert n_global == 10
    per_layer = 2 * g.n_kv_heads * g.head_dim * 2
    full = kv_cache_bytes(g, 131072)
    # windowed layers keep pad256(1024 + 512) = 1536 cells (llama.cpp's n_swa + n_ubatch)
    assert full == pytest.approx(n_global * per_layer * 131072 + (62 - n_global) * per_layer * 1536)
    assert full < 0.2 * kv_bytes_per_token(g) * 131072
    # a context shorter than the window: every layer holds the whole context
    assert kv_cache_bytes(g, 512) == pytest.approx(kv_bytes_per_token(g) * 512)
    assert len(layer_kv_bytes(g, 4096)) == 62


def test_bad_input():
    with pytest.raises(UnknownNameError, match="q8_0"):
        kv_bytes_per_token(MODELS["llama-3.1-8b"], "q8")
    with pytest.raises(InvalidValueError, match="n_ctx"):
        kv_cache_bytes(MODELS["llama-3.1-8b"], 0)
    with pytest.raises(InvalidValueError):
        kv_cache_bytes(MODELS["llama-3.1-8b"], -4096)
    assert "fp8" in KV_TYPES

"""KV cache bookkeeping: spec parsing, exact byte counts, capacity and block-pool limits."""

import pytest
import torch

from inferlab.errors import InvalidValueError, UnknownNameError
from inferlab.runtime.kv_cache import CacheSpec, PagedKVCache, make_cache
from inferlab.runtime.small_transformer import SmallConfig

CFG = SmallConfig(vocab_size=100, d_model=64, n_heads=4, n_layers=3, max_seq_len=256)


def test_spec_parsing():
    assert CacheSpec.parse("contiguous") == CacheSpec("contiguous")
    assert CacheSpec.parse("window:128") == CacheSpec("window", window=128)
    assert CacheSpec.parse("paged:32").block_size == 32
    assert CacheSpec.parse(" int8 ").label == "int8"
    with pytest.raises(UnknownNameError, match="did you mean 'int8'"):
        CacheSpec.parse("int9")
    with pytest.raises(InvalidValueError, match="positive integer"):
        CacheSpec.parse("window:abc")
    with pytest.raises(InvalidValueError, match="window size must be > 0"):
        CacheSpec.parse("window:0")
    with pytest.raises(InvalidValueError, match="takes no argument"):
        CacheSpec.parse("int8:4")


@pytest.mark.parametrize("spec, expected", [
    ("contiguous", 2 * 3 * 2 * 4 * 100 * 16 * 4),  # K+V, layers, batch, heads, positions, head_dim, fp32
    ("int8", 2 * 3 * 2 * 4 * 100 * 16 * 1 + 2 * 3 * 2 * 4 * 100 * 4),  # int8 values + one fp32 scale per token and head
    ("paged:16", 2 * 3 * (7 * 2) * 16 * 4 * 16 * 4),  # ceil(100/16) = 7 blocks per sequence
    ("window:10", 2 * 3 * 2 * 4 * 10 * 16 * 4 + 10 * 8),  # ring of 10 positions + their int64 positions
])
def test_exact_bytes(spec, expected):
    cache = make_cache(CacheSpec.parse(spec), CFG, 2, 100, torch.float32, torch.device("cpu"))
    assert cache.nbytes == expected


def test_capacity_and_pool_limits():
    cache = make_cache(CacheSpec(), CFG, 1, 8, torch.float32, torch.device("cpu"))
    cache.reserve(8)
    with pytest.raises(InvalidValueError, match="9 tokens exceeds the KV cache capacity of 8"):
        cache.reserve(9)
    paged = PagedKVCache(CFG.n_layers, 2, CFG.n_kv_heads, CFG.head_dim, 64, torch.float32, torch.device("cpu"),
                         block_size=4, num_blocks=5)
    paged.reserve(8)  # 2 blocks each for 2 sequences
    paged.advance(8)
    with pytest.raises(InvalidValueError, match="block pool exhausted: 5 blocks of 4 tokens"):
        paged.reserve(4)
    paged.free()
    assert len(paged.free_blocks) == 5 and paged.seq_len == 0


def test_window_ring_never_fills():
    ring = make_cache(CacheSpec("window", window=4), CFG, 1, 10_000, torch.float32, torch.device("cpu"))
    k = torch.ones(1, CFG.n_heads, 1, CFG.head_dim)
    for pos in range(50):
        ring.reserve(1)
        for layer in range(CFG.n_layers):
            keys, _, _ = ring.update(layer, k * pos, k * pos)
        ring.advance(1)
    assert keys.shape[2] == 4
    assert sorted(ring.slot_pos.tolist()) == [46, 47, 48, 49]
    assert sorted(keys[0, 0, :, 0].tolist()) == [46.0, 47.0, 48.0, 49.0]

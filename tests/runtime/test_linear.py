"""The held weight matrices (runtime/linear.py) against plain fp32 matmuls of the matrices they
stand for: the dense fp32 matmul (one row padded to two, a few rows, many rows), int8 and int4 weight-only kernels, and the embedding rows a
tied head hands back (one copy in memory)."""

import os

import pytest
import torch

from inferlab.errors import NotSupportedError, UnknownNameError
from inferlab.runtime.linear import INT4_GROUP, DenseLinear, Int4Linear, Int8Linear, _unpack_int4, make_linear
from inferlab.runtime.llama import LlamaModel

from .conftest import write_tiny_gguf


@pytest.fixture
def weight():
    return torch.randn(192, 96, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 16])
@pytest.mark.parametrize("lead", [(), (1,), (2,)])
def test_dense_equals_plain_matmul_for_every_row_count(weight, rows, lead):
    """1 row (padded to two), 2-8 (W @ x^T), more (F.linear), under any leading dims."""
    lin = DenseLinear(weight, torch.float32)
    x = torch.randn(*lead, rows, weight.shape[1], generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(lin(x), x @ weight.T, rtol=1e-5, atol=1e-5)
    assert lin(x).shape == (*lead, rows, weight.shape[0]) and lin(x).is_contiguous()
    assert lin.nbytes == weight.nbytes  # one copy


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_half_precision_dense_matches_fp32_of_the_rounded_weights(weight, dtype, rows):
    """fp16 (more than FEW_ROWS rows computed in fp32 on a CPU) and bf16: the product of the
    rounded weights and inputs, to the output's own rounding."""
    lin = DenseLinear(weight, dtype)
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(2)).to(dtype)
    y = lin(x)
    assert y.dtype == dtype and y.shape == (rows, weight.shape[0])
    ref = x.float() @ weight.to(dtype).float().T
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_dense_one_row_steps_do_not_leak_into_each_other(weight):
    """The padding row stays zero: successive one-row products are each exact."""
    lin = DenseLinear(weight, torch.float32)
    for seed in range(3):
        x = torch.randn(1, 1, weight.shape[1], generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(lin(x), x @ weight.T, rtol=1e-5, atol=1e-5)
    assert not lin._pair[1].any()


def test_dense_rows_are_the_weight_rows(weight):
    ids = torch.tensor([[0, 5], [191, 7]])
    lin = DenseLinear(weight, torch.float32)
    torch.testing.assert_close(lin.rows(ids), weight[ids], rtol=0, atol=0)


def test_int8_rows_and_matmul_match_its_dequantized_matrix(weight):
    lin = Int8Linear(weight)
    deq = lin.q.float() * lin.scale.float()[:, None]
    step = weight.abs().amax(1) / 127
    assert ((deq - weight).abs() <= step[:, None] * 0.51 + weight.abs() * 2**-8).all()  # rounding + bf16 scale
    torch.testing.assert_close(lin.rows(torch.tensor([3, 4])), deq[[3, 4]])
    x = torch.randn(2, weight.shape[1])
    ref = x @ deq.T
    assert ((lin(x) - ref).norm() / ref.norm()) < 0.01  # bf16 activations


def test_int4_unpacks_torch_packing_and_rows_are_exact_for_4bit_weights():
    """Weights already on a 16-level grid per group of 32 (what a Q4_1 file holds) come back
    from the packed int4 copy up to the bf16 rounding of each group's scale and zero."""
    g = torch.Generator().manual_seed(2)
    n, k = 128, 64
    q = torch.randint(0, 16, (n, k), generator=g)
    q[:, ::INT4_GROUP] = 0
    q[:, 1::INT4_GROUP] = 15  # every group spans all 16 levels, so min/max recover its scale
    scale = torch.rand(n, k // INT4_GROUP, generator=g).bfloat16().float() * 0.1 + 0.01
    low = (torch.randn(n, k // INT4_GROUP, generator=g) * 0.1).bfloat16().float()
    w = (q.float().view(n, -1, INT4_GROUP) * scale[..., None] + low[..., None]).view(n, k)
    lin = Int4Linear(w)
    assert torch.equal(_unpack_int4(lin.packed, n, k, lin._block_n), q.int())
    ids = torch.tensor([0, 17, 31, 32, 100, 127])
    err = (lin.rows(ids) - w[ids]).abs().max()
    assert err < 0.01 * w.abs().max()  # bf16 scale/zero: ~3 significant digits
    assert lin.nbytes == n * k // 2 + (k // INT4_GROUP) * n * 2 * 2  # 4 bits a weight + bf16 scale and zero per group
    x = torch.randn(3, k, generator=g)
    ref = x @ lin.rows(torch.arange(n)).T
    assert ((lin(x) - ref).norm() / ref.norm()) < 0.01  # bf16 activations


def test_int4_rejects_shapes_its_kernel_cannot_take():
    with pytest.raises(NotSupportedError, match=r"multiples of 64.*100x64"):
        Int4Linear(torch.randn(100, 64))


def test_unknown_weight_dtype_is_named():
    with pytest.raises(UnknownNameError, match="int3"):
        make_linear(torch.randn(4, 4), "int3", "cpu")


def test_int4_model_close_to_fp32_and_smaller(tmp_path):
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, d_model=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=128, qtype="Q4_1")
    fp32, int4 = LlamaModel.from_gguf(path), LlamaModel.from_gguf(path, dtype="int4")
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        a, b = fp32.step(tokens, None, all_logits=True), int4.step(tokens, None, all_logits=True)
    layers = lambda m: sum(w.nbytes for l in m.layers for w in (l.wqkv, l.wo, l.w_gate_up, l.w_down))  # noqa: E731
    assert layers(int4) < 0.2 * layers(fp32)
    assert isinstance(int4.lm_head, Int8Linear)  # the head int8: a quarter of fp32's bytes, plus a scale per row
    assert int4.lm_head.nbytes == fp32.lm_head.nbytes // 4 + 2 * int4.lm_head.shape[0]
    assert 0 < (a - b).abs().max() < 0.05 * a.abs().max()


def test_weight_arena_views_are_aligned_disjoint_and_bounded():
    from inferlab.errors import InvalidValueError
    from inferlab.runtime.linear import HUGE_PAGE_BYTES, WeightArena

    arena = WeightArena(3 * 1000 * 4 + 64 * 3, "cpu")
    parts = [arena.take((10, 100), torch.float32) for _ in range(3)]
    assert parts[0].data_ptr() % HUGE_PAGE_BYTES == 0  # the used part starts on a huge page
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):  # a Linux kernel with THP
        assert arena.huge_pages
    assert all(p.data_ptr() % 64 == 0 for p in parts)
    for i, p in enumerate(parts):
        p.fill_(i)
    assert [p.unique().tolist() for p in parts] == [[0.0], [1.0], [2.0]]  # no overlap
    with pytest.raises(InvalidValueError, match="overflow"):
        arena.take((1000,), torch.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_arena_held_weights_give_the_same_logits_as_separate_tensors(tmp_path, monkeypatch, dtype):
    import inferlab.runtime.llama as llama

    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, d_model=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=128, tied=False)
    in_arena = LlamaModel.from_gguf(path, dtype=dtype)
    monkeypatch.setattr(llama, "WeightArena", lambda n_bytes, device: None)
    separate = LlamaModel.from_gguf(path, dtype=dtype)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        a, b = in_arena.step(tokens, None, all_logits=True), separate.step(tokens, None, all_logits=True)
    assert torch.equal(a, b)  # same layout and kernels: bit-identical
    assert in_arena.weight_bytes == separate.weight_bytes
    base = in_arena.layers[0].wqkv.w.untyped_storage().data_ptr()
    assert all(l.w_down.w.untyped_storage().data_ptr() == base for l in in_arena.layers)  # one buffer


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_models_track_fp32_through_prefill_and_cached_decode(tmp_path, dtype):
    """fp16/bf16 weights and activations (attention in fp32 on a CPU, the cache in the half type):
    prefill and every cached decode step stay close to the fp32 model's logits."""
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, d_model=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=128)
    fp32, half = LlamaModel.from_gguf(path), LlamaModel.from_gguf(path, dtype=dtype)
    assert half._attn_fp32 and half.new_cache().k.dtype == getattr(torch, dtype)
    # of the logits' scale (10 vs 7 mantissa bits); measured worst step 0.006 (fp16), 0.056 (bf16)
    tol = {"float16": 0.02, "bfloat16": 0.1}[dtype]
    with torch.inference_mode():
        caches = fp32.new_cache(capacity=32), half.new_cache(capacity=32)
        steps = [torch.tensor([[1, 2, 3, 4, 5, 6]])] + [torch.tensor([[t]]) for t in (7, 8, 9, 10)]
        for tokens in steps:
            a, b = fp32.step(tokens, caches[0]), half.step(tokens, caches[1])
            assert b.dtype == torch.float32
            assert 0 < (a - b).abs().max() < tol * a.abs().max()

"""Exact tensor bytes (runtime/device.py TensorBytesPeak) and the activation column they fill in
the profile: counted per storage, so views, in-place results and tensors made before the block
add nothing, and memory the allocator reuses still counts (a process's RSS misses it)."""

import torch

from inferlab.runtime.device import TensorBytesPeak


def test_counts_each_new_storage_once_from_allocation_to_free():
    w = torch.randn(256, 256)
    before = torch.zeros(100_000)  # made before the block: never counted
    with torch.inference_mode(), TensorBytesPeak() as meter:
        before.narrow(0, 0, 10).copy_(torch.ones(10))  # a view of an old storage, and 40 bytes freed at once
        before.mul_(2)  # in place
        a = torch.empty(1000)  # 4,000 bytes
        view = a[10:]  # a view: nothing new
        product = w @ w  # 262,144 bytes, live together with a
        del product
        d = torch.relu(a)  # 4,000 bytes
        d.add_(1)
    assert meter.peak_bytes == 4_000 + 256 * 256 * 4
    assert meter.live_bytes == 8_000
    del a, view, d
    assert meter.live_bytes == 0  # frees seen after the block too


def test_profile_activations_are_exact_and_grow_with_the_batch_of_tokens(tmp_path):
    """The prefill's gate/up product (B x T x 2 ffn fp32) is live at once, so the peak is at least
    that; four times the tokens need more than twice the bytes."""
    from inferlab.runtime.llama import LlamaModel
    from inferlab.runtime.profile import profile_model

    from .conftest import write_tiny_gguf

    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, d_model=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=128)
    model = LlamaModel.from_gguf(path, n_ctx=128)
    rows = profile_model(model, contexts=[16, 32], batches=[1, 2], caches=["contiguous"], n_new_tokens=2, naive=False)
    act = {(r.batch, r.context): r.activations_bytes for r in rows}
    for (b, t), n in act.items():
        assert n >= b * t * 2 * 128 * 4
    assert act[(2, 32)] > 2 * act[(1, 16)]
    # the prefill's activations do not depend on how many tokens follow (nor on the cache sized for them)
    longer = profile_model(model, contexts=[32], batches=[2], caches=["contiguous"], n_new_tokens=9, naive=False)
    assert longer[0].activations_bytes == act[(2, 32)]

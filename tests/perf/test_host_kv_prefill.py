"""Prefill with the KV cache in host RAM (llama.cpp's -nkvo), worked out by hand on the toy model of
tests/_toy.py: the attention of every GPU block runs on the host, against the cache there, at the
speed model's host_attention_flops (never op-offloaded: the cache is no weight buffer); the rest of
the host's work (its own blocks' matmuls and attention) runs where it would without -nkvo.

The toy (see tests/_toy.py): DENSE, 4 blocks of 590,336 F32 weights (2,361,344 bytes), a head of
256,000 weights; 1,024 attention FLOPs per token per cached token per block (2·4 heads·(64 + 64)).
MACHINE: GPU 100 TFLOP/s (x 0.5 = 5e13 FLOP/s for prefill), host 1 TFLOP/s (x 0.5 = 5e11), PCIe
25 GB/s (x 0.7 = 17.5 GB/s). A prompt of n tokens after c cached ones attends on average to
c + n/2 tokens (attention_flops=True). Every expected figure below comes from these factors.
"""

import pytest

from inferlab.perf.placement import place
from inferlab.perf.speed import SpeedModel, prefill_time

from _toy import DENSE, F32, MACHINE

HOST_ATTN = 1e11  # FLOP/s of attention on the host: a round figure for the hand arithmetic
NKVO = SpeedModel("toy-nkvo", attention_flops=True, host_attention_flops=HOST_ATTN)
GPU_PREFILL = 0.5 * 100e12  # 5e13 FLOP/s
HOST_PREFILL = 0.5 * 1e12  # 5e11 FLOP/s
PCIE = 0.7 * 25e9  # 17.5e9 B/s
BLOCK_FLOPS = 2 * 590_336  # 1,180,672 weight FLOPs per token per block
HEAD_FLOPS = 2 * 256_000  # 512,000 per token
ATTN_PER_CTX = 1_024  # per token per cached token per block


def test_full_offload_all_attention_runs_on_the_host():
    # -ngl 5 -nkvo: the GPU holds the 4 blocks and the head, the host every cache and nothing else.
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=5, no_kv_offload=True)
    f = prefill_time(p, MACHINE, 100, NKVO)
    host, gpu = f["per_device"]
    # host: 100 tokens x 4 blocks x 1,024 x 50 (mean attended) = 20,480,000 FLOPs at 1e11 = 204.8 us;
    # it has no weights of its own, so nothing is left to compute or to copy over PCIe
    assert host["host_attention_s"] == pytest.approx(20_480_000 / HOST_ATTN, rel=1e-12)
    assert host["compute_s"] == 0.0 and host["transfer_s"] == 0.0
    assert host["s"] == pytest.approx(204.8e-6, rel=1e-12)
    # GPU: 100 x (4 x 1,180,672 + 512,000) = 100 x 5,234,688 = 523,468,800 FLOPs at 5e13 = 10.469376 us;
    # it attends to nothing itself (its blocks' caches are on the host)
    assert gpu["compute_s"] == pytest.approx(523_468_800 / GPU_PREFILL, rel=1e-12)
    assert gpu["s"] == pytest.approx(10.469376e-6, rel=1e-12)
    assert f["total_s"] == pytest.approx(204.8e-6 + 10.469376e-6, rel=1e-12)
    assert f["tok_per_s"] == pytest.approx(100 / (215.269376e-6), rel=1e-12)


def test_cached_tokens_raise_the_host_attention():
    # 100 new tokens after 1,000 cached: mean attended 1,000 + 50 = 1,050;
    # host: 100 x 4 x 1,024 x 1,050 = 430,080,000 FLOPs at 1e11 = 4.3008 ms
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=5, no_kv_offload=True)
    f = prefill_time(p, MACHINE, 100, NKVO, context=1000)
    assert f["per_device"][0]["host_attention_s"] == pytest.approx(4.3008e-3, rel=1e-12)
    assert f["per_device"][1]["s"] == pytest.approx(10.469376e-6, rel=1e-12)  # the GPU's part does not grow


def test_partial_offload_the_host_takes_the_gpu_blocks_attention_and_op_offloads_the_rest():
    # -ngl 3 -nkvo: blocks 2, 3 and the head on the GPU, blocks 0, 1 on the host, all 4 caches on the host.
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=3, no_kv_offload=True)
    assert [d.n_blocks for d in p.devices] == [2, 2]
    f = prefill_time(p, MACHINE, 100, NKVO)
    host, gpu = f["per_device"]
    # attention of all 4 blocks: 100 x 4 x 1,024 x 50 = 20,480,000 FLOPs; the GPU's 2 of the 4 blocks
    # (10,240,000) run on the host at 1e11 = 102.4 us
    assert host["host_attention_s"] == pytest.approx(102.4e-6, rel=1e-12)
    # the host's own: 100 x 2 x 1,180,672 = 236,134,400 weight FLOPs + its blocks' 10,240,000 attention
    # = 246,374,400 FLOPs; 100 tokens >= 32 so op offload runs them on the GPU at 5e13 = 4.927488 us,
    # and the host's weights (2 x 2,361,344 = 4,722,688 bytes) cross PCIe once: 269.8679 us
    assert host["where"] == "toy GPU"
    assert host["compute_s"] == pytest.approx(246_374_400 / GPU_PREFILL, rel=1e-12)
    assert host["transfer_s"] == pytest.approx(4_722_688 / PCIE, rel=1e-12)
    assert host["s"] == pytest.approx(102.4e-6 + 4.927488e-6 + 4_722_688 / PCIE, rel=1e-12)
    # GPU: 100 x (2 x 1,180,672 + 512,000) = 287,334,400 FLOPs = 5.746688 us, no attention of its own
    assert gpu["s"] == pytest.approx(5.746688e-6, rel=1e-12)
    assert f["pcie_s"] == pytest.approx(4_722_688 / PCIE, rel=1e-12)


def test_below_the_op_offload_batch_the_host_computes_its_own_share():
    # 16 tokens (< 32): no op offload; mean attended 8.
    # attention: 16 x 4 x 1,024 x 8 = 524,288 FLOPs, the GPU's half 262,144 at 1e11 = 2.62144 us;
    # the host's own: 16 x 2 x 1,180,672 = 37,781,504 + 262,144 = 38,043,648 FLOPs at 5e11 = 76.087296 us
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=3, no_kv_offload=True)
    host = prefill_time(p, MACHINE, 16, NKVO)["per_device"][0]
    assert host["where"] == "toy host" and host["transfer_s"] == 0.0
    assert host["host_attention_s"] == pytest.approx(2.62144e-6, rel=1e-12)
    assert host["compute_s"] == pytest.approx(76.087296e-6, rel=1e-12)
    assert host["s"] == pytest.approx(2.62144e-6 + 76.087296e-6, rel=1e-12)


def test_without_nkvo_the_host_attention_rate_is_not_used():
    # the same -ngl 3 without -nkvo: each device attends over its own blocks' caches; the host's
    # 2 blocks: 100 x (2 x 1,180,672 + 2 x 1,024 x 50) = 236,134,400 + 10,240,000 = 246,374,400 FLOPs,
    # op-offloaded (5e13): 4.927488 us; the GPU: 287,334,400 + 10,240,000 = 297,574,400 = 5.951488 us
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=3)
    host, gpu = prefill_time(p, MACHINE, 100, NKVO)["per_device"]
    assert host["host_attention_s"] == 0.0
    assert host["compute_s"] == pytest.approx(4.927488e-6, rel=1e-12)
    assert gpu["s"] == pytest.approx(5.951488e-6, rel=1e-12)


def test_a_host_with_nothing_to_do_adds_exactly_nothing():
    # -ngl 5 without -nkvo: the host holds only token_embd (a lookup) and no cache: zero seconds, zero
    # compute, zero transfer; the GPU attends itself: 100 x (5,234,688 + 4 x 1,024 x 50) = 543,948,800
    # FLOPs at 5e13 = 10.878976 us, which is the whole prompt's time
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=5)
    f = prefill_time(p, MACHINE, 100, NKVO)
    host, gpu = f["per_device"]
    assert (host["s"], host["compute_s"], host["transfer_s"], host["where"]) == (0.0, 0.0, 0.0, "toy host")
    assert f["cpu_s"] == 0.0
    assert gpu["s"] == pytest.approx(10.878976e-6, rel=1e-12)
    assert f["total_s"] == pytest.approx(10.878976e-6, rel=1e-12)


def test_unmodelled_host_attention_leaves_it_with_the_host_matmuls():
    # host_attention_flops=None: -nkvo's attention is counted with the host's other work (op-offloaded at
    # 100 tokens): full offload, 20,480,000 FLOPs at 5e13 = 0.4096 us, no host_attention_s
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=5, no_kv_offload=True)
    host = prefill_time(p, MACHINE, 100, SpeedModel("toy-attn", attention_flops=True))["per_device"][0]
    assert host["host_attention_s"] == 0.0
    assert host["compute_s"] == pytest.approx(0.4096e-6, rel=1e-12)
    # attention_flops=False: no attention FLOPs at all, so the host of a full offload has nothing to do
    host = prefill_time(p, MACHINE, 100, SpeedModel("toy-noattn", attention_flops=False, host_attention_flops=HOST_ATTN))["per_device"][0]
    assert host["s"] == 0.0

"""Boundaries, worked out by hand on the toy models of tests/_toy.py: prefill at 31/32/33 tokens
(llama.cpp's op offload starts at a 32-token micro-batch), -ngl at n_layers and n_layers + 1 in
llama.cpp's order (the output head first) and in the first-blocks order, --fit exactly at the
margin, and sliding-window cache cells at exactly the padded window."""

from dataclasses import replace

import pytest

from inferlab.hardware.device import Machine
from inferlab.perf.kv_size import kv_cache_bytes, kv_cache_bytes_per_batch, kv_read_bytes, layer_kv_bytes, swa_cache_tokens
from inferlab.perf.placement import compute_buffer_bytes, place
from inferlab.perf.speed import OP_OFFLOAD_MIN_BATCH, SpeedModel, prefill_time

from _toy import BLOCK_BYTES, CPU_ONLY, DENSE, EMBD_BYTES, F32, GPU, HEAD_BYTES, HOST, MACHINE, MOE

# -ngl 3 in llama.cpp's order: i_gpu_start = 4 + 1 - 3 = 2: blocks 2, 3 and the head on the GPU.
# FLOPs per prompt token (2 per weight; the bandwidth-only model runs the head for every token):
#   host blocks 0-1: 2 x 2 x 590,336 = 2,361,344; GPU blocks 2-3 + head: 2,361,344 + 2 x 256,000 = 2,873,344
HOST_FLOPS = 2_361_344
GPU_FLOPS = 2_873_344
HOST_COMPUTE = 0.5 * 1e12  # 50 % of the toy host's 1 TFLOP/s
GPU_COMPUTE = 0.5 * 100e12
PCIE = 0.7 * 25e9  # η x 25 GB/s
HOST_WEIGHTS = 2 * BLOCK_BYTES  # 4,722,688 bytes cross PCIe when op offload moves the host's matmuls


def _partial():
    return place(DENSE, MACHINE, F32, 2048, n_gpu_layers=3)


def test_op_offload_starts_at_a_32_token_micro_batch():
    assert OP_OFFLOAD_MIN_BATCH == 32
    p = _partial()
    # 31 tokens: the host's layers compute on the host, nothing crosses PCIe
    f = prefill_time(p, MACHINE, 31)
    host, gpu = f["per_device"]
    assert host["where"] == HOST.name and host["transfer_s"] == 0 and f["pcie_s"] == 0
    assert host["s"] == pytest.approx(31 * HOST_FLOPS / HOST_COMPUTE, rel=1e-12)  # 146.4 us
    assert gpu["s"] == pytest.approx(31 * GPU_FLOPS / GPU_COMPUTE, rel=1e-12)  # 1.78 us
    assert f["total_s"] == pytest.approx(31 * HOST_FLOPS / HOST_COMPUTE + 31 * GPU_FLOPS / GPU_COMPUTE, rel=1e-12)
    for n in (32, 33):
        # from 32 tokens: the host's matmuls run on the GPU, its 4,722,688 weight bytes cross PCIe once
        f = prefill_time(p, MACHINE, n)
        host, gpu = f["per_device"]
        assert host["where"] == GPU.name
        assert host["transfer_s"] == pytest.approx(HOST_WEIGHTS / PCIE, rel=1e-12) == f["pcie_s"]  # 269.9 us
        assert host["compute_s"] == pytest.approx(n * HOST_FLOPS / GPU_COMPUTE, rel=1e-12)
        total = n * HOST_FLOPS / GPU_COMPUTE + HOST_WEIGHTS / PCIE + n * GPU_FLOPS / GPU_COMPUTE
        assert f["total_s"] == pytest.approx(total, rel=1e-12)
        assert f["tok_per_s"] == pytest.approx(n / total, rel=1e-12)
        assert f["cpu_s"] == pytest.approx(host["s"]) and f["gpu_s"] == pytest.approx(gpu["s"])


def test_no_op_offload_without_a_discrete_gpu_or_with_small_micro_batches():
    # a CPU-only machine: all 4 blocks + head on the host at ε·P, whatever the prompt
    p = place(DENSE, CPU_ONLY, F32, 2048)
    f = prefill_time(p, CPU_ONLY, 100)
    assert f["pcie_s"] == 0 and f["per_device"][0]["where"] == HOST.name
    assert f["total_s"] == pytest.approx(100 * (2 * 4 * 590_336 + 512_000) / HOST_COMPUTE, rel=1e-12)
    # unified memory (Apple): the host's layers stay on the host, nothing is copied
    uni = Machine("toy unified", GPU, HOST, 0.0, unified=True)
    f = prefill_time(place(DENSE, uni, F32, 2048, n_gpu_layers=3), uni, 100)
    assert f["pcie_s"] == 0 and f["per_device"][0]["where"] == HOST.name
    # -ub 16: a 1,000-token prompt runs in micro-batches of 16 < 32: no op offload
    f = prefill_time(_partial(), MACHINE, 1000, SpeedModel("ub16", attention_flops=False, n_ubatch=16))
    assert f["pcie_s"] == 0 and f["per_device"][0]["where"] == HOST.name


def test_weights_cross_per_micro_batch_in_llama_cpp():
    # llama.cpp copies the host's weights for every micro-batch of 512: 1,024 tokens = 2, 1,025 = 3
    per_ub = SpeedModel("per-ubatch", attention_flops=False, op_offload_transfers_per_ubatch=True)
    p = _partial()
    assert prefill_time(p, MACHINE, 1024, per_ub)["pcie_s"] == pytest.approx(2 * HOST_WEIGHTS / PCIE, rel=1e-12)
    assert prefill_time(p, MACHINE, 1025, per_ub)["pcie_s"] == pytest.approx(3 * HOST_WEIGHTS / PCIE, rel=1e-12)
    once = SpeedModel("once", attention_flops=False)
    assert prefill_time(p, MACHINE, 1025, once)["pcie_s"] == pytest.approx(HOST_WEIGHTS / PCIE, rel=1e-12)


def test_head_for_the_last_token_only_attention_flops_and_a_per_block_cost():
    # fully offloaded; the head (2 x 1000 x 256 = 512,000 FLOPs a token) for the last of 100 tokens only;
    # attention: 4 blocks x 1,024 FLOPs per cached token at a mean of 0 + 100/2 = 50 cached tokens;
    # 10 us per block per micro-batch: 4 blocks x 1 micro-batch
    m = SpeedModel("toy", prefill_head_every_token=False, attention_flops=True, layer_overhead_s={"cuda": 1e-5})
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=5)
    flops = 100 * (2 * 4 * 590_336 + 512_000) - 99 * 512_000 + 100 * 4 * 1_024 * 50
    f = prefill_time(p, MACHINE, 100, m)
    assert f["per_device"][1]["compute_s"] == pytest.approx(flops / GPU_COMPUTE, rel=1e-12)
    assert f["total_s"] == pytest.approx(flops / GPU_COMPUTE + 4e-5, rel=1e-12)
    # after 300 cached tokens the mean is 300 + 50 = 350
    g = prefill_time(p, MACHINE, 100, m, context=300)
    flops_ctx = flops + 100 * 4 * 1_024 * 300
    assert g["per_device"][1]["compute_s"] == pytest.approx(flops_ctx / GPU_COMPUTE, rel=1e-12)
    # 1,025 tokens: 3 micro-batches of the per-block cost
    assert prefill_time(p, MACHINE, 1025, m)["per_device"][1]["s"] - prefill_time(p, MACHINE, 1025, m)["per_device"][1]["compute_s"] \
        == pytest.approx(3 * 4e-5)


# -ngl around n_layers = 4, n_ctx 1,024: a block's f16 cache is 512 x 1,024 = 524,288 bytes;
# compute buffers (n_ubatch 512, f32): the FFN's 512 x 4 x 3 x 512 = 3,145,728 bytes, with the
# logits 512 x 4 x (3 x 512 + 1000) = 5,193,728 bytes
FFN_BUF = 3_145_728
LOGITS_BUF = 5_193_728
KV_BLOCK = 524_288


def test_compute_buffers_by_hand():
    assert compute_buffer_bytes(DENSE, 512, False) == FFN_BUF
    assert compute_buffer_bytes(DENSE, 512, True) == LOGITS_BUF


@pytest.mark.parametrize("ngl,gpu_blocks,host_weights,gpu_weights", [
    (0, 0, EMBD_BYTES + 4 * BLOCK_BYTES + HEAD_BYTES, 0),  # everything on the host
    (1, 0, EMBD_BYTES + 4 * BLOCK_BYTES, HEAD_BYTES),  # i_gpu_start = 4: the output head alone
    (4, 3, EMBD_BYTES + BLOCK_BYTES, 3 * BLOCK_BYTES + HEAD_BYTES),  # = n_layers: i_gpu_start = 1, block 0 stays
    (5, 4, EMBD_BYTES, 4 * BLOCK_BYTES + HEAD_BYTES),  # = n_layers + 1: everything but token_embd
    (99, 4, EMBD_BYTES, 4 * BLOCK_BYTES + HEAD_BYTES),  # -ngl 99 offloads everything, as n_layers + 1 does
])
def test_ngl_in_llama_cpp_order(ngl, gpu_blocks, host_weights, gpu_weights):
    p = place(DENSE, MACHINE, F32, 1024, n_gpu_layers=ngl)
    host, gpu = p.devices
    assert p.n_gpu_layers == min(ngl, 5)
    assert gpu.n_blocks == gpu_blocks and host.n_blocks == 4 - gpu_blocks
    assert gpu.has_output == (ngl >= 1) and host.has_output == (ngl == 0)
    assert host.weights_bytes == host_weights and gpu.weights_bytes == gpu_weights
    assert gpu.kv_bytes == gpu_blocks * KV_BLOCK and host.kv_bytes == (4 - gpu_blocks) * KV_BLOCK
    assert p.fully_offloaded == (ngl >= 5)
    # the device running the output matmul holds the logits; a host with blocks and no head: the FFN's
    assert gpu.compute_bytes == (LOGITS_BUF if ngl >= 1 else 0)
    assert host.compute_bytes == (LOGITS_BUF if ngl == 0 else FFN_BUF)
    # what the GPU needs in all: weights + cache + buffers (ngl 4: 8,109,056 + 1,572,864 + 5,193,728)
    assert p.gpu_total == gpu_weights + gpu_blocks * KV_BLOCK + (LOGITS_BUF if ngl >= 1 else 0)


@pytest.mark.parametrize("ngl,gpu_blocks,head_on_gpu", [(1, 1, False), (4, 4, False), (5, 4, True)])
def test_ngl_in_first_blocks_order(ngl, gpu_blocks, head_on_gpu):
    # the lesson's order: blocks 0 … ngl-1, the head only at ngl = n_layers + 1
    p = place(DENSE, MACHINE, F32, 1024, n_gpu_layers=ngl, order="first-blocks")
    host, gpu = p.devices
    assert gpu.n_blocks == gpu_blocks and gpu.has_output == head_on_gpu
    assert gpu.weights_bytes == gpu_blocks * BLOCK_BYTES + (HEAD_BYTES if head_on_gpu else 0)
    assert host.weights_bytes == EMBD_BYTES + (4 - gpu_blocks) * BLOCK_BYTES + (0 if head_on_gpu else HEAD_BYTES)
    # the head on the host: its prompt matmul moves to the first GPU (op offload), which reserves the logits too
    assert gpu.compute_bytes == LOGITS_BUF and host.compute_bytes == (FFN_BUF if head_on_gpu else LOGITS_BUF)
    # the two orders agree at n_layers + 1
    if ngl == 5:
        assert p.devices == place(DENSE, MACHINE, F32, 1024, n_gpu_layers=5).devices


def test_a_tied_head_is_copied_to_the_gpu_that_runs_it():
    # no output.weight: the head is token_embd (1,024,000 bytes), duplicated onto the GPU that runs the
    # output layer; the host keeps its own copy for the input lookup
    tied = replace(DENSE, name="toy-tied", tied_embeddings=True)
    p = place(tied, MACHINE, F32, 1024, n_gpu_layers=5)
    assert p.gpus[0].weights_bytes == 4 * BLOCK_BYTES + 1_024 + EMBD_BYTES
    assert p.cpu.weights_bytes == EMBD_BYTES
    on_host = place(tied, MACHINE, F32, 1024, n_gpu_layers=0)
    assert on_host.cpu.weights_bytes == EMBD_BYTES + 4 * BLOCK_BYTES + 1_024  # one copy: the host's
    assert on_host.cpu.dense_read_bytes == 4 * BLOCK_BYTES + 1_024 + EMBD_BYTES  # decode reads it as the head


def test_fit_takes_an_ngl_that_leaves_exactly_the_margin():
    # a 1 GB GPU (10^9 bytes) with a margin of 10^9 - 14,875,648 bytes: -ngl 4 needs exactly
    # 8,109,056 + 3 x 524,288 + 5,193,728 = 14,875,648 bytes, so it fits with nothing to spare;
    # one byte more margin and --fit takes -ngl 3 (2 blocks: 5,747,712 + 1,048,576 + 5,193,728)
    one_gb = Machine("toy 1 GB", replace(GPU, memory_gb=1.0), HOST, 25.0)
    need4 = 3 * BLOCK_BYTES + HEAD_BYTES + 3 * KV_BLOCK + LOGITS_BUF
    assert need4 == 14_875_648
    p = place(DENSE, one_gb, F32, 1024, fit_target_bytes=1e9 - need4)
    assert p.auto and p.n_gpu_layers == 4 and p.fits and p.gpus[0].free_bytes == 1e9 - need4
    q = place(DENSE, one_gb, F32, 1024, fit_target_bytes=1e9 - need4 + 1)
    assert q.n_gpu_layers == 3 and q.gpu_total == 2 * BLOCK_BYTES + HEAD_BYTES + 2 * KV_BLOCK + LOGITS_BUF
    # an explicit -ngl 4 against the larger margin is kept, and said not to fit
    r = place(DENSE, one_gb, F32, 1024, n_gpu_layers=4, fit_target_bytes=1e9 - need4 + 1)
    assert r.n_gpu_layers == 4 and not r.fits and "toy GPU" in r.reason
    # an unset context (the trained 4,096): the full offload needs 10,470,400 + 4 x 512 x 4,096
    # + 5,193,728 = 24,052,736 bytes; at exactly that margin it keeps -ngl 5 and the whole context
    need5 = 4 * BLOCK_BYTES + HEAD_BYTES + 4 * 512 * 4096 + LOGITS_BUF
    assert need5 == 24_052_736
    s = place(DENSE, one_gb, F32, fit_target_bytes=1e9 - need5)
    assert (s.n_gpu_layers, s.n_ctx, s.ctx_reduced, s.fits) == (5, 4096, False, True)
    # one byte short: the context cannot shrink below --fit-ctx 4,096, so a block goes back to the host
    t = place(DENSE, one_gb, F32, fit_target_bytes=1e9 - need5 + 1)
    assert (t.n_gpu_layers, t.n_ctx) == (4, 4096)


@pytest.mark.parametrize("window,n_ctx,n_seq,cells", [
    (128, 767, 1, 767),  # pad256(128 + 512) = 768 > 767: the whole context
    (128, 768, 1, 768),  # exactly the padded window
    (128, 769, 1, 768),  # one past: capped
    (256, 4096, 1, 768),  # 256 + 512 = 768, already a multiple of 256
    (257, 4096, 1, 1024),  # 769 pads up to 1,024
    (256, 4096, 2, 1024),  # two sequences: 2 x 256 + 512 = 1,024
])
def test_sliding_window_cells(window, n_ctx, n_seq, cells):
    swa = replace(DENSE, name="toy-swa", sliding_window=window, swa_layers=(True, False, True, False))
    assert swa_cache_tokens(swa, n_ctx, n_seq) == cells
    # two full blocks hold n_ctx cells, two windowed blocks hold `cells`, 512 bytes each (f16)
    assert kv_cache_bytes(swa, n_ctx, n_seq=n_seq) == 2 * 512 * n_ctx + 2 * 512 * cells
    if n_seq == 1:
        p = place(swa, MACHINE, F32, n_ctx, n_gpu_layers=5)
        assert p.gpus[0].kv_bytes == 2 * 512 * n_ctx + 2 * 512 * cells


def test_fit_at_the_margin_when_it_searches_placement_by_placement():
    # -nkvo keeps every cache in RAM, so --fit searches -ngl by building placements: the full offload
    # needs 10,470,400 + 5,193,728 = 15,664,128 bytes on the GPU; at exactly that margin it fits
    one_gb = Machine("toy 1 GB", replace(GPU, memory_gb=1.0), HOST, 25.0)
    need = 4 * BLOCK_BYTES + HEAD_BYTES + LOGITS_BUF
    p = place(DENSE, one_gb, F32, 1024, no_kv_offload=True, fit_target_bytes=1e9 - need)
    assert p.n_gpu_layers == 5 and p.fits and p.gpus[0].kv_bytes == 0 and p.cpu.kv_bytes == 4 * KV_BLOCK
    q = place(DENSE, one_gb, F32, 1024, no_kv_offload=True, fit_target_bytes=1e9 - need + 1)
    assert q.n_gpu_layers == 4 and q.gpus[0].weights_bytes == 3 * BLOCK_BYTES + HEAD_BYTES


def test_two_gpus_split_layers_by_memory_as_llama_cpp_does():
    # -ngl 5 over two equal GPUs: llama.cpp's layer j (of 5, the head last) goes to the first GPU whose
    # cumulative share (1/2) exceeds j/5: j = 0, 1, 2 on the first, j = 3 (block 3) and 4 (the head) on the second
    two = Machine("toy x2", GPU, HOST, 25.0, extra_gpus=(replace(GPU, name="toy GPU 2"),))
    p = place(DENSE, two, F32, 1024, n_gpu_layers=5)
    host, g0, g1 = p.devices
    assert (host.n_blocks, g0.n_blocks, g1.n_blocks) == (0, 3, 1)
    assert (g0.name, g1.name) == ("toy GPU", "toy GPU 2")  # in the machine's order
    assert g1.has_output and not g0.has_output
    assert g0.weights_bytes == 3 * BLOCK_BYTES and g1.weights_bytes == BLOCK_BYTES + HEAD_BYTES
    assert g0.kv_bytes == 3 * KV_BLOCK and g1.kv_bytes == KV_BLOCK
    # -ts 3,1: cumulative 3/4 > j/5 for j = 0 … 3: four layers (blocks 0-3) on the first, the head on the second
    q = place(DENSE, two, F32, 1024, n_gpu_layers=5, tensor_split=(3.0, 1.0))
    assert (q.devices[1].n_blocks, q.devices[2].n_blocks, q.devices[2].has_output) == (4, 0, True)


def test_kv_size_defaults_are_one_sequence_and_a_512_token_micro_batch():
    # without n_seq / n_ubatch: one sequence, -ub 512: pad256(128 + 512) = 768 cells per windowed block;
    # a 256-token window: 256 + 512 = 768 for one sequence (two would need 1,024)
    swa = replace(DENSE, name="toy-swa", sliding_window=128, swa_layers=(True, False, True, False))
    assert swa_cache_tokens(swa, 4096) == 768
    w256 = replace(swa, sliding_window=256)
    assert swa_cache_tokens(w256, 4096) == 768 and swa_cache_tokens(w256, 4096, 2) == 1024
    assert layer_kv_bytes(w256, 4096) == (512 * 768, 512 * 4096, 512 * 768, 512 * 4096)
    assert kv_cache_bytes(w256, 4096) == 2 * 512 * 768 + 2 * 512 * 4096
    assert layer_kv_bytes(swa, 4096) == (512 * 768, 512 * 4096, 512 * 768, 512 * 4096)
    assert layer_kv_bytes(swa, 4096, "q8_0") == tuple(x / 2 * 34 / 32 for x in (512 * 768, 512 * 4096, 512 * 768, 512 * 4096))
    assert kv_cache_bytes(swa, 4096) == 2 * 512 * 768 + 2 * 512 * 4096
    # a model without windows: every block holds n_ctx cells
    assert layer_kv_bytes(DENSE, 1000) == (512 * 1000,) * 4
    assert kv_read_bytes(DENSE, 0) == (0.0,) * 4 and kv_read_bytes(DENSE, 1) == (512,) * 4


def test_kv_cache_bytes_per_batch_by_hand():
    # the case study's formula: 2 x layers x KV heads x head size x seq_len x batch x bytes:
    # DENSE: 256 values per token per block x 4 blocks = 1,024 per token; 3 sequences of 100 at 2 bytes
    assert kv_cache_bytes_per_batch(DENSE, 100, 3, 2) == 1_024 * 100 * 3 * 2
    assert kv_cache_bytes_per_batch(DENSE, 100) == 1_024 * 100 * 2  # defaults: one sequence, 2 bytes
    swa = replace(DENSE, name="toy-swa", sliding_window=128, swa_layers=(True, False, True, False))
    # windowed blocks hold min(seq_len, 128): 2 x 256 x 128 + 2 x 256 x 1000, one byte each, 2 sequences
    assert kv_cache_bytes_per_batch(swa, 1000, 2, 1) == (2 * 256 * 128 + 2 * 256 * 1000) * 2
    assert kv_cache_bytes_per_batch(swa, 100, 2, 1) == 4 * 256 * 100 * 2  # under the window: all of it


def test_a_split_that_gives_one_gpu_nothing():
    # -ts 1,0: the cumulative share reaches 1 at the first GPU, so all 5 layers (4 blocks + head) go there
    two = Machine("toy x2", GPU, HOST, 25.0, extra_gpus=(replace(GPU, name="toy GPU 2"),))
    p = place(DENSE, two, F32, 1024, n_gpu_layers=5, tensor_split=(1.0, 0.0))
    host, g0, g1 = p.devices
    assert (g0.n_blocks, g0.has_output, g1.n_blocks, g1.has_output) == (4, True, 0, False)
    assert g1.weights_bytes == 0 and g1.compute_bytes == 0 and g0.weights_bytes == 4 * BLOCK_BYTES + HEAD_BYTES


def test_unified_memory_capacity_is_two_thirds_up_to_36_gb_then_three_quarters():
    # Metal's recommendedMaxWorkingSetSize: a 24 GB Mac wires 16 GB, a 36 GB one 24 GB, a 48 GB one 36 GB
    from inferlab.perf.placement import gpu_capacity_bytes

    for mem, cap in ((24.0, 16e9), (36.0, 24e9), (48.0, 36e9)):
        gpu = replace(GPU, memory_gb=mem, backend="metal")
        uni = Machine("toy mac", gpu, replace(HOST, memory_gb=mem), 0.0, unified=True)
        assert gpu_capacity_bytes(gpu, uni) == pytest.approx(cap, rel=1e-12)
        assert gpu_capacity_bytes(gpu, MACHINE) == mem * 1e9  # discrete: all of it


def test_an_explicit_ngl_with_an_unset_context_keeps_the_trained_context_when_it_fits():
    p = place(DENSE, MACHINE, F32, n_gpu_layers=5)
    assert (p.n_ctx, p.ctx_reduced, p.auto, p.fits) == (4096, False, False, True)


def test_an_unset_context_shrinks_to_the_largest_multiple_of_256_that_fits():
    # trained context 65,536; the full offload needs 10,470,400 + 5,193,728 = 15,664,128 bytes + 2,048 per token.
    # A margin leaving 15,664,128 + 2,048 x 10,000 bytes: 10,000 tokens would fit, the largest multiple of
    # 256 at or below it is 9,984 (39 x 256)
    long = replace(DENSE, name="toy-long", n_ctx_train=65536)
    one_gb = Machine("toy 1 GB", replace(GPU, memory_gb=1.0), HOST, 25.0)
    room = 15_664_128 + 2_048 * 10_000
    p = place(long, one_gb, F32, fit_target_bytes=1e9 - room)
    assert (p.n_gpu_layers, p.n_ctx, p.ctx_reduced, p.auto) == (5, 9984, True, True)
    q = place(long, one_gb, F32, n_gpu_layers=5, fit_target_bytes=1e9 - room)  # explicit -ngl: the same context
    assert (q.n_ctx, q.ctx_reduced, q.auto) == (9984, True, False)


def test_moe_and_mla_flops_per_token_by_hand():
    # MOE fully offloaded: 2 x (2 blocks x (199,296 dense + 786,432 x 2/8 routed) + 256,000 head) = 2,095,616
    p = place(MOE, MACHINE, F32, 1024, n_gpu_layers=3)
    assert p.gpus[0].flops_per_token == 2_095_616
    # attention per cached token: 2 blocks x 2·4·(64 + 64) = 2,048
    assert p.gpus[0].attn_flops_per_token_ctx == 2_048
    # DeepSeek V3 (MLA): per layer 2 x 128 heads x (512 latent keys + 64 rope + 512 latent values)
    from inferlab.models.catalog import MODELS

    ds = MODELS["deepseek-v3"]
    big = Machine("toy big", replace(GPU, memory_gb=2000.0), replace(HOST, memory_gb=2000.0), 25.0)
    q = place(ds, big, "Q4_K_M", 1024, n_gpu_layers=62)
    assert q.gpus[0].attn_flops_per_token_ctx == 61 * 2 * 128 * (512 + 64 + 512)


def test_kv_cache_bytes_per_batch_takes_counts_of_zero_and_up_only():
    from inferlab.errors import InvalidValueError

    assert kv_cache_bytes_per_batch(DENSE, 0, 4) == 0.0 and kv_cache_bytes_per_batch(DENSE, 10, 0) == 0.0
    for bad in ({"seq_len": -1}, {"batch_size": -1}, {"seq_len": True}, {"batch_size": 2.0}, {"seq_len": 1.5}):
        kw = {"seq_len": 10, "batch_size": 1, **bad}
        with pytest.raises(InvalidValueError):
            kv_cache_bytes_per_batch(DENSE, kw["seq_len"], kw["batch_size"])


def test_the_ngl_search_lands_on_the_largest_that_fits_below_the_middle():
    # -nkvo (placement-by-placement search over 0 … 5): -ngl 2 needs 1 block + head + logits =
    # 2,361,344 + 1,025,024 + 5,193,728 = 8,580,096 bytes, -ngl 3 needs 10,941,440: with exactly the
    # room for -ngl 2 the search (mid 3 fails) must come back to 2
    one_gb = Machine("toy 1 GB", replace(GPU, memory_gb=1.0), HOST, 25.0)
    need2 = BLOCK_BYTES + HEAD_BYTES + LOGITS_BUF
    assert need2 == 8_580_096
    p = place(DENSE, one_gb, F32, 1024, no_kv_offload=True, fit_target_bytes=1e9 - need2)
    assert p.n_gpu_layers == 2 and p.fits


def test_a_context_that_cannot_shrink_enough_takes_layers_off_the_gpu():
    # trained context 65,536; the full offload needs 15,664,128 + 2,048 per token: 24,052,736 bytes at
    # --fit-ctx 4,096. With room for 24,030,000 the context cannot shrink below 4,096, so --fit keeps
    # 4,096 tokens and offloads 4 layers (8,109,056 + 3 x 512 x 4,096 + 5,193,728 = 19,594,240 bytes)
    long = replace(DENSE, name="toy-long", n_ctx_train=65536)
    one_gb = Machine("toy 1 GB", replace(GPU, memory_gb=1.0), HOST, 25.0)
    p = place(long, one_gb, F32, fit_target_bytes=1e9 - 24_030_000)
    assert (p.n_gpu_layers, p.n_ctx, p.fits) == (4, 4096, True)
    assert p.gpu_total == 19_594_240


def test_a_cpu_prefill_rate_hook_divides_the_flops():
    # CPU-only: 100 tokens x (4 blocks x 1,180,672 + the head's 512,000) = 523,468,800 FLOPs at 200 GFLOP/s
    m = SpeedModel("toy", attention_flops=False, cpu_prefill_rate=lambda dev, placement: 2e11)
    f = prefill_time(place(DENSE, CPU_ONLY, F32, 2048), CPU_ONLY, 100, m)
    assert f["per_device"][0]["compute_s"] == pytest.approx(523_468_800 / 2e11, rel=1e-12)

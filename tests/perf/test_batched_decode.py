"""Decode at batch > 1, worked out by hand on the toy models of tests/_toy.py (every figure below
is derived in its comment from the toy's dimensions and the toy machine, not read off the code):
weights are read once per step, every sequence reads its own KV cache, a batch touches
1 - (1 - k/n)^B of the routed experts, and a sliding-window layer reads at most the window."""

from dataclasses import replace

import pytest

from inferlab.perf.kv_size import kv_read_bytes
from inferlab.perf.placement import place
from inferlab.perf.speed import BANDWIDTH_ONLY, SpeedModel, decode_step_time, expert_read_fraction, throughput

from _toy import DENSE, F32, MACHINE, MOE

# DENSE fully offloaded (-ngl 5 = n_layers + 1): the GPU reads 4 blocks + the head every step
#   4 x 2,361,344 + 1,024,000 (output) + 1,024 (output_norm) = 10,470,400 bytes
# and 4 blocks x 512 bytes = 2,048 bytes of f16 K/V per cached token of each sequence.
GPU_WEIGHTS = 10_470_400
GPU_KV_PER_TOKEN = 2_048
BW = 0.7 * 1000e9  # η x the toy GPU's 1,000 GB/s
COMPUTE = 0.5 * 100e12  # 50 % of its 100 TFLOP/s
# weight FLOPs per token on the GPU: 2 x (4 x 590,336 + 256,000) = 5,234,688;
# attention FLOPs per token per cached token: 4 blocks x 2·4·(64 + 64) = 4,096
GPU_FLOPS_PER_TOKEN = 5_234_688
GPU_ATTN_PER_CTX = 4_096


def _full(model=DENSE, n_ctx=2048):
    return place(model, MACHINE, F32, n_ctx, n_gpu_layers=model.n_layers + 1)


def test_weights_are_read_once_per_step_and_kv_once_per_sequence():
    p = _full()
    d = decode_step_time(p, MACHINE, 1000, batch=4)
    gpu = d["per_device"][1]
    # 4 sequences at 1,000 cached tokens: 4 x 2,048 x 1,000 = 8,192,000 bytes of K/V
    assert gpu["weights_bytes"] == GPU_WEIGHTS
    assert gpu["kv_bytes"] == 8_192_000
    # memory: 18,662,400 / 7e11 = 26.66 us; compute: 4 x (5,234,688 + 4,096 x 1,000) / 5e13 = 0.75 us
    assert gpu["memory_s"] == pytest.approx(18_662_400 / BW, rel=1e-12)
    assert gpu["compute_s"] == pytest.approx(4 * (GPU_FLOPS_PER_TOKEN + GPU_ATTN_PER_CTX * 1000) / COMPUTE, rel=1e-12)
    assert gpu["bound"] == "memory" and d["bound"] == "memory"
    # the host holds token_embd only (a lookup, not a read): it adds nothing to the step
    assert d["per_device"][0]["s"] == 0.0 and d["cpu_s"] == 0.0
    assert d["total_s"] == pytest.approx(18_662_400 / BW, rel=1e-12)
    assert d["tok_per_s"] == pytest.approx(4 / (18_662_400 / BW), rel=1e-12)
    # one sequence more adds exactly its own cache: 3 more sequences at 1,000 tokens = 6,144,000 bytes
    one = decode_step_time(p, MACHINE, 1000, batch=1)
    assert one["per_device"][1]["bytes"] == GPU_WEIGHTS + 2_048_000
    assert d["total_s"] - one["total_s"] == pytest.approx(6_144_000 / BW, rel=1e-9)


def test_an_empty_context_reads_only_the_weights():
    p = _full()
    for batch in (1, 2, 8):
        d = decode_step_time(p, MACHINE, 0, batch=batch)
        assert d["per_device"][1]["bytes"] == GPU_WEIGHTS  # 10,470,400 at any batch: no cache yet
        assert d["total_s"] == pytest.approx(GPU_WEIGHTS / BW, rel=1e-12)


def test_a_large_batch_turns_the_step_compute_bound():
    # at context 0 memory takes 10,470,400 / 7e11 = 14.96 us; compute B x 5,234,688 / 5e13 passes it
    # at B > 142.9: B = 142 stays memory-bound, B = 143 (14.97 us) and B = 200 (20.94 us) do not
    p = _full()
    assert decode_step_time(p, MACHINE, 0, batch=142)["bound"] == "memory"
    at143 = decode_step_time(p, MACHINE, 0, batch=143)
    assert at143["bound"] == "compute"
    assert at143["total_s"] == pytest.approx(143 * GPU_FLOPS_PER_TOKEN / COMPUTE, rel=1e-12)
    d = decode_step_time(p, MACHINE, 0, batch=200)
    assert d["total_s"] == pytest.approx(200 * GPU_FLOPS_PER_TOKEN / COMPUTE, rel=1e-12)  # 20.94 us
    assert "compute-bound" in d["bottleneck"]
    t = throughput(p, MACHINE, 200, 0)
    assert t["tok_per_s"] == pytest.approx(200 / d["total_s"]) and t["per_sequence_tok_per_s"] == pytest.approx(1 / d["total_s"])


def test_moe_expert_share_at_batch_b():
    # 1 - (1 - k/n)^B with 2 of 8 experts: B = 1: 1/4; B = 3: 1 - (3/4)^3 = 37/64; B = 64: 1 - (3/4)^64
    assert expert_read_fraction(8, 2, 1) == 0.25
    assert expert_read_fraction(8, 2, 3) == pytest.approx(37 / 64, rel=1e-15)
    assert expert_read_fraction(8, 2, 64) == pytest.approx(1 - 0.75**64, rel=1e-15)
    assert expert_read_fraction(8, 8, 1) == 1.0  # every expert used: all of them at batch 1
    assert expert_read_fraction(0, 0, 5) == 0.0  # a dense model has no routed experts


def test_moe_decode_reads_the_batchs_share_of_the_experts():
    # MOE fully offloaded (-ngl 3): dense reads 2 x 797,184 + 1,025,024 (head) = 2,619,392 bytes;
    # routed experts held: 2 x 3,145,728 = 6,291,456 bytes
    p = _full(MOE)
    gpu = p.gpus[0]
    assert gpu.dense_read_bytes == 2_619_392 and gpu.expert_bytes == 6_291_456
    # batch 3 touches 37/64 of them: 6,291,456 x 37/64 = 3,637,248 bytes; K/V 3 x (2 x 512) x 100 = 307,200
    d = decode_step_time(p, MACHINE, 100, batch=3)
    g = d["per_device"][1]
    assert g["weights_bytes"] == pytest.approx(2_619_392 + 3_637_248, rel=1e-12)
    assert g["kv_bytes"] == 307_200
    assert d["total_s"] == pytest.approx((2_619_392 + 3_637_248 + 307_200) / BW, rel=1e-12)
    # batch 1: a quarter of them, 1,572,864 bytes
    assert decode_step_time(p, MACHINE, 100)["per_device"][1]["weights_bytes"] == pytest.approx(2_619_392 + 1_572_864, rel=1e-12)


# DENSE with blocks 0 and 2 on a 128-token sliding window (blocks 1 and 3 attend to everything)
SWA = replace(DENSE, name="toy-swa", sliding_window=128, swa_layers=(True, False, True, False))


@pytest.mark.parametrize("context,kv", [
    (127, 2 * 512 * 127 + 2 * 512 * 127),  # under the window: every block reads all 127 tokens = 260,096
    (128, 2 * 512 * 128 + 2 * 512 * 128),  # exactly the window: 262,144
    (129, 2 * 512 * 129 + 2 * 512 * 128),  # one past: the windowed blocks stay at 128 = 263,168
    (1000, 2 * 512 * 1000 + 2 * 512 * 128),  # 1,024,000 + 131,072 = 1,155,072
])
def test_a_sliding_window_caps_the_bytes_a_step_reads(context, kv):
    p = place(SWA, MACHINE, F32, 2048, n_gpu_layers=5)
    assert p.gpus[0].kv_swa_bytes_per_token == 2 * 512 and p.gpus[0].kv_full_bytes_per_token == 2 * 512
    d = decode_step_time(p, MACHINE, context, batch=2)
    assert d["per_device"][1]["kv_bytes"] == 2 * kv  # two sequences, each its own cache
    # the same per-layer figures from kv_size (one sequence): windowed blocks min(context, 128) x 512
    w = min(context, 128)
    assert kv_read_bytes(SWA, context) == (512 * w, 512 * context, 512 * w, 512 * context)


def test_the_cpu_layers_of_a_partial_offload_read_their_own_share():
    # -ngl 3 (llama.cpp order): i_gpu_start = 4 + 1 - 3 = 2, the GPU holds blocks 2, 3 and the head;
    # the host reads blocks 0 and 1: 2 x 2,361,344 = 4,722,688 bytes + 2 x 512 x context of K/V
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=3)
    d = decode_step_time(p, MACHINE, 500, batch=2)
    cpu, gpu = d["per_device"]
    assert cpu["weights_bytes"] == 4_722_688 and cpu["kv_bytes"] == 2 * 2 * 512 * 500
    assert gpu["weights_bytes"] == 2 * 2_361_344 + 1_025_024 and gpu["kv_bytes"] == 2 * 2 * 512 * 500
    cpu_s = (4_722_688 + 1_024_000) / (0.7 * 100e9)  # the host's 100 GB/s at η = 0.7: 82.1 us
    gpu_s = (5_747_712 + 1_024_000) / BW  # 9.67 us
    assert cpu["s"] == pytest.approx(cpu_s, rel=1e-12) and gpu["s"] == pytest.approx(gpu_s, rel=1e-12)
    assert d["total_s"] == pytest.approx(cpu_s + gpu_s, rel=1e-12)  # layer split: one device after the other
    assert d["cpu_s"] == pytest.approx(cpu_s, rel=1e-12) and d["gpu_s"] == pytest.approx(gpu_s, rel=1e-12)
    assert "partial offload: 89%" in d["bottleneck"]  # 82.1 / 91.8


def test_fixed_cost_per_block_and_a_cpu_kernel_limit():
    # a per-block cost of 10 us on CUDA: 4 blocks add 40 us to the full offload's step
    model = SpeedModel("toy", layer_overhead_s={"cuda": 1e-5})
    p = _full()
    d = decode_step_time(p, MACHINE, 0, batch=1, model=model)
    assert d["per_device"][1]["overhead_s"] == pytest.approx(4e-5)
    assert d["total_s"] == pytest.approx(GPU_WEIGHTS / BW + 4e-5, rel=1e-12)
    # a CPU whose cores dequantize at 10 GB/s, under its 70 GB/s of memory: the kernels bound it
    slow = SpeedModel("toy-cpu", cpu_decode_rate=lambda dev, placement: 10e9)
    q = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=3)
    c = decode_step_time(q, MACHINE, 0, model=slow)["per_device"][0]
    assert c["bound"] == "cpu-kernels" and c["s"] == pytest.approx(4_722_688 / 10e9, rel=1e-12)
    fast = SpeedModel("toy-cpu", cpu_decode_rate=lambda dev, placement: 1000e9)  # faster than memory: memory bounds
    c = decode_step_time(q, MACHINE, 0, model=fast)["per_device"][0]
    assert c["bound"] == "memory" and c["s"] == pytest.approx(4_722_688 / 70e9, rel=1e-12)
    assert BANDWIDTH_ONLY.eta(MACHINE.gpu) == 0.7


def test_no_kv_offload_the_host_reads_every_cache():
    # -nkvo: the GPU holds the 4 blocks and the head but no cache; the host reads all of it:
    # 2 sequences x 2,048 bytes x 500 tokens = 2,048,000 bytes at η x 100 GB/s
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=5, no_kv_offload=True)
    d = decode_step_time(p, MACHINE, 500, batch=2)
    host, gpu = d["per_device"]
    assert host["kv_bytes"] == 2_048_000 and host["weights_bytes"] == 0
    assert host["s"] == pytest.approx(2_048_000 / (0.7 * 100e9), rel=1e-12)  # 29.3 us
    assert gpu["kv_bytes"] == 0 and gpu["s"] == pytest.approx(GPU_WEIGHTS / BW, rel=1e-12)


def test_the_allocated_cache_bounds_batch_times_context():
    from inferlab.errors import InvalidValueError
    from inferlab.perf.speed import check_kv_room

    p = _full()  # -c 2048: one shared buffer of 2,048 cells
    check_kv_room(p, 2048)  # one sequence at the whole context
    check_kv_room(p, 1024, 2)  # 2 x 1,024 = 2,048
    with pytest.raises(InvalidValueError, match="2,049 cached tokens"):
        check_kv_room(p, 2049)
    with pytest.raises(InvalidValueError, match="2,050 cached tokens"):
        check_kv_room(p, 1025, 2)
    for bad in (0, True, 2.0):
        with pytest.raises(InvalidValueError, match="batch must be an integer >= 1"):
            check_kv_room(p, 10, bad)


def test_the_bottleneck_sentence_gives_the_bytes_read_in_gb():
    # Llama 3.1 8B Q4_K_M on an RTX 4090 at 1,000 cached tokens reads every weight but the embedding
    # lookup plus 1,000 x 131,072 bytes of K/V (32 layers x 8 KV heads x 128 x 2 x 2 bytes)
    from inferlab.hardware.catalog import MACHINES
    from inferlab.models.catalog import MODELS
    from inferlab.quant.plan import weight_bytes

    m, mc = MODELS["llama-3.1-8b"], MACHINES["rtx4090"]
    wb = weight_bytes(m, "Q4_K_M")
    d = decode_step_time(place(m, mc, "Q4_K_M", 4096), mc, 1000)
    gb = (wb["total"] - wb["token_embd"] + 1000 * 131_072) / 1e9
    assert d["bottleneck"] == f"memory-bandwidth-bound on {mc.gpu.name}: {gb:.2f} GB read per step"
    # the CPU-kernel sentence on a CPU-only machine: every block and the head, 10,470,400 bytes = 0.01 GB
    from _toy import CPU_ONLY

    slow = SpeedModel("toy-cpu", cpu_decode_rate=lambda dev, placement: 10e9)
    c = decode_step_time(place(DENSE, CPU_ONLY, F32, 2048), CPU_ONLY, 0, model=slow)
    assert c["bottleneck"] == ("per-core compute on toy host: the CPU cores dequantize and multiply the weights slower "
                               "than its memory delivers them (0.01 GB per step)")

"""Speed: decode bytes over bandwidth, MoE active experts, the roofline and the ridge."""

import pytest

from inferlab.errors import InvalidValueError
from inferlab.hardware.catalog import DEVICES, MACHINES
from inferlab.models.catalog import MODELS
from inferlab.perf.placement import place
from inferlab.quant.plan import weight_bytes
from inferlab.perf.speed import BANDWIDTH_ONLY as LESSON, decode_step_time, expert_read_fraction, prefill_time, ridge_batch, roofline_point, throughput


def test_decode_is_bytes_over_eta_beta():
    m, mc = MODELS["llama-3.1-8b"], MACHINES["rtx4090"]
    p = place(m, mc, "Q4_K_M", 4096)
    wb = weight_bytes(m, "Q4_K_M")
    d = decode_step_time(p, mc, 1000)
    read = wb["total"] - wb["token_embd"] + 1000 * 131072  # every weight but the embedding lookup, plus 1000 tokens of K/V
    assert d["total_s"] == pytest.approx(read / (0.7 * 1008e9), rel=1e-9)


def test_lesson_cpu_only_upper_bound():
    # the lesson: about 13 tok/s for an 8B Q4_K_M on dual-channel DDR5 at 70 % efficiency
    m = MODELS["llama-3.1-8b"]
    p = place(m, MACHINES["cpu-ddr5"], "Q4_K_M", 4096)
    assert 12.5 < decode_step_time(p, MACHINES["cpu-ddr5"], 0)["tok_per_s"] < 14.0


def test_moe_reads_only_active_experts():
    m, mc = MODELS["mixtral-8x7b"], MACHINES["h100"]
    p = place(m, mc, "Q4_K_M", 4096)
    wb = weight_bytes(m, "Q4_K_M")
    d = decode_step_time(p, mc, 0)
    dense = wb["total"] - wb["token_embd"] - wb["experts"]
    assert d["per_device"][1]["weights_bytes"] == pytest.approx(dense + wb["experts"] * 2 / 8)
    # a large batch touches almost every expert
    assert expert_read_fraction(8, 2, 1) == pytest.approx(0.25)
    assert expert_read_fraction(8, 2, 64) > 0.99


def test_roofline_ridge_matches_the_lesson():
    # RTX 4090: 165 TFLOP/s over 1,008 GB/s at 4.5 bpw: "about 46 tokens"; batch-1 intensity 3.6
    d = DEVICES["rtx4090"]
    assert ridge_batch(d, 4.5) == pytest.approx(46, abs=0.5)
    pt = roofline_point(d, 1, 4.5)
    assert pt["intensity_flop_per_byte"] == pytest.approx(3.56, abs=0.01) and pt["bound"] == "memory"
    assert pt["utilization"] == pytest.approx(0.02, abs=0.003)
    assert roofline_point(d, 64, 4.5)["bound"] == "compute"


def test_batching_raises_throughput_until_the_ridge():
    m, mc = MODELS["llama-3.1-8b"], MACHINES["rtx4060ti"]
    p = place(m, mc, "Q4_K_M", 8192)
    tps = [throughput(p, mc, b, 512)["tok_per_s"] for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert all(b > a for a, b in zip(tps, tps[1:4]))  # memory-bound: near-linear gains
    assert tps[1] / tps[0] > 1.9
    assert tps[-1] / tps[-2] < 1.5  # past the ridge the gains flatten


def test_decode_slows_with_context_and_partial_offload_dominates():
    m, mc = MODELS["qwen2.5-32b"], MACHINES["rtx4060ti"]
    p = place(m, mc, "Q4_K_M", 8192)
    a, b = decode_step_time(p, mc, 0), decode_step_time(p, mc, 8000)
    assert b["total_s"] > a["total_s"]
    assert a["cpu_s"] > a["gpu_s"] and "partial offload" in a["bottleneck"]


def test_prefill_compute_bound_and_op_offload_transfer():
    m, mc = MODELS["llama-3.1-70b"], MACHINES["rtx4090"]
    p = place(m, mc, "Q4_K_M", 8192)
    f = prefill_time(p, mc, 2000, LESSON)
    cpu_weights = p.cpu.dense_read_bytes + p.cpu.expert_bytes
    assert f["pcie_s"] == pytest.approx(cpu_weights / (0.7 * mc.pcie_gbs * 1e9))
    small = prefill_time(p, mc, 16, LESSON)  # below 32 tokens no op offload: CPU layers compute on the CPU
    assert small["pcie_s"] == 0


def test_bad_input():
    m, mc = MODELS["llama-3.1-8b"], MACHINES["rtx4090"]
    p = place(m, mc, "Q4_K_M", 4096)
    with pytest.raises(InvalidValueError, match="context"):
        decode_step_time(p, mc, -1)
    with pytest.raises(InvalidValueError, match="batch"):
        decode_step_time(p, mc, 10, batch=0)
    with pytest.raises(InvalidValueError, match="n_tokens"):
        prefill_time(p, mc, 0)
    for bad in (2.5, 512.0, True, "512"):  # a prompt is a whole number of tokens: 2.5 was priced before
        with pytest.raises(InvalidValueError, match=r"n_tokens must be a whole number of tokens >= 1, got"):
            prefill_time(p, mc, bad)
    import numpy as np

    assert prefill_time(p, mc, np.int64(512))["total_s"] == prefill_time(p, mc, 512)["total_s"]  # numpy's ints count

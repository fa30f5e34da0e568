"""The roofline of one weight matmul (ridge_batch, arithmetic_intensity, roofline_point), worked out by
hand on the toy GPU of tests/_toy.py: 100 TFLOP/s over 1,000 GB/s meet at 100 FLOP per byte. A weight
of b bits costs b/8 bytes and gives 2 FLOPs per token of the batch, so a batch B runs at 16·B/b FLOP
per byte; at 4 bits that is 4·B, which reaches the ridge at B = 25."""

import pytest

from inferlab.perf.speed import arithmetic_intensity, ridge_batch, roofline_point

from _toy import GPU


def test_the_toy_gpus_ridge_is_at_batch_25_for_4_bit_weights():
    assert arithmetic_intensity(1, 4.0) == 4.0  # 2 FLOPs over half a byte
    assert arithmetic_intensity(25, 4.0) == 100.0
    assert arithmetic_intensity(3, 16.0) == 3.0  # f16: 2 FLOPs over 2 bytes per token
    assert ridge_batch(GPU, 4.0) == pytest.approx(25.0, rel=1e-15)  # 100 FLOP/B x 4 / 16
    assert ridge_batch(GPU, 16.0) == pytest.approx(100.0, rel=1e-15)


def test_below_the_ridge_bandwidth_sets_the_rate():
    # batch 1 at 4 bits: 4 FLOP/B x 1,000 GB/s = 4 TFLOP/s of the 100 attainable: 4 % used
    pt = roofline_point(GPU, 1, 4.0)
    assert pt["batch"] == 1 and pt["intensity_flop_per_byte"] == 4.0
    assert pt["attained_tflops"] == pytest.approx(4.0, rel=1e-12)
    assert pt["peak_tflops"] == 100.0
    assert pt["ridge_intensity"] == pytest.approx(100.0, rel=1e-15)  # 100e12 FLOP/s / 1e12 B/s
    assert pt["bound"] == "memory"
    assert pt["utilization"] == pytest.approx(0.04, rel=1e-12)
    # batch 24: 96 FLOP/B -> 96 TFLOP/s, still memory-bound
    pt = roofline_point(GPU, 24, 4.0)
    assert pt["attained_tflops"] == pytest.approx(96.0, rel=1e-12) and pt["bound"] == "memory"


def test_at_and_past_the_ridge_compute_sets_the_rate():
    # batch 25 meets the compute roof exactly (100 FLOP/B x 1 TB/s = 100 TFLOP/s): compute-bound, all used
    pt = roofline_point(GPU, 25, 4.0)
    assert pt["bound"] == "compute" and pt["attained_tflops"] == pytest.approx(100.0, rel=1e-12) and pt["utilization"] == 1.0
    pt = roofline_point(GPU, 64, 4.0)  # 256 FLOP/B: capped at the peak
    assert pt["attained_tflops"] == pytest.approx(100.0, rel=1e-12) and pt["utilization"] == 1.0


def test_a_bandwidth_efficiency_lowers_the_memory_roof():
    # eta 0.5: batch 1 reads at 500 GB/s -> 2 TFLOP/s; the ridge then moves to batch 50
    assert roofline_point(GPU, 1, 4.0, eta=0.5)["attained_tflops"] == pytest.approx(2.0, rel=1e-12)
    assert roofline_point(GPU, 49, 4.0, eta=0.5)["bound"] == "memory"  # 196 FLOP/B x 0.5 TB/s = 98 TFLOP/s
    assert roofline_point(GPU, 50, 4.0, eta=0.5)["bound"] == "compute"

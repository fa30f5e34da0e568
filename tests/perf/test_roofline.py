"""perf.roofline and api.roofline: ridge points, intensities and the batch where decode stops gaining.

Expected figures are worked out by hand from the catalog's vendor figures in the comments."""

import pytest

from inferlab.api.roofline import roofline
from inferlab.api.setup import configure
from inferlab.errors import InvalidValueError
from inferlab.hardware.catalog import MACHINES
from inferlab.perf.roofline import (decode_attention_point, model_decode_point, model_prefill_point, prefill_attention_point, roof,
                                    saturation_batch, weight_matmul_point)
from inferlab.perf.speed import decode_step_time


def test_ridge_point_of_the_rtx4090_and_the_a100_by_hand():
    # RTX 4090: 165.2 TFLOP/s dense FP16 (FP32 accumulate) over 1,008 GB/s = 163.89 FLOP/byte; a weight
    # matmul at 4.5 bpw has I = 16 B / 4.5, which reaches 163.89 at B = 163.89 x 4.5 / 16 = 46.09
    # (the lesson: "about 46 tokens"); at B = 1, I = 16 / 4.5 = 3.56 ("intensity 3.6 ... roughly 2 %").
    r = roof(MACHINES["rtx4090"].gpu)
    assert r.ridge_flop_per_byte == pytest.approx(163.889, abs=1e-3)
    b1 = weight_matmul_point(r, 1, 4.5)
    assert b1.intensity_flop_per_byte == pytest.approx(3.556, abs=1e-3) and b1.bound == "memory"
    assert b1.utilization == pytest.approx(3.556 / 163.889, rel=1e-3)  # 2.2 %
    assert weight_matmul_point(r, 46, 4.5).bound == "memory" and weight_matmul_point(r, 47, 4.5).bound == "compute"
    rep = roofline("rtx4090")
    assert rep.ridge_batch == pytest.approx(46.09, abs=0.01) and rep.bits_per_weight == 4.5
    # A100 40GB: 312 TFLOP/s over 1,555 GB/s = 200.64 FLOP/byte (the case study prints 200.6)
    assert roof(MACHINES["a100-40gb"].gpu).ridge_flop_per_byte == pytest.approx(200.643, abs=1e-3)


def test_decode_attention_intensity_is_fixed_by_the_architecture():
    # Llama 2 7B (the case study's 7B MHA: 32 layers, 32 heads of 128): per cached token and layer
    # QK^T + AV = 2 x 32 x (128 + 128) = 16,384 FLOPs over K + V = 32 x 256 values x 2 bytes = 16,384 bytes:
    # 1 FLOP/byte at any context and batch. Llama 3.1 8B (8 KV heads): 16,384 / 4,096 = 4 FLOP/byte.
    r = roof(MACHINES["a100-40gb"].gpu)
    m7 = configure("llama-2-7b", "a100-40gb", n_ctx=4096).spec
    for ctx, b in [(512, 1), (8000, 1), (2048, 16)]:
        p = decode_attention_point(r, m7, ctx, "f16", b)
        assert p.intensity_flop_per_byte == pytest.approx(1.0) and p.bound == "memory"
    m8 = configure("llama-3.1-8b", "a100-40gb", n_ctx=4096).spec
    assert decode_attention_point(r, m8, 4000).intensity_flop_per_byte == pytest.approx(4.0)
    # a q8_0 cache (34 bytes per 32 values) raises it by 2 / (34/32)
    assert decode_attention_point(r, m8, 4000, "q8_0").intensity_flop_per_byte == pytest.approx(4.0 * 2 / (34 / 32))


def test_prefill_of_a_7b_model_at_2000_tokens_is_compute_bound():
    # Llama 2 7B in F16 on an A100 40GB (the case study's setup), a 2,000-token prompt in micro-batches of
    # 512: 4 micro-batches each read the weights but token_embd (a lookup): 6.738e9 - 32,000 x 4,096 params
    # = 6.607e9 x 2 bytes = 13.21 GB each, 52.85 GB in all; the prompt's K/V (2,000 x 524,288 B) written and
    # read: 2.10 GB. FLOPs: 2 x 6.607e9 x 2,000 = 2.643e13 for the weights, attention 32 x 16,384 x
    # 2,000^2 / 2 = 1.049e12: 2.748e13 in all. I = 2.748e13 / 5.495e10 = 500 FLOP/byte > 200.6: compute-bound.
    s = configure("llama-2-7b", "a100-40gb", quant="type:F16", n_ctx=4096)
    r = roof(s.machine.gpu)
    p = model_prefill_point(r, s.placement, 2000)
    assert p.flops == pytest.approx(2.748e13, rel=2e-3)
    assert p.bytes_moved == pytest.approx(5.495e10, rel=2e-3)
    assert p.intensity_flop_per_byte == pytest.approx(500, rel=3e-3) and p.bound == "compute"
    # and beyond (the case study's text calls long prefills memory-bound; its own formula says otherwise)
    assert all(model_prefill_point(r, s.placement, n).bound == "compute" for n in (2000, 4000, 8000))
    # its attention alone: 16,384 n^2/2 FLOPs per layer over n x (Q 4,096 + O 4,096 values x 2 B + K/V
    # 16,384 B written and read) = 49,152 n bytes: I = n / 6: 333 at 2,000 (compute), 85 at 512 (memory)
    assert prefill_attention_point(r, s.spec, 2000).intensity_flop_per_byte == pytest.approx(2000 / 6)
    assert prefill_attention_point(r, s.spec, 2000).bound == "compute"
    assert prefill_attention_point(r, s.spec, 512).bound == "memory"
    # a single decode stream of the same model: 2 FLOPs per weight over 2 bytes, plus 1 FLOP/byte attention
    d = model_decode_point(r, s.placement, 2000)
    assert d.intensity_flop_per_byte == pytest.approx(1.0, rel=1e-2) and d.bound == "memory"
    # a 4-bit 7B on an RTX 4090 as well: weight matmuls of 512 tokens at ~4.9 bpw sit at I ~ 1,700
    s4 = configure("qwen2.5-7b", "rtx4090", n_ctx=8192)
    assert model_prefill_point(roof(s4.machine.gpu), s4.placement, 2000).bound == "compute"


def test_saturation_batch_matches_the_ridge_when_only_the_weights_are_read():
    # bandwidth-only, context 0: a step takes max(W / (0.7 beta), B F / (0.5 P)) on a full offload, so
    # tok/s = B / w_s up to B* = w_s / f_s and 1 / f_s beyond. Doubling B adds < 5 % when B >= B*
    # (ratio 1) or B*/2 <= B < B* with B*/B < 1.05; below B*/2 it doubles. So the answer is the
    # smallest integer above B*/1.05, which is at most B*.
    s = configure("llama-3.1-8b", "rtx4090", n_ctx=8192, speed="bandwidth-only")
    g, gpu = s.placement.gpus[0], s.machine.gpu
    w_s = g.dense_read_bytes / (0.7 * gpu.bandwidth_bytes_per_s)
    f_s = g.flops_per_token / (0.5 * gpu.fp16_flops)
    b_star = w_s / f_s  # ~ 0.5/0.7 x ridge x bpw-ish: ~ 32 for this model
    sat = saturation_batch(s.placement, s.machine, 0, s.speed)
    assert b_star / 1.05 < sat <= b_star and sat - 1 <= b_star / 1.05
    tok = lambda b: decode_step_time(s.placement, s.machine, 0, b, s.speed)["tok_per_s"]
    assert tok(2 * sat) < 1.05 * tok(sat) and tok(2 * (sat - 1)) >= 1.05 * tok(sat - 1)


def test_roofline_report_refuses_batches_beyond_the_cache_and_is_strict_json():
    r = roofline("rtx4090", "llama-3.1-8b", n_ctx=8192, context=2048, batches=(1, 4, 8))
    assert [t.batch for t in r.throughput] == [1, 4]
    assert len(r.refused) == 1 and "batch 8 x context 2,048 = 16,384" in r.refused[0].reason and "-c 8,192" in r.refused[0].reason
    assert r.throughput[1].tok_per_s > r.throughput[0].tok_per_s
    assert r.device == "RTX 4090" and len(r.roofs) == 2
    d = r.to_dict()
    assert d["kind"] == "RooflineReport" and d["points"][0]["op"] == "weights"
    r.to_json()
    cpu = roofline("cpu-ddr5", "llama-3.1-8b", n_ctx=8192)
    assert cpu.device == "Dual-channel DDR5-5600" and len(cpu.roofs) == 1


@pytest.mark.parametrize("kw", [dict(batches=(0,)), dict(batches=()), dict(contexts=(-1,)), dict(context=-5), dict(batches=(1.5,))])
def test_bad_roofline_input_is_a_typed_error(kw):
    with pytest.raises(InvalidValueError):
        roofline("rtx4090", "llama-3.1-8b", **kw)


def test_the_lessons_try_this_answers():
    # 1. RTX 3060 (25.5 TFLOP/s, 360 GB/s: ridge 70.83 FLOP/byte), Llama 3.1 8B Q4_K_M at 4.894 bpw
    #    (the lesson's 4.89): the weights stop being the bottleneck at 70.83 x 4.894 / 16 = 21.7 streams
    r = roofline("rtx3060", "llama-3.1-8b", quant="Q4_K_M", n_ctx=8192)
    assert r.ridge_flop_per_byte == pytest.approx(70.833, abs=1e-3)
    assert r.bits_per_weight == pytest.approx(4.89, abs=0.01) and r.ridge_batch == pytest.approx(21.7, abs=0.05)
    # 2. F16 -> Q4_K_M at batch 1: the intensity rises 16 / 4.894 = 3.27x ("3.3x")
    f16 = roofline("rtx3060", "llama-3.1-8b", quant="F16", n_ctx=8192)
    b1 = lambda rep: next(p for p in rep.points if p.op == "weights" and p.phase == "decode" and p.batch == 1)
    assert b1(r).intensity_flop_per_byte / b1(f16).intensity_flop_per_byte == pytest.approx(3.27, abs=0.01)
    # 3. M4 Max (16.2 TFLOP/s, 546 GB/s: 29.7 FLOP/byte) against the RTX 4090 (163.9): batches turn
    #    compute-bound sooner on the Mac
    m4, g4 = roofline("m4max"), roofline("rtx4090")
    assert m4.ridge_flop_per_byte == pytest.approx(29.67, abs=0.01) and m4.ridge_batch < g4.ridge_batch / 5


def test_a_preset_without_a_model_has_no_single_bits_per_weight():
    with pytest.raises(InvalidValueError, match="preset"):
        roofline("rtx4090", quant="Q4_K_M")
    assert roofline("rtx4090", quant="Q8_0").bits_per_weight == 8.5


def test_a_configuration_that_does_not_fit_gets_no_throughput():
    r = roofline("rtx4060ti", "qwen2.5-32b", n_ctx=8192, n_gpu_layers=99)
    assert r.throughput == () and r.saturation_batch is None and r.saturation_note == ""
    assert any("does not fit" in n for n in r.notes)
    assert r.points  # the kernels' intensities do not depend on it running

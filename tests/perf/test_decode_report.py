"""What a decode step reports besides its time: the record of a device with nothing to do, and which
sentence names the bottleneck when the CPU's share of the step is just under, exactly at, or just over
one half (the "partial offload" sentence needs more than half). Figures from tests/_toy.py by hand."""

import pytest

from inferlab.hardware.device import Device, Machine
from inferlab.perf.placement import place
from inferlab.perf.speed import decode_step_time

from _toy import DENSE, F32, MACHINE


def test_a_device_with_nothing_to_do_reports_zeros():
    # full offload (-ngl 5): the host holds only token_embd (a lookup) and no cache
    p = place(DENSE, MACHINE, F32, 2048, n_gpu_layers=5)
    host = decode_step_time(p, MACHINE, 100, batch=2)["per_device"][0]
    assert host == {"device": "toy host", "kind": "cpu", "s": 0.0, "bytes": 0.0, "weights_bytes": 0.0, "kv_bytes": 0.0,
                    "memory_s": 0.0, "compute_s": 0.0, "overhead_s": 0.0, "bound": "memory"}


# A machine whose host reads twice as fast as its GPU, so that -nkvo (the host reads every cache, the GPU
# every weight) can split a step exactly in two: the GPU reads 10,470,400 bytes (4 blocks + the head)
# = 1,024 x 10,225; the host 2,048 bytes per token per sequence, so batch 5 at 2,045 tokens
# (5 x 2,045 = 10,225) reads 20,940,800 bytes, twice the GPU's, at twice the bandwidth: the same
# seconds, 10,470,400 / (0.7 x 100 GB/s) = 149.577 us each (both far above their compute times:
# the host's 5 x 4,096 x 2,045 FLOPs at 0.5 TFLOP/s take 83.8 us).
SLOW_GPU = Device("slow GPU", 100.0, 100.0, 100.0, backend="cuda")
FAST_HOST = Device("fast host", 64.0, 200.0, 1.0, backend="cpu", n_cores=8)
HALF = Machine("half", SLOW_GPU, FAST_HOST, 25.0)


@pytest.mark.parametrize("context,sentence", [
    # 5 x 2,048 x 2,044 = 20,930,560 bytes on the host: under half, the GPU is the slowest
    (2044, "memory-bandwidth-bound on slow GPU: 0.01 GB read per step"),
    # exactly half: not more than half, so the slowest device is named, the first of the two (the host)
    (2045, "memory-bandwidth-bound on fast host: 0.02 GB read per step"),
    # 5 x 2,048 x 2,046 = 20,951,040: 20,951,040 / (20,951,040 + 20,940,800) = 50.02 % on the CPU
    (2046, "partial offload: 50% of each step is spent on the CPU's layers in system RAM"),
])
def test_the_partial_offload_sentence_needs_more_than_half_the_step(context, sentence):
    p = place(DENSE, HALF, F32, 16384, n_gpu_layers=5, no_kv_offload=True)
    d = decode_step_time(p, HALF, context, batch=5)
    host, gpu = d["per_device"]
    assert gpu["s"] == pytest.approx(10_470_400 / 70e9, rel=1e-12)
    assert host["kv_bytes"] == 5 * 2_048 * context
    if context == 2045:
        assert host["s"] == gpu["s"] and d["cpu_s"] == 0.5 * d["total_s"]  # the split is exact, not approximate
    assert d["bottleneck"] == sentence

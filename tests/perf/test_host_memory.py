"""The host's side of a placement, by hand on the toy model of tests/_toy.py: llama.cpp's --fit margin
(FIT_TARGET_BYTES, 1 GiB) is kept free on each GPU only; the host is judged by its capacity alone (with
mmap llama.cpp starts even past it, so the placement only says it does not fit). A machine without a
GPU offloads nothing: -ngl 0 whatever --fit or the user asked; an -ngl past n_layers + 1 is a full offload.

Full offload (-ngl 5) at -c 1024 leaves the host token_embd (1,024,000 bytes) and the FFN's compute
buffer (3,145,728 bytes, tests/perf/test_boundaries.py), no cache: 4,169,728 bytes."""

from dataclasses import replace

from inferlab.hardware.device import Machine
from inferlab.perf.placement import FIT_TARGET_BYTES, place

from _toy import CPU_ONLY, DENSE, EMBD_BYTES, F32, GPU, HOST, MACHINE

HOST_NEED = EMBD_BYTES + 3_145_728  # 4,169,728


def _machine(host_bytes: int) -> Machine:
    return Machine("toy small host", GPU, replace(HOST, memory_gb=host_bytes / 1e9), 25.0)


def test_the_host_needs_no_margin():
    assert FIT_TARGET_BYTES == 1024**3
    # 500,000 bytes to spare: far less than the GPUs' 1 GiB margin, yet it fits
    mc = _machine(HOST_NEED + 500_000)
    p = place(DENSE, mc, F32, 1024, n_gpu_layers=5)
    assert p.cpu.total_bytes == HOST_NEED and p.cpu.kv_bytes == 0
    assert p.fits and p.reason == ""


def test_a_host_exactly_full_fits():
    # capacity = need (4,169,728 bytes = 0.004169728 GB, exact in binary after x 1e9): not more than it has
    p = place(DENSE, _machine(HOST_NEED), F32, 1024, n_gpu_layers=5)
    assert p.cpu.capacity_bytes == p.cpu.total_bytes == HOST_NEED
    assert p.fits and p.reason == ""


def test_a_host_short_of_its_bytes_does_not_fit():
    mc = _machine(HOST_NEED - 500_000)  # 3,669,728 bytes
    p = place(DENSE, mc, F32, 1024, n_gpu_layers=5)
    assert not p.fits
    assert p.reason.startswith("host memory needs 0.00 GB but has 0.00 GB")
    assert "toy GPU" not in p.reason  # the GPU (100 GB for 15.7 MB) is no reason


def test_more_layers_than_the_model_has_mean_full_offload():
    # -ngl 6 or 99 on a 4-block model: llama.cpp offloads the 5 layers there are (4 blocks + the head);
    # the placement records n_layers + 1 = 5, as --fit's full offload does on two GPUs
    full = place(DENSE, MACHINE, F32, 1024, n_gpu_layers=5)
    for ngl in (6, 99):
        p = place(DENSE, MACHINE, F32, 1024, n_gpu_layers=ngl)
        assert p.n_gpu_layers == 5 and p.fully_offloaded and p.devices == full.devices
    two = Machine("toy x2", GPU, HOST, 25.0, extra_gpus=(replace(GPU, name="toy GPU 2"),))
    q = place(DENSE, two, F32, 1024)
    assert q.auto and q.n_gpu_layers == 5 and q.fully_offloaded


def test_a_machine_without_a_gpu_offloads_nothing():
    for ngl in (None, 0, 3, 5):
        p = place(DENSE, CPU_ONLY, F32, 1024, n_gpu_layers=ngl)
        assert p.n_gpu_layers == 0 and not p.gpus and not p.fully_offloaded
        # everything on the host: 4 blocks + token_embd + the head = 9,445,376 + 1,024,000 + 1,025,024
        assert p.cpu.weights_bytes == 11_494_400 and p.cpu.n_blocks == 4 and p.cpu.has_output

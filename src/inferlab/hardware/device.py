"""Device and Machine: what the performance model needs to know about hardware.

A *device* is one pool of memory with the processor that reads it: a GPU with its VRAM, or the
host CPU with its system RAM (backend "cpu"). A *machine* is a host plus zero or more GPUs joined
by PCIe, or one unified pool (Apple silicon). Units: GB = 10^9 bytes, GB/s = 10^9 bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import InvalidValueError, check_positive

BACKENDS = ("cuda", "rocm", "metal", "vulkan", "sycl", "cpu")
GB = 1e9


@dataclass(frozen=True)
class Device:
    """A memory pool and the processor that reads it (the seed's positional order)."""

    name: str
    memory_gb: float  # capacity, GB (10^9 bytes)
    bandwidth_gbs: float  # peak memory read bandwidth, GB/s
    fp16_tflops: float  # dense FP16 matmul throughput (FP32 accumulate on GeForce), TFLOP/s
    backend: str = "cuda"
    source: str = ""
    # CPU devices: cores and the vector throughput that bounds quantized dot products
    n_cores: int | None = None
    fp32_tflops: float | None = None
    vendor: str = ""
    notes: str = ""
    isa: tuple[str, ...] = ()  # CPU devices: vector ISA features as the OS reports them ("avx2", "avx512f", "neon", "amx_tile"...)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InvalidValueError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        check_positive(f"{self.name}: memory_gb", self.memory_gb)
        check_positive(f"{self.name}: bandwidth_gbs", self.bandwidth_gbs)
        check_positive(f"{self.name}: fp16_tflops", self.fp16_tflops)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GB)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gbs * GB

    @property
    def fp16_flops(self) -> float:
        return self.fp16_tflops * 1e12

    @property
    def is_cpu(self) -> bool:
        return self.backend == "cpu"

    def with_memory(self, memory_gb: float) -> "Device":
        return replace(self, memory_gb=memory_gb)


@dataclass(frozen=True)
class Machine:
    """A host (CPU + RAM) with zero or more GPUs. Positional order as in the seed:
    Machine(name, gpu, ram, pcie_gbs).

    unified: the GPU and the CPU share one memory pool (Apple silicon); then ``gpu`` describes
    the pool as the GPU sees it and ``ram`` the same pool as the CPU sees it.
    """

    name: str
    gpu: Device | None
    ram: Device
    pcie_gbs: float = 0.0  # host<->GPU link, GB/s per direction
    extra_gpus: tuple[Device, ...] = ()
    unified: bool = False
    source: str = ""
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.ram.is_cpu:
            raise InvalidValueError(f"machine {self.name!r}: ram must be a cpu-backend Device, got backend {self.ram.backend!r}")
        if self.gpu is None and self.extra_gpus:
            raise InvalidValueError(f"machine {self.name!r}: extra_gpus given without a first gpu")

    @property
    def gpus(self) -> tuple[Device, ...]:
        g = self.__dict__.get("_gpus")
        if g is None:  # asked for on every placement: build it once
            g = ((self.gpu,) if self.gpu is not None else ()) + self.extra_gpus
            object.__setattr__(self, "_gpus", g)
        return g

    @property
    def cpu_only(self) -> bool:
        return self.gpu is None

    def with_ram(self, ram: Device) -> "Machine":
        return replace(self, ram=ram)

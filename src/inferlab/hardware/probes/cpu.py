"""The CPU: model, physical and logical cores, vector ISA, clock and last-level cache.

Linux: ``lscpu`` first, ``/proc/cpuinfo`` as the fallback; macOS: ``sysctl`` (see apple.py).
ISA features are normalised to one vocabulary across x86 and Arm (see FEATURES).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, replace

from . import ProbeReport, Runner, ToolUnavailable, parse_size_bytes, read_file, run_tool

# Normalised ISA feature -> the kernel's /proc/cpuinfo flag (x86 "flags", Arm "Features")
# or macOS sysctl hw.optional key that announces it. The features that decide llama.cpp's
# CPU kernels: AVX2/AVX-512/AMX on x86, NEON/dot-product/i8mm/SVE on Arm.
FEATURES: dict[str, tuple[str, ...]] = {
    "fma": ("fma",),
    "f16c": ("f16c",),
    "avx2": ("avx2", "hw.optional.avx2_0"),
    "avx_vnni": ("avx_vnni",),
    "avx512": ("avx512f", "hw.optional.avx512f"),
    "avx512_vnni": ("avx512_vnni",),
    "avx512_bf16": ("avx512_bf16",),
    "avx512_fp16": ("avx512_fp16",),
    "amx": ("amx_tile",),
    "amx_int8": ("amx_int8",),
    "amx_bf16": ("amx_bf16",),
    "neon": ("asimd", "hw.optional.neon", "hw.optional.AdvSIMD", "hw.optional.arm64"),
    "dotprod": ("asimddp", "hw.optional.arm.FEAT_DotProd"),
    "i8mm": ("i8mm", "hw.optional.arm.FEAT_I8MM"),
    "bf16": ("bf16", "hw.optional.arm.FEAT_BF16"),
    "sve": ("sve",),
}


@dataclass(frozen=True)
class CpuInfo:
    model: str
    vendor: str
    arch: str  # "x86_64", "aarch64", "arm64"
    physical_cores: int | None
    logical_cores: int | None
    features: tuple[str, ...]  # normalised names, see FEATURES
    max_mhz: float | None = None
    l3_bytes: int | None = None  # last-level cache, all instances together
    hypervisor: str = ""
    source: str = ""

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def simd(self) -> str:
        """The widest vector ISA llama.cpp would use here: amx, avx512, avx2, neon or scalar."""
        for isa in ("amx", "avx512", "avx2", "neon"):
            if isa in self.features:
                return isa
        return "scalar"


def features_from_flags(flags: set[str]) -> tuple[str, ...]:
    return tuple(name for name, keys in FEATURES.items() if any(k in flags for k in keys))


def _fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def parse_lscpu(text: str) -> CpuInfo:
    """Parse plain ``lscpu`` output (the 'Key: value' form, any util-linux version)."""
    f = _fields(text)
    logical = _int(f.get("CPU(s)"))
    per_socket = _int(f.get("Core(s) per socket")) or _int(f.get("Core(s) per cluster"))
    sockets = _int(f.get("Socket(s)")) or _int(f.get("Cluster(s)")) or 1
    physical = per_socket * sockets if per_socket else None
    l3 = f.get("L3 cache")
    return CpuInfo(
        model=f.get("Model name", "unknown"),
        vendor=f.get("Vendor ID", ""),
        arch=f.get("Architecture", ""),
        physical_cores=physical,
        logical_cores=logical,
        features=features_from_flags(set(f.get("Flags", "").split())),
        max_mhz=_float(f.get("CPU max MHz")),
        l3_bytes=parse_size_bytes(l3) if l3 else None,
        hypervisor=f.get("Hypervisor vendor", ""),
        source="lscpu",
    )


def parse_proc_cpuinfo(text: str, arch: str = "") -> CpuInfo:
    """Parse /proc/cpuinfo (x86 'flags' or Arm 'Features' blocks, one per logical CPU)."""
    blocks = [_fields(b) for b in text.strip().split("\n\n") if b.strip()]
    blocks = [b for b in blocks if "processor" in b]
    first = blocks[0] if blocks else {}
    cores = {(b.get("physical id", "0"), b.get("core id")) for b in blocks if b.get("core id") is not None}
    flags = set((first.get("flags") or first.get("Features") or "").split())
    mhz = _float(first.get("cpu MHz"))
    return CpuInfo(
        model=first.get("model name") or first.get("Hardware") or first.get("CPU part", "unknown"),
        vendor=first.get("vendor_id") or first.get("CPU implementer", ""),
        arch=arch,
        physical_cores=len(cores) if cores else None,
        logical_cores=len(blocks) or None,
        features=features_from_flags(flags),
        max_mhz=mhz,
        source="/proc/cpuinfo",
    )


def probe_cpu(runner: Runner = run_tool, cpuinfo_path: str = "/proc/cpuinfo") -> tuple[CpuInfo | None, list[ProbeReport]]:
    """The CPU from lscpu, else /proc/cpuinfo; on macOS use apple.probe_apple instead."""
    reports: list[ProbeReport] = []
    try:
        info = parse_lscpu(runner(["lscpu"]))
        if info.logical_cores and info.max_mhz is None:  # VMs often hide the max clock: take the current one
            try:
                mhz = parse_proc_cpuinfo(read_file(cpuinfo_path)).max_mhz
                info = replace(info, max_mhz=mhz, source="lscpu + /proc/cpuinfo (clock)" if mhz else info.source)
            except ToolUnavailable:
                pass
        if info.logical_cores:
            reports.append(ProbeReport("lscpu", True, f"{info.model}, {info.physical_cores} cores / {info.logical_cores} threads"))
            return info, reports
        reports.append(ProbeReport("lscpu", False, "lscpu printed no CPU(s) line"))
    except ToolUnavailable as exc:
        reports.append(ProbeReport("lscpu", False, str(exc)))
    try:
        info = parse_proc_cpuinfo(read_file(cpuinfo_path), arch=platform.machine())
        reports.append(ProbeReport("/proc/cpuinfo", True, f"{info.model}, {info.physical_cores} cores / {info.logical_cores} threads"))
        return info, reports
    except ToolUnavailable as exc:
        reports.append(ProbeReport("/proc/cpuinfo", False, str(exc)))
    # Last resort: the standard library knows the logical count and nothing else.
    n = os.cpu_count()
    reports.append(ProbeReport("os.cpu_count", n is not None, f"{n} logical CPUs; model and ISA unknown"))
    if n is None:
        return None, reports
    return CpuInfo("unknown", "", platform.machine(), None, n, (), source="os.cpu_count"), reports


def usable_cpus() -> int | None:
    """CPUs this process may run on (cgroups/affinity), which can be fewer than the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()

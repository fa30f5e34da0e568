"""This computer as a Machine: probe what is in it, look up what cannot be read, say which is which.

``inspect_machine()`` runs the probes (probes/), matches detected GPUs to the catalog
(bandwidth and FLOPs cannot be read from a driver), takes the host's memory bandwidth and
matmul throughput from the calibration profile (``inferlab calibrate``) when there is one,
and returns a Detection: the Machine plus, for every figure, where it came from.
``detect_machine()`` returns just the Machine (``hardware.resolve.resolve_machine("local")`` calls it).
"""

from __future__ import annotations

import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..errors import UnknownNameError
from .device import GB, Device, Machine
from .probes import PCIE_LANE_GBPS, GpuInfo, ProbeReport, Runner, pcie_gbs, run_tool
from .probes.apple import AppleChip, probe_apple
from .probes.cpu import CpuInfo, probe_cpu, usable_cpus
from .probes.memory import MemoryInfo, probe_memory
from .probes.nvidia import probe_nvidia
from .probes.rocm import probe_rocm

# Vector FP32 FLOP per cycle per core (two FMA pipes x lanes x 2): the estimate used only when
# there is no calibration profile. Source: vendor optimisation manuals (Zen 2-4 and Skylake-SP+:
# 2x256-bit or 2x512-bit FMA; Apple Firestorm: 4x128-bit FMA).
PCIE_ASSUMED_GBS: float = PCIE_LANE_GBPS[4] * 16  # when no tool reports the link: PCIe 4.0 x16 (pcie_gbs(4, 16)), the common desktop slot
FP32_FLOP_PER_CYCLE = {"amx": 64, "avx512": 64, "avx2": 32, "neon": 32, "scalar": 4}


@dataclass(frozen=True)
class Figure:
    """One number shown to the user and where it came from."""

    what: str  # "RAM bandwidth"
    value: str  # "21.3 GB/s"
    origin: str  # "read: psutil", "catalog: RTX 4090", "calibrated: <profile> (date)", "estimated: ...", "unknown: why"

    @property
    def kind(self) -> str:
        return self.origin.split(":", 1)[0]


@dataclass(frozen=True)
class Detection:
    machine: Machine
    cpu: CpuInfo | None
    memory: MemoryInfo | None
    gpus: tuple[GpuInfo, ...]
    apple: AppleChip | None
    figures: tuple[Figure, ...]
    probes: tuple[ProbeReport, ...]
    unmatched_gpus: tuple[str, ...] = field(default=())  # detected but left out: no figures for them

    @property
    def read(self) -> tuple[Figure, ...]:
        return tuple(f for f in self.figures if f.kind == "read")

    @property
    def looked_up(self) -> tuple[Figure, ...]:
        return tuple(f for f in self.figures if f.kind == "catalog")


# ---------------------------------------------------------------- catalog matching

_GENERIC = {"nvidia", "geforce", "amd", "radeon", "apple", "gpu", "graphics", "sxm", "sxm4", "sxm5", "pcie", "hbm3",
            "hbm2e", "hbm3e", "nvl", "core", "laptop", "generation", "ada", "the", "and", "with", "instinct"}
_MODIFIERS = {"ti", "super", "max", "pro", "ultra", "xt", "xtx", "mobile", "laptop", "lite"}


def _tokens(name: str) -> list[str]:
    """'NVIDIA GeForce RTX 4060 Ti' -> ['nvidia', 'geforce', 'rtx', '4060', 'ti']; memory sizes ('80GB') kept whole."""
    name = re.sub(r"\(.*?\)", " ", name.lower())
    return re.findall(r"\d+gb|[a-z]+\d+[a-z]*|\d+|[a-z]+", name)


def _core_count(name: str) -> int | None:
    m = re.search(r"(\d+)-core", name)
    return int(m.group(1)) if m else None


def match_catalog(detected: str, catalog: Mapping[str, Device], *, memory_bytes: int | None = None,
                  gpu_cores: int | None = None) -> str | None:
    """The catalog key of the device a detected GPU name denotes, or None.

    Every model token of the catalog name must be in the detected name, and modifiers (Ti,
    SUPER, Max, Pro, XTX...) must agree both ways; among several candidates (memory variants,
    Apple GPU core counts) the closest memory size and core count win.
    """
    got = set(_tokens(detected))
    best: tuple[float, str] | None = None
    for key, dev in catalog.items():
        if dev.is_cpu:
            continue
        want = [t for t in _tokens(dev.name) if t not in _GENERIC and not t.endswith("gb")]
        if not want or not all(t in got for t in want):
            continue
        if {t for t in got if t in _MODIFIERS} != {t for t in _tokens(dev.name) if t in _MODIFIERS}:
            continue
        score = float(len(want))
        if memory_bytes:  # prefer the memory variant nearest what the driver reports
            score -= abs(dev.memory_gb - memory_bytes / GB) / max(dev.memory_gb, 1.0)
        cores = _core_count(dev.name)
        if gpu_cores is not None and cores is not None:
            score -= 0 if cores == gpu_cores else 1.5
        if best is None or score > best[0]:
            best = (score, key)
    return best[1] if best else None


def _catalog_devices() -> tuple[Mapping[str, Device], str]:
    """The hardware catalog (GPUs and host memory presets by key), and '' or why it is not available."""
    try:
        from . import catalog
    except (ImportError, OSError, ValueError) as exc:
        return {}, f"the hardware catalog is not available ({exc})"
    return _Both(catalog.DEVICES, catalog.HOSTS), ""


class _Both(Mapping):
    """GPU devices and host presets as one read-only mapping; unknown keys raise UnknownNameError."""

    def __init__(self, *parts: Mapping[str, Device]):
        self._parts = parts

    def __getitem__(self, key: str) -> Device:
        for part in self._parts:
            if key in part:
                return part[key]
        raise UnknownNameError("catalog device", key, list(self))

    def __iter__(self):
        for part in self._parts:
            yield from part

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)


# ---------------------------------------------------------------- the host CPU device

def _host_device(cpu: CpuInfo | None, memory: MemoryInfo | None, profile: dict | None,
                 catalog: Mapping[str, Device], cpu_name: str | None, figures: list[Figure]) -> Device:
    model = cpu.model if cpu else "unknown CPU"
    if memory is not None:
        memory_gb = memory.total_bytes / GB
        figures.append(Figure("RAM", f"{memory.total_bytes / 2**30:.1f} GiB", f"read: {memory.source}"))
        if memory.available_bytes is not None:
            figures.append(Figure("RAM available", f"{memory.available_bytes / 2**30:.1f} GiB", f"read: {memory.source}"))
    else:
        memory_gb = 8.0
        figures.append(Figure("RAM", "8 GB (assumed)", "unknown: neither psutil nor /proc/meminfo answered"))
    cores = (cpu.physical_cores if cpu else None) or usable_cpus() or 1
    if cpu is not None:
        figures.append(Figure("CPU", model, f"read: {cpu.source}"))
        figures.append(Figure("cores", f"{cpu.physical_cores} physical / {cpu.logical_cores} logical"
                              if cpu.physical_cores else f"{cpu.logical_cores} logical (physical unknown)", f"read: {cpu.source}"))
        figures.append(Figure("ISA", ", ".join(cpu.features) or "none of " + ", ".join(("avx2", "avx512", "amx", "neon")),
                              f"read: {cpu.source}"))
        names = {"avx2": "AVX2", "avx512": "AVX-512", "amx": "AMX"} if cpu.arch in ("x86_64", "amd64", "i686", "") and not cpu.has("neon") \
            else {"neon": "NEON", "dotprod": "dot product", "i8mm": "int8 matmul (i8mm)", "sve": "SVE"}
        for key, label in names.items():
            figures.append(Figure(label, "yes" if cpu.has(key) else "no", f"read: {cpu.source}"))
    if cpu_name is not None:  # forced catalog device for the host
        if cpu_name not in catalog or not catalog[cpu_name].is_cpu:
            raise UnknownNameError("host memory preset", cpu_name, [n for n, d in catalog.items() if d.is_cpu])
        dev = replace(catalog[cpu_name], memory_gb=memory_gb)
        figures.append(Figure("RAM bandwidth", f"{dev.bandwidth_gbs:g} GB/s", f"catalog: {cpu_name} (forced)"))
        return dev

    bandwidth, flops32, flops16 = None, None, None
    if profile:
        from .profile import profile_id

        when = f"profile {profile_id(profile)} of {profile.get('date', '?')}"

        def cap(r: dict) -> float:  # the capability figure: the best sustained repetition (older profiles: the median)
            return r.get("best", r["median"])

        bw = profile.get("cpu", {}).get("read_bandwidth_gbs", {})
        best = max(bw.values(), key=cap, default=None) if bw else None
        if best:
            bandwidth = cap(best)
            figures.append(Figure("RAM bandwidth", f"{bandwidth:.1f} GB/s (read, best thread count)", f"calibrated: {when}"))
        mm = profile.get("cpu", {}).get("matmul_tflops", {})
        if "fp32" in mm:
            flops32 = cap(mm["fp32"])
            figures.append(Figure("FP32 matmul", f"{flops32 * 1e3:.3g} GFLOP/s", f"calibrated: {when}"))
        if "bf16" in mm:  # half-precision matmul: the faster of the bf16 kernel and fp32 (bf16 is emulated without AVX512_BF16/AMX)
            flops16 = max(cap(mm["bf16"]), flops32 or 0.0)
            figures.append(Figure("BF16 matmul", f"{cap(mm['bf16']) * 1e3:.3g} GFLOP/s", f"calibrated: {when}"))
        ref = (profile.get("llama_cpp") or {}).get("reference") or {}
        ramp, ladder = ref.get("dram_ramp_bytes"), (ref.get("cache_ladder") or {}).get("ladder_bytes") or []
        if ramp:  # where decode's weights stop fitting the cache, as llama.cpp met it (lscpu's L3 may be the host's)
            figures.append(Figure("decode cache", f"weights past {ramp[0] / 1e6:.0f}-{ramp[1] / 1e6:.0f} MB stream from DRAM",
                                  f"calibrated (llama.cpp cache ladder): {when}"))
        elif len(ladder) >= 4:
            figures.append(Figure("decode cache", f"no step up to {ladder[-1] / 1e6:.0f} MB (larger models not verified)",
                                  f"calibrated (llama.cpp cache ladder): {when}"))
        for why in profile.get("problems", [])[:3]:
            figures.append(Figure("profile warning", why, f"calibrated: {when}"))
    if bandwidth is None:
        bandwidth = _quick_read_bandwidth_gbs(cores)
        if bandwidth is not None:
            figures.append(Figure("RAM bandwidth", f"{bandwidth:.1f} GB/s", f"measured: quick {cores}-thread numpy read, CPU-time "
                                  "clock (run `inferlab calibrate` for a profile with spreads)"))
        else:
            bandwidth = 10.0 * cores
            figures.append(Figure("RAM bandwidth", f"{bandwidth:g} GB/s (assumed 10 GB/s per core)",
                                  "unknown: no calibration profile and numpy is missing; run `inferlab calibrate`"))
    if flops32 is None:
        mhz = cpu.max_mhz if cpu else None
        simd = cpu.simd if cpu else "scalar"
        if mhz:
            flops32 = cores * mhz * 1e6 * FP32_FLOP_PER_CYCLE[simd] / 1e12  # cores x clock x FLOP/cycle
            figures.append(Figure("FP32 peak", f"{flops32 * 1e3:.0f} GFLOP/s", f"estimated: {cores} cores x {mhz:.0f} MHz x "
                                  f"{FP32_FLOP_PER_CYCLE[simd]} FLOP/cycle ({simd})"))
        else:
            flops32 = cores * 2.5e9 * FP32_FLOP_PER_CYCLE[simd] / 1e12
            figures.append(Figure("FP32 peak", f"{flops32 * 1e3:.0f} GFLOP/s", "estimated: clock unknown, 2.5 GHz assumed"))
    dev = Device(
        name=model, memory_gb=memory_gb, bandwidth_gbs=bandwidth, fp16_tflops=flops16 or flops32, backend="cpu",
        source=f"detected on this machine ({cpu.source if cpu else 'no CPU probe'}"
               f"{'; calibrated: ' + when if profile else ''})",
        n_cores=cores, fp32_tflops=flops32, vendor=cpu.vendor if cpu else "",
        notes=("ISA: " + ", ".join(cpu.features)) if cpu else "", isa=tuple(cpu.features) if cpu else (),
    )
    if profile:
        _attach_profile_rates(dev, profile, figures)
    return dev


def _attach_profile_rates(dev: Device, profile: dict, figures: list[Figure]) -> None:
    """The CPU kernel rates of the detected host: the profile's own llama.cpp fit when calibrate
    ran llama.cpp here, else the stored reference of this ISA class scaled by the profile's int8
    and fp32 matmul figures (perf.cpu_model.scaled_reference)."""
    from ..perf.cpu_model import attach_rates, nearest_reference, reference_for, scaled_reference
    from .profile import profile_id

    rid, date = profile_id(profile), profile.get("date", "?")
    ref = (profile.get("llama_cpp") or {}).get("reference")
    if ref:
        attach_rates(dev, ref)
        figures.append(Figure("CPU kernel rates", f"llama.cpp, {len(ref['per_core_bytes_per_s'])} types measured here",
                              f"calibrated: {ref['provenance']}"))
        return
    mm = profile.get("cpu", {}).get("matmul_tflops", {})
    here = {}
    cores = dev.n_cores or 1
    if "fp32" in mm:
        here["fp32_matmul_gflops_per_core"] = mm["fp32"].get("best", mm["fp32"]["median"]) * 1e3 / cores
    if "int8" in mm:
        here["int8_matmul_gops_per_core"] = mm["int8"].get("best", mm["int8"]["median"]) * 1e3 / cores
    base = nearest_reference(dev) or reference_for(dev)  # this ISA class's stored reference, or the nearest class's
    scaled = scaled_reference(base, here, rid=rid, date=date)
    attach_rates(dev, scaled)
    figures.append(Figure("CPU kernel rates", f"reference {base['id']}, scaled", f"calibrated: {scaled['provenance']}"))


def _quick_read_bandwidth_gbs(threads: int) -> float | None:
    try:
        from .measure import read_bandwidth_gbs
    except ImportError:
        return None
    try:
        return read_bandwidth_gbs(threads, total_bytes=128 * 2**20, repeats=3, clock="cpu").median
    except ImportError:
        return None


# ---------------------------------------------------------------- GPUs

def _gpu_device(gpu: GpuInfo, catalog: Mapping[str, Device], forced: str | None, reason: str,
                figures: list[Figure]) -> Device | None:
    label = f"GPU {gpu.index}"
    figures.append(Figure(f"{label}", gpu.name, f"read: {gpu.source}"))
    if gpu.memory_total_bytes is not None:
        figures.append(Figure(f"{label} memory", f"{gpu.memory_total_bytes / 2**30:.1f} GiB", f"read: {gpu.source}"))
    if gpu.memory_free_bytes is not None:
        figures.append(Figure(f"{label} memory free", f"{gpu.memory_free_bytes / 2**30:.1f} GiB", f"read: {gpu.source}"))
    if gpu.pcie_gen_max is not None:
        figures.append(Figure(f"{label} PCIe", f"gen {gpu.pcie_gen_max} x{gpu.pcie_width_max} (now gen {gpu.pcie_gen_current} "
                              f"x{gpu.pcie_width_current})", f"read: {gpu.source}"))
    if forced is not None:
        if forced not in catalog or catalog[forced].is_cpu:
            raise UnknownNameError("GPU", forced, [n for n, d in catalog.items() if not d.is_cpu])
        name = forced
    else:
        name = match_catalog(gpu.name, catalog, memory_bytes=gpu.memory_total_bytes, gpu_cores=gpu.gpu_cores)
    if name is None:
        why = reason or f"{gpu.name!r} matches no catalog device; force one with --gpu NAME"
        figures.append(Figure(f"{label} bandwidth, FLOPs", "unknown", f"unknown: {why}"))
        return None
    dev = catalog[name]
    how = f"catalog: {name}{' (forced)' if forced else ''}"
    figures.append(Figure(f"{label} bandwidth", f"{dev.bandwidth_gbs:g} GB/s", how))
    figures.append(Figure(f"{label} FP16 tensor", f"{dev.fp16_tflops:g} TFLOP/s", how))
    memory_gb = gpu.memory_total_bytes / GB if gpu.memory_total_bytes else dev.memory_gb
    return replace(dev, memory_gb=memory_gb, notes=(dev.notes + "; " if dev.notes else "") + f"detected as {gpu.name!r}")


def inspect_machine(*, gpu: str | None = None, cpu: str | None = None, runner: Runner = run_tool, nvml: object = None,
                    profile: dict | None | bool = True, catalog: Mapping[str, Device] | None = None,
                    system: str | None = None) -> Detection:
    """Probe this computer. ``gpu``/``cpu`` force catalog devices; ``profile``: True loads the saved
    calibration profile, False ignores it, a dict uses that one; ``runner``, ``nvml``, ``catalog``
    and ``system`` ('Linux', 'Darwin') are for replaying recorded outputs."""
    system = system or platform.system()
    if catalog is None:
        cat, cat_reason = _catalog_devices()
    else:
        cat, cat_reason = catalog, ""
    if profile is True:
        from .profile import load_profile
        profile = load_profile()
    elif profile is False:
        profile = None
    reports: list[ProbeReport] = []
    figures: list[Figure] = []
    apple: AppleChip | None = None
    if system == "Darwin":
        apple, cpu_info, reps = probe_apple(runner)
        reports += reps
    else:
        cpu_info, reps = probe_cpu(runner)
        reports += reps
    memory, reps = probe_memory()
    reports += reps
    if memory is None and apple and apple.unified_memory_bytes:
        memory = MemoryInfo(apple.unified_memory_bytes, None, source="sysctl hw.memsize")
    if cat_reason:
        reports.append(ProbeReport("catalog", False, cat_reason))

    ram = _host_device(cpu_info, memory, profile if isinstance(profile, dict) else None, cat, cpu, figures)
    gpus: list[GpuInfo] = []
    if apple is not None:
        chip_gpu = GpuInfo(name=f"{apple.chip} ({apple.gpu_cores}-core GPU)" if apple.gpu_cores else (apple.chip or "Apple GPU"),
                           vendor="Apple", memory_total_bytes=apple.unified_memory_bytes, gpu_cores=apple.gpu_cores,
                           source="sysctl + system_profiler")
        gpus.append(chip_gpu)
    else:
        found, reps = probe_nvidia(runner, nvml)
        gpus += found
        reports += reps
        found, reps = probe_rocm(runner)
        gpus += found
        reports += reps
    devices: list[Device] = []
    unmatched: list[str] = []
    for i, g in enumerate(gpus):
        dev = _gpu_device(g, cat, gpu if i == 0 else None, cat_reason, figures)
        if dev is None:
            unmatched.append(g.name)
        else:
            devices.append(dev)
    if not gpus:
        figures.append(Figure("GPU", "none", "read: " + "; ".join(f"{r.probe}: {r.detail}" for r in reports
                                                                   if r.probe in ("nvml", "nvidia-smi -q -x", "rocm-smi"))))
        if gpu is not None:  # forced with none detected: this machine as if it had that card
            if gpu not in cat or cat[gpu].is_cpu:
                raise UnknownNameError("GPU", gpu, [n for n, d in cat.items() if not d.is_cpu])
            devices.append(cat[gpu])
            figures.append(Figure("GPU 0 (forced)", cat[gpu].name, f"catalog: {gpu} (forced; no GPU was detected)"))
    pcie = 0.0
    first = gpus[0] if gpus else None
    if devices and apple is None and first is None:  # the forced GPU: a PCIe 4.0 x16 slot assumed
        pcie = PCIE_ASSUMED_GBS
        figures.append(Figure("PCIe host link", f"{pcie:.1f} GB/s per direction (gen 4 x16)", "unknown: assumed for the forced GPU"))
    if devices and apple is None and first is not None:
        link = pcie_gbs(first.pcie_gen_max, first.pcie_width_max)
        if link is not None:
            pcie = link
            figures.append(Figure("PCIe host link", f"{pcie:.1f} GB/s per direction", f"read: {first.source} (gen x width)"))
        else:
            pcie = PCIE_ASSUMED_GBS
            figures.append(Figure("PCIe host link", f"{pcie:.1f} GB/s per direction (gen 4 x16)", "unknown: assumed; the GPU tool gave no link figures"))
    unified = apple is not None and bool(devices)
    if unified:
        ram = replace(ram, memory_gb=devices[0].memory_gb)
    host = platform.node() or "this machine"
    machine = Machine(
        name="local", gpu=devices[0] if devices else None, ram=ram, pcie_gbs=pcie, extra_gpus=tuple(devices[1:]),
        unified=unified, source=f"detected on {host} ({system}, Python {sys.version_info.major}.{sys.version_info.minor})",
        notes="; ".join(f"{n}: no figures, left out" for n in unmatched),
    )
    return Detection(machine, cpu_info, memory, tuple(gpus), apple, tuple(figures), tuple(reports), tuple(unmatched))


def detect_machine(*, gpu: str | None = None, cpu: str | None = None, profile: dict | None | bool = True) -> Machine:
    """The Machine this code runs on (``--on local``): probed, catalog figures for known GPUs, the
    calibration profile's figures for the host when ``inferlab calibrate`` has been run."""
    return inspect_machine(gpu=gpu, cpu=cpu, profile=profile).machine



def machine_from_name(name: str) -> Machine:
    """``--on NAME``: "local" is this computer (detect_machine); any other name a catalog machine."""
    if name == "local":
        return detect_machine()
    from .catalog import MACHINES

    return MACHINES[name]  # unknown keys raise UnknownNameError with close matches

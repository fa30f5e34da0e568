"""Apple silicon: chip, unified memory, CPU clusters (sysctl) and GPU cores (system_profiler)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import GpuInfo, ProbeReport, Runner, ToolUnavailable, run_tool
from .cpu import CpuInfo, features_from_flags

SYSCTL_KEYS = ("machdep.cpu.brand_string", "hw.memsize", "hw.physicalcpu", "hw.logicalcpu",
               "hw.perflevel0.physicalcpu", "hw.perflevel1.physicalcpu", "hw.optional.arm64",
               "hw.optional.neon", "hw.optional.arm.FEAT_DotProd", "hw.optional.arm.FEAT_I8MM",
               "hw.optional.arm.FEAT_BF16", "hw.optional.avx2_0", "hw.optional.avx512f")


@dataclass(frozen=True)
class AppleChip:
    chip: str | None  # "Apple M2 Max"
    unified_memory_bytes: int | None
    performance_cores: int | None
    efficiency_cores: int | None
    gpu_cores: int | None


def parse_sysctl(text: str) -> dict[str, str]:
    """'key: value' lines of ``sysctl`` (any subset of keys; 'unknown oid' lines are skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key and " " not in key:
            out[key] = value.strip()
    return out


def cpu_from_sysctl(values: dict[str, str]) -> CpuInfo:
    def num(key: str) -> int | None:
        v = values.get(key, "")
        return int(v) if v.isdigit() else None

    perf, eff = num("hw.perflevel0.physicalcpu"), num("hw.perflevel1.physicalcpu")
    physical = num("hw.physicalcpu") or ((perf or 0) + (eff or 0) or None)
    flags = {k for k, v in values.items() if k.startswith("hw.optional") and v == "1"}
    brand = values.get("machdep.cpu.brand_string", "")
    arm = "hw.optional.arm64" in flags or brand.startswith("Apple")
    if arm:
        flags.add("hw.optional.neon")  # every arm64 core has Advanced SIMD
    x86 = not arm and ("Intel" in brand or "hw.optional.avx2_0" in values)
    return CpuInfo(
        model=brand or "unknown",
        vendor="Apple" if arm else ("Intel" if x86 else ""),
        arch="arm64" if arm else ("x86_64" if x86 else ""),
        physical_cores=physical,
        logical_cores=num("hw.logicalcpu") or num("hw.ncpu") or physical,
        features=features_from_flags(flags),
        source="sysctl",
    )


def parse_system_profiler_displays(text: str) -> list[GpuInfo]:
    """``system_profiler SPDisplaysDataType`` (text): one entry per 'Chipset Model'."""
    gpus: list[GpuInfo] = []
    for block in re.split(r"(?=^\s*Chipset Model:)", text, flags=re.M):
        m = re.search(r"Chipset Model:\s*(.+)", block)
        if not m:
            continue
        cores = re.search(r"Total Number of Cores:\s*(\d+)", block)
        vendor = "Apple" if m.group(1).startswith("Apple") else ("AMD" if "AMD" in m.group(1) or "Radeon" in m.group(1) else "Intel")
        gpus.append(GpuInfo(name=m.group(1).strip(), vendor=vendor, index=len(gpus),
                            gpu_cores=int(cores.group(1)) if cores else None, source="system_profiler"))
    return gpus


def apple_chip(sysctl: dict[str, str], displays: list[GpuInfo]) -> AppleChip:
    gpu = next((g for g in displays if g.vendor == "Apple"), None)
    mem = sysctl.get("hw.memsize", "")

    def num(key: str) -> int | None:
        v = sysctl.get(key, "")
        return int(v) if v.isdigit() else None

    chip = sysctl.get("machdep.cpu.brand_string") or (gpu.name if gpu else None)
    return AppleChip(chip=chip, unified_memory_bytes=int(mem) if mem.isdigit() else None,
                     performance_cores=num("hw.perflevel0.physicalcpu"), efficiency_cores=num("hw.perflevel1.physicalcpu"),
                     gpu_cores=gpu.gpu_cores if gpu else None)


def probe_apple(runner: Runner = run_tool) -> tuple[AppleChip | None, CpuInfo | None, list[ProbeReport]]:
    reports: list[ProbeReport] = []
    try:
        values = parse_sysctl(runner(["sysctl", *SYSCTL_KEYS]))
        reports.append(ProbeReport("sysctl", True, values.get("machdep.cpu.brand_string", "no brand string")))
    except ToolUnavailable as exc:
        reports.append(ProbeReport("sysctl", False, str(exc)))
        return None, None, reports
    try:
        displays = parse_system_profiler_displays(runner(["system_profiler", "SPDisplaysDataType"]))
        reports.append(ProbeReport("system_profiler", True, ", ".join(f"{g.name} ({g.gpu_cores} GPU cores)" for g in displays) or "no GPU listed"))
    except ToolUnavailable as exc:
        displays = []
        reports.append(ProbeReport("system_profiler", False, str(exc)))
    chip = apple_chip(values, displays)
    return (chip if chip.chip and chip.chip.startswith("Apple") else None), cpu_from_sysctl(values), reports

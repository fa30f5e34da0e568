"""System RAM: total and available, from psutil, else /proc/meminfo (bytes, binary kB there)."""

from __future__ import annotations

from dataclasses import dataclass

from . import ProbeReport, ToolUnavailable, read_file


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    available_bytes: int | None  # what new allocations can get without swapping
    source: str = ""


def parse_proc_meminfo(text: str) -> MemoryInfo:
    """MemTotal and MemAvailable (kernel >= 3.14) from /proc/meminfo; 'kB' there means KiB."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    if "MemTotal" not in values:
        raise ToolUnavailable("/proc/meminfo has no MemTotal line")
    return MemoryInfo(values["MemTotal"], values.get("MemAvailable"), source="/proc/meminfo")


def probe_memory(meminfo_path: str = "/proc/meminfo") -> tuple[MemoryInfo | None, list[ProbeReport]]:
    reports: list[ProbeReport] = []
    try:
        import psutil  # the 'machine' extra
    except ImportError:
        reports.append(ProbeReport("psutil", False, "psutil is not installed (pip install 'inferlab[machine]')"))
    else:
        vm = psutil.virtual_memory()
        reports.append(ProbeReport("psutil", True, f"{vm.total / 2**30:.1f} GiB total, {vm.available / 2**30:.1f} GiB available"))
        return MemoryInfo(int(vm.total), int(vm.available), source="psutil"), reports
    try:
        info = parse_proc_meminfo(read_file(meminfo_path))
        reports.append(ProbeReport("/proc/meminfo", True, f"{info.total_bytes / 2**30:.1f} GiB total"))
        return info, reports
    except ToolUnavailable as exc:
        reports.append(ProbeReport("/proc/meminfo", False, str(exc)))
    return None, reports

"""Probes: read what the operating system and vendor tools say about this computer.

Each probe module has pure parsers (text in, records out; tested with recorded tool outputs)
and one ``probe_*`` function that runs the tool. A probe never raises on a missing or broken
tool: it returns ``ProbeReport(ok=False, detail=<why>)`` and the figure stays unknown.

Tools are run through a *runner* (argv -> stdout text, raising ToolUnavailable), so tests
replay recorded outputs through the same code path as a real run.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIB = 2**20

Runner = Callable[[Sequence[str]], str]


class ToolUnavailable(Exception):
    """A tool or library could not be asked: missing, failed, timed out. The message says why."""


@dataclass(frozen=True)
class ProbeReport:
    """What one probe found, or why it found nothing."""

    probe: str  # the tool or library asked: "lscpu", "nvml", "nvidia-smi", "psutil"...
    ok: bool
    detail: str  # what was read, or the reason the figures stay unknown


@dataclass(frozen=True)
class GpuInfo:
    """One accelerator as its vendor tool describes it."""

    name: str
    vendor: str  # "NVIDIA", "AMD", "Apple"
    index: int = 0
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    pcie_gen_max: int | None = None  # PCIe generation the link can run at (host and device)
    pcie_width_max: int | None = None  # lanes
    pcie_gen_current: int | None = None  # idle GPUs drop to gen 1: the max is what transfers get
    pcie_width_current: int | None = None
    gpu_cores: int | None = None  # Apple: GPU cores
    source: str = ""  # the tool whose output this came from


def run_tool(argv: Sequence[str], timeout_s: float = 10.0) -> str:
    """Run a tool and return its stdout; raise ToolUnavailable with the reason otherwise."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise ToolUnavailable(f"{argv[0]} is not installed (not on PATH)")
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ToolUnavailable(f"{' '.join(argv)} did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise ToolUnavailable(f"{argv[0]} could not be run: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ToolUnavailable(f"{' '.join(argv)} exited with {done.returncode}: {said[0] if said else 'no message'}")
    return done.stdout


def read_file(path: str) -> str:
    """Read a text file (procfs); raise ToolUnavailable with the reason otherwise."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        raise ToolUnavailable(f"cannot read {path}: {exc.strerror or exc}") from None


def parse_size_bytes(text: str) -> int | None:
    """'23034 MiB' -> bytes; '32 MiB (1 instance)' -> bytes; 'N/A' -> None. Units are binary
    (KiB/MiB/GiB, and nvidia-smi's 'MiB'); bare 'KB'/'MB' in procfs and lscpu also mean 2^10/2^20."""
    parts = text.replace("(", " ").split()
    if not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    unit = parts[1].lower() if len(parts) > 1 else "b"
    scale = {"b": 1, "kib": 2**10, "kb": 2**10, "k": 2**10, "mib": 2**20, "mb": 2**20, "m": 2**20,
             "gib": 2**30, "gb": 2**30, "g": 2**30, "tib": 2**40, "tb": 2**40}.get(unit)
    return int(value * scale) if scale else None


# PCIe payload rate per lane and direction, GB/s: transfer rate x line-code efficiency / 8 bits.
# Gen 1-2 use 8b/10b, gen 3-5 128b/130b, gen 6 FLIT mode (242/256). Source: PCI-SIG base specs.
PCIE_LANE_GBPS = {1: 2.5 * 0.8 / 8, 2: 5.0 * 0.8 / 8, 3: 8.0 * 128 / 130 / 8, 4: 16.0 * 128 / 130 / 8,
                  5: 32.0 * 128 / 130 / 8, 6: 64.0 * 242 / 256 / 8}


def pcie_gbs(gen: int | None, width: int | None) -> float | None:
    """One direction's payload bandwidth of a PCIe link, GB/s; None when gen or width is unknown."""
    if gen is None or width is None or gen not in PCIE_LANE_GBPS:
        return None
    return PCIE_LANE_GBPS[gen] * width

"""``machine() -> MachineReport``: this computer as inferlab sees it, each figure with its origin."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..hardware.device import Machine
from .report import Report


@dataclass(frozen=True)
class MachineFigure:
    what: str
    value: str
    origin: str  # "read: psutil", "catalog: RTX 4090", "calibrated: <profile> (date)", "estimated: ..."


@dataclass(frozen=True)
class MachineReport(Report):
    machine: Machine
    cpu: Any
    gpus: tuple[Any, ...]
    figures: tuple[MachineFigure, ...]
    probes: tuple[Any, ...]
    unmatched_gpus: tuple[str, ...]


def machine(*, gpu: str | None = None, cpu: str | None = None, profile: bool = True) -> MachineReport:
    """Detect this computer: the Machine the performance model uses for ``--on local``, and where
    each figure came from (read from the OS, catalog, calibrated, estimated). ``gpu``/``cpu``:
    catalog keys whose figures replace the detected ones."""
    from ..hardware.detect import inspect_machine

    d = inspect_machine(gpu=gpu, cpu=cpu, profile=profile)
    return MachineReport(machine=d.machine, cpu=d.cpu, gpus=tuple(d.gpus),
                         figures=tuple(MachineFigure(f.what, f.value, f.origin) for f in d.figures),
                         probes=tuple(d.probes), unmatched_gpus=tuple(d.unmatched_gpus))

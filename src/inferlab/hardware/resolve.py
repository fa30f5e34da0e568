"""The project's one machine resolver: ``resolve_machine(x)`` for every face and library call."""

from __future__ import annotations

from ..errors import InvalidValueError
from .device import Machine

LOCAL = "local"  # this computer: detected, with its calibration profile when one exists


def resolve_machine(machine: Machine | str, *, lesson_figures: bool = False, profile: bool | dict = True) -> Machine:
    """A Machine as given; a catalog key (vendor figures, or the seed lesson's own approximations
    with ``lesson_figures``); or "local" for this computer (``profile=False`` ignores the
    calibration profile)."""
    if isinstance(machine, Machine):
        return machine
    if not isinstance(machine, str):
        raise InvalidValueError(f"machine must be a Machine or a machine name (a catalog key such as 'rtx4090', or "
                                f"'local'), got {type(machine).__name__} {machine!r:.80}")
    if machine.strip().lower() == LOCAL:  # as the catalog keys, case does not matter ('Local', 'LOCAL')
        from .detect import detect_machine

        return detect_machine(profile=profile)
    from .catalog import LESSON_MACHINES, MACHINES

    return (LESSON_MACHINES if lesson_figures else MACHINES)[machine]  # unknown keys raise UnknownNameError with close matches

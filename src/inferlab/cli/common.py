"""Helpers every command shares: resolving a model source and a machine, JSON output, bars."""

from __future__ import annotations

import json
import click

from ..errors import UnknownNameError


def resolve_model(source: str):
    """A catalog id, or a file/folder/HF id through models.resolve when that module exists."""
    from ..models.catalog import MODELS

    if source in MODELS or source.lower() in {k.lower() for k in MODELS}:
        return MODELS[source]
    try:
        from ..models.resolve import load_model
    except ImportError:
        raise UnknownNameError("model", source, MODELS) from None
    return load_model(source)


def resolve_machine(name: str, lesson: bool = False):
    """A catalog machine key, or "local" for this computer; lesson=True takes the lesson's
    variants of the catalog devices (perf_model.MACHINES)."""
    from ..hardware.catalog import load_machines
    from ..hardware.detect import machine_from_name

    return load_machines(lesson=True)[name] if lesson and name != "local" else machine_from_name(name)


def echo_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=_default))


def _default(o):
    if hasattr(o, "__dataclass_fields__"):
        return {k: getattr(o, k) for k in o.__dataclass_fields__ if k not in ("tensors", "extra")}
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def bar(used: float, total: float, width: int = 28) -> str:
    frac = 0.0 if total <= 0 else used / total
    n = min(width, round(frac * width))
    return "█" * n + "░" * (width - n) + ("▲" if frac > 1 else "")

"""Helpers every command shares: resolving a model source and a machine, JSON output, bars."""

from __future__ import annotations

import json
import click



def resolve_model(source: str):
    """The one model resolver (models.resolve.resolve_model)."""
    from ..models.resolve import resolve_model as resolve

    return resolve(source)


def resolve_machine(name: str, lesson: bool = False):
    """The one machine resolver (hardware.resolve.resolve_machine); lesson=True takes the lesson's
    variants of the catalog devices."""
    from ..hardware.resolve import resolve_machine as resolve

    return resolve(name, lesson_figures=lesson)


_CONTROL = {c: None for c in range(32) if c not in (9, 10)} | {127: None} | {c: None for c in range(0x80, 0xA0)}


def table_console():
    """A rich Console for tables: on a terminal its width; into a pipe or a file wide enough that
    no id or header is cut (shells and CI runners export COLUMNS=80 to pipes too)."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 10_000)


def strip_control(text: object) -> str:
    """Text for the terminal without rich: control characters (escape sequences) dropped, newlines
    and tabs kept (generated text streamed raw)."""
    return str(text).translate(_CONTROL)


def safe(text: object) -> str:
    """Text for the terminal: control characters (escape sequences) from a file or a model dropped,
    rich markup escaped."""
    from rich.markup import escape

    return escape(str(text).translate(_CONTROL))


def warn_ignored(ctx: click.Context, ignored: dict[str, str]) -> None:
    """One warning line on stderr for each option the user gave that does nothing in this
    configuration; ``ignored`` maps a parameter name to why it does nothing."""
    from click.core import ParameterSource

    for name, why in ignored.items():
        if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            opt = next((p for p in ctx.command.params if p.name == name), None)
            flag = max(opt.opts, key=len) if opt is not None and opt.opts else name
            click.echo(f"inferlab: warning: {flag} does nothing here: {why}", err=True)


def echo_json(obj) -> None:
    """Strict JSON on stdout: a report's to_dict(), or plain values (non-finite floats become null)."""
    from ..api.report import Report, plain

    click.echo(json.dumps(obj.to_dict() if isinstance(obj, Report) else plain(obj), indent=2, allow_nan=False))


def bar(used: float, total: float, width: int = 28) -> str:
    frac = 0.0 if total <= 0 else used / total
    n = min(width, round(frac * width))
    return "█" * n + "░" * (width - n) + ("▲" if frac > 1 else "")

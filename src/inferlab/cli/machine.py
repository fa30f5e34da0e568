"""`inferlab machine`, `inferlab calibrate`, `inferlab validate`: this computer, measured and checked."""

from __future__ import annotations

import json
import sys

import click


def _console():
    from rich.console import Console

    return Console()


@click.command("machine")
@click.option("--gpu", "gpu", metavar="KEY", help="Use this catalog GPU's figures for the first GPU (e.g. rtx4090).")
@click.option("--cpu", "cpu", metavar="KEY", help="Use this catalog host preset for the CPU and RAM (e.g. ddr5-dual).")
@click.option("--no-profile", is_flag=True, help="Ignore the calibration profile (from `inferlab calibrate`).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def machine(gpu: str | None, cpu: str | None, no_profile: bool, as_json: bool) -> None:
    """What is in this computer, and where each figure comes from (read, catalog, calibrated)."""
    from dataclasses import asdict

    from ..hardware.detect import inspect_machine

    d = inspect_machine(gpu=gpu, cpu=cpu, profile=not no_profile)
    if as_json:
        click.echo(json.dumps({"machine": asdict(d.machine), "cpu": asdict(d.cpu) if d.cpu else None,
                               "gpus": [asdict(g) for g in d.gpus],
                               "figures": [asdict(f) for f in d.figures], "probes": [asdict(p) for p in d.probes],
                               "unmatched_gpus": list(d.unmatched_gpus)}, indent=1))
        return
    from rich.table import Table

    con = _console()
    t = Table(title="This machine", title_justify="left")
    t.add_column("what")
    t.add_column("value")
    t.add_column("from")
    for f in d.figures:
        style = {"read": "green", "calibrated": "cyan", "measured": "cyan", "catalog": "yellow"}.get(f.kind, "red")
        t.add_row(f.what, f.value, f"[{style}]{f.origin}[/]")
    con.print(t)
    failed = [p for p in d.probes if not p.ok]
    if failed:
        con.print("[dim]probes that found nothing:[/]")
        for p in failed:
            con.print(f"[dim]  {p.probe}: {p.detail}[/]")
    if d.unmatched_gpus:
        con.print(f"[red]left out (no bandwidth/FLOPs figures): {', '.join(d.unmatched_gpus)}; force a catalog device with --gpu KEY[/]")


@click.command("calibrate")
@click.option("--threads", "threads", metavar="N,N", help="Thread counts for the read-bandwidth runs (default 1,2,4.. up to the cores).")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(2, 50), help="Repetitions per figure (median, spread).")
@click.option("--size-mib", type=click.IntRange(16, 65536), help="Working set in MiB (default: 4x the last-level cache, >= 256).")
@click.option("--no-save", is_flag=True, help="Measure and print, do not write the profile.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
def calibrate(threads: str | None, repeats: int, size_mib: int | None, no_save: bool, as_json: bool) -> None:
    """Measure memory bandwidth and matmul throughput here; save the machine profile `--on local` uses."""
    from ..errors import InvalidValueError
    from ..hardware import calibrate as cal

    counts = None
    if threads:
        try:
            counts = tuple(int(t) for t in threads.split(","))
        except ValueError:
            raise InvalidValueError(f"--threads {threads!r} must be comma-separated positive integers, e.g. 1,2,4") from None
        if any(c <= 0 for c in counts):
            raise InvalidValueError(f"--threads {threads!r} must be comma-separated positive integers, e.g. 1,2,4")
    steps = cal.plan(counts, size_mib * 2**20 if size_mib else None, repeats)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    con = _console() if not as_json else None
    from rich.console import Console

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=as_json) as progress:
        task = progress.add_task("calibrating", total=len(steps))

        def on_step(step, m, why):
            line = f"{step.label}: {m.median:.3g} {m.unit} (spread {m.spread:.0%})" if m else f"{step.label}: skipped ({why})"
            progress.console.print(line) if not as_json else None
            progress.update(task, advance=1, description=step.label)

        profile = cal.run_calibration(steps, on_step)
    where = None if no_save else cal.save_profile(profile)
    if as_json:
        click.echo(json.dumps(profile, indent=1))
    else:
        con.print(f"done in {profile['duration_s']:.1f} s" + (f"; profile saved to {where}" if where else " (not saved)"))
        for key, why in profile["skipped"].items():
            con.print(f"[dim]skipped {key}: {why}[/]")
    sys.stdout.flush()

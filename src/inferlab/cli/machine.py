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
    from ..api import machine as machine_api

    d = machine_api(gpu=gpu, cpu=cpu, profile=not no_profile)
    if as_json:
        click.echo(d.to_json(indent=1))
        return
    from rich.table import Table

    con = _console()
    t = Table(title="This machine", title_justify="left")
    t.add_column("what")
    t.add_column("value")
    t.add_column("from")
    for f in d.figures:
        style = {"read": "green", "calibrated": "cyan", "measured": "cyan", "catalog": "yellow"}.get(f.origin.split(":", 1)[0], "red")
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


@click.command("validate")
@click.option("--engine", type=click.Choice(["llama.cpp"]), default="llama.cpp", show_default=True, help="The engine to check against.")
@click.option("--models", default="toy-125m,toy-200m,toy-290m", show_default=True, help="Toy models to write (random weights): comma-separated.")
@click.option("--presets", default="Q4_K_M,Q8_0", show_default=True, help="llama-quantize presets to make of each.")
@click.option("--gguf", "gguf_paths", multiple=True, type=click.Path(exists=True, dir_okay=False), help="Also run this GGUF file.")
@click.option("--threads", type=click.IntRange(1, 1024), help="Threads for llama.cpp (default: the physical cores).")
@click.option("--repetitions", default=3, show_default=True, type=click.IntRange(1, 20))
@click.option("--n-prompt", default=512, show_default=True, type=click.IntRange(0, 8192))
@click.option("--n-gen", default=128, show_default=True, type=click.IntRange(0, 4096))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def validate(engine: str, models: str, presets: str, gguf_paths: tuple[str, ...], threads: int | None, repetitions: int,
             n_prompt: int, n_gen: int, as_json: bool) -> None:
    """Measured vs predicted prefill and decode tokens/s on this machine, llama-bench style."""
    from ..hardware import validate as v

    model_list = tuple(m for m in models.split(",") if m)
    preset_list = tuple(p for p in presets.split(",") if p)
    for m in model_list:
        if m not in v.TOY_MODELS:
            from ..errors import UnknownNameError

            raise UnknownNameError("toy model", m, v.TOY_MODELS)
    con = _console()
    err = __import__("rich.console", fromlist=["Console"]).Console(stderr=True)

    def on_row(r):
        if not as_json:
            err.print(f"[dim]{r.model} {r.preset}: tg{n_gen} {r.measured.tg:.1f} tok/s measured, {r.predicted_tg:.1f} predicted[/]")

    with err.status("writing models and running llama.cpp (pp%d, tg%d, %d repetitions)..." % (n_prompt, n_gen, repetitions)):
        rows = v.validate_llama_cpp(model_list, preset_list, threads, repetitions, n_prompt, n_gen, gguf_paths, on_row=on_row)
    if as_json:
        click.echo(json.dumps([{
            "model": r.model, "preset": r.preset, "n_params": r.n_params, "decode_bytes": r.decode_bytes, "threads": r.n_threads,
            "pp_measured": r.measured.pp, "pp_samples": list(r.measured.pp_tok_s), "pp_predicted": r.predicted_pp, "pp_error": r.pp_error,
            "tg_measured": r.measured.tg, "tg_samples": list(r.measured.tg_tok_s), "tg_cpu_samples": list(r.measured.tg_cpu_tok_s),
            "tg_predicted": r.predicted_tg, "tg_error": r.tg_error,
            "dominant_limit": r.limits.dominant, "memory_s": r.limits.memory_s, "compute_s": r.limits.compute_s,
            "overhead_s": r.limits.overhead_s, "eta": r.limits.eta, "bandwidth_gbs": r.limits.bandwidth_gbs,
            "perf_model_pp": r.perf_model_pp, "perf_model_tg": r.perf_model_tg, "perf_model_tg_error": r.perf_model_tg_error,
            "perf_model_note": r.perf_model_note} for r in rows], indent=1))
        return
    from rich.table import Table

    t = Table(title=f"llama.cpp on this machine vs inferlab ({rows[0].n_threads if rows else '?'} threads, median of {repetitions})",
              title_justify="left")
    for col in ("model", "preset", "MB/tok", f"pp{n_prompt}", "pred.", "err", f"tg{n_gen}", "pred.", "err", "perf_model", "limit"):
        t.add_column(col, justify="left" if col in ("model", "preset", "limit") else "right")

    def pct(e):
        return "—" if e is None else f"{e:+.0%}"

    for r in rows:
        pm = "—" if r.perf_model_tg is None else f"{r.perf_model_tg:.1f} ({pct(r.perf_model_tg_error)})"
        t.add_row(r.model, r.preset, f"{r.decode_bytes / 1e6:.0f}", f"{r.measured.pp:.1f}",
                  "—" if r.predicted_pp is None else f"{r.predicted_pp:.1f}", pct(r.pp_error),
                  f"{r.measured.tg:.1f}", f"{r.predicted_tg:.1f}", pct(r.tg_error), pm,
                  "bandwidth" if r.limits.dominant == "bandwidth" else "per-core")
    con.print(t)
    if rows:
        r = rows[0]
        con.print(f"decode: bandwidth limit = bytes / ({r.limits.eta:.2f} x {r.limits.bandwidth_gbs:.1f} GB/s measured); per-core limit = "
                  "bytes / (llama.cpp's dequantize+dot rate per core x threads, inferlab.perf.cpu_model) + overhead per layer")
        con.print("prefill: 2 FLOP per weight at the measured fp32 matmul rate x the CPU prefill efficiency (cpu_model)")
        if r.perf_model_note:
            con.print(f"[dim]perf_model: {r.perf_model_note}[/]")
        worst = max(abs(x.tg_error) for x in rows)
        con.print(f"worst decode error: {worst:.0%}: decode predictions for this machine are {'within' if worst <= 0.25 else 'outside'} 25 %")

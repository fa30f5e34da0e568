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
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(2, 50),
              help="Repetitions per figure at least; more until the two fastest agree within 5 %.")
@click.option("--size-mib", type=click.IntRange(16, 65536), help="Working set in MiB (default: 4x the last-level cache, >= 256).")
@click.option("--engine", type=click.Choice(["none", "llama.cpp"]), default="none", show_default=True,
              help="Also time this engine's own CPU kernels on pure-type toy models and fit this CPU's rates (llama.cpp: "
                   "llama-cpp-python).")
@click.option("--types", "types", metavar="T,T", help="With --engine llama.cpp: the ggml types to time (default: every type "
              "llama.cpp's quantizer makes without an importance matrix; 'quick' for F16,Q4_0,Q4_1,Q5_0,Q8_0,Q4_K,Q6_K,Q3_K,IQ4_XS,IQ2_XXS).")
@click.option("--n-gen", default=64, show_default=True, type=click.IntRange(8, 1024), help="With --engine: decode steps per run (tg).")
@click.option("--n-prompt", default=128, show_default=True, type=click.IntRange(0, 2048), help="With --engine: prompt tokens (pp; 0: none).")
@click.option("--realtime", is_flag=True, help="Time at real-time priority (root): other processes stay off the cores meanwhile.")
@click.option("--accept-noisy", is_flag=True, help="Save even when figures are unstable or the machine was busy (flagged in the profile).")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1, 10),
              help="With --engine: passes over the llama.cpp figures (each keeps the repetitions of every pass).")
@click.option("--no-probe", is_flag=True, help="With --engine: do not time the level probe (toy-wide Q4_K) around each repetition.")
@click.option("--retime", default=2, show_default=True, type=click.IntRange(0, 10),
              help="With --engine: passes that time again the figures under two of whose repetitions ran at the machine's "
                   "level (the probe slow throughout); stops early when a pass leaves as many. Then, unless 0, one pass over the "
                   "decode figures more than 8 % off the fit of the others (at most 8 per thread count).")
@click.option("--no-save", is_flag=True, help="Measure and print, do not write the profile.")
@click.option("--accept-rejected", is_flag=True,
              help="Measure nothing: save the figures of the last run refused as noisy (kept beside the profile) as the profile, flagged.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
def calibrate(threads: str | None, repeats: int, size_mib: int | None, engine: str, types: str | None, n_gen: int, n_prompt: int,
              realtime: bool, accept_noisy: bool, rounds: int, no_probe: bool, retime: int, no_save: bool, accept_rejected: bool,
              as_json: bool) -> None:
    """Measure memory bandwidth and matmul throughput here (and llama.cpp's kernels with --engine);
    save the machine profile `--on local` uses. Figures are the best sustained repetition; a
    profile whose figures disagree across repetitions or were measured on a busy machine is not saved."""
    from ..errors import InvalidValueError
    from ..hardware import calibrate as cal

    if accept_rejected:
        if no_save:
            raise InvalidValueError("--accept-rejected saves a profile; it cannot go with --no-save")
        from ..api import accept_rejected as accept_api

        report = accept_api()
        if as_json:
            click.echo(json.dumps(report.profile, indent=1))
        else:
            _console().print(f"profile {report.profile_id} saved to {report.saved_to}, flagged with {len(report.problems)} problem(s): "
                             + "; ".join(report.problems[:3]) + (" ..." if len(report.problems) > 3 else ""))
        return
    counts = None
    if threads:
        try:
            counts = tuple(int(t) for t in threads.split(","))
        except ValueError:
            raise InvalidValueError(f"--threads {threads!r} must be comma-separated positive integers, e.g. 1,2,4") from None
        if any(c <= 0 for c in counts):
            raise InvalidValueError(f"--threads {threads!r} must be comma-separated positive integers, e.g. 1,2,4")
    if types and engine == "none":
        raise InvalidValueError("--types needs --engine llama.cpp")
    from ..api import calibrate as calibrate_api

    type_list = None
    if engine == "llama.cpp" and types:
        type_list = cal.QUICK_TYPES if types == "quick" else tuple(t.strip().upper() for t in types.split(",") if t.strip())
    n_steps = len(cal.plan(counts, size_mib * 2**20 if size_mib else None, repeats))
    if engine == "llama.cpp":
        n_steps += len(cal.llama_cpp_plan(type_list or tuple(cal.LLAMA_CPP_TYPES), n_gen=n_gen, n_prompt=n_prompt, repeats=3, rt=realtime,
                                          rounds=rounds))
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=as_json) as progress:
        task = progress.add_task("calibrating", total=n_steps)

        def on_step(step, m, why):
            if m:
                flag = "" if m.stable() and not (m.interference and m.interference.problems) else " [yellow](flagged)[/]"
                line = f"{step.label}: {m.best:.3g} {m.unit} best (median {m.median:.3g}, {len(m.samples)} runs){flag}"
            else:
                line = f"{step.label}: skipped ({why})"
            progress.console.print(line) if not as_json else None
            if getattr(step, "again", False):  # timed again beyond the plan (--retime)
                progress.update(task, total=(progress.tasks[0].total or n_steps) + 1)
            progress.update(task, advance=1, description=step.label)

        report = calibrate_api(threads=counts, repeats=repeats, size_mib=size_mib, engine=engine, types=type_list, n_gen=n_gen,
                               n_prompt=n_prompt, realtime=realtime, accept_noisy=accept_noisy, save=not no_save, on_step=on_step,
                               rounds=rounds, probe=not no_probe, retime=retime)
    profile, where = report.profile, report.saved_to
    if as_json:
        click.echo(json.dumps(profile, indent=1))
    else:
        con = _console()
        con.print(f"done in {profile['duration_s']:.1f} s" + (f"; profile {cal.profile_id(profile)} saved to {where}" if where else " (not saved)"))
        ref = (profile.get("llama_cpp") or {}).get("reference")
        if ref:
            con.print(f"llama.cpp on this CPU: overhead {ref['overhead_s_per_layer'] * 1e6:.0f} us/layer; per core " + ", ".join(
                f"{ty} {r / 1e9:.1f}" for ty, r in sorted(ref["per_core_bytes_per_s"].items())) + " GB/s; fit residual "
                + ", ".join(f"{t} thread(s) {v:.0%}" for t, v in ref["max_rel_residual_by_threads"].items()))
            stall = {t: v for t, v in (ref.get("dram_stall_s_per_byte_by_threads") or {}).items() if v}
            ramp, ladder = ref.get("dram_ramp_bytes"), (ref.get("cache_ladder") or {}).get("ladder_bytes") or []
            past = (f"past {ramp[0] / 1e6:.0f}-{ramp[1] / 1e6:.0f} MB of weights (the cache ladder)" if ramp
                     else f"past lscpu's L3 ({ref['l3_bytes'] / 2**20:.0f} MiB)" if ref.get("l3_bytes") else "")
            if stall:
                con.print(f"DRAM stall {past}: " + ", ".join(f"{t} thread(s) {v * 1e12:.1f} ps/byte" for t, v in stall.items()))
                for t, own in (ref.get("dram_stall_s_per_byte_by_type_by_threads") or {}).items():
                    con.print(f"  a stall of their own ({t} thread(s), runs in and past the cache): "
                              + ", ".join(f"{ty} {v * 1e12:.1f}" for ty, v in sorted(own.items())) + " ps/byte")
            if ramp and ref.get("dram_ramp_shift_bytes_per_layer"):
                con.print(f"a deeper model leaves the cache sooner: the ramp starts {ref['dram_ramp_shift_bytes_per_layer'] / 1e6:.2f} MB "
                          "lower for each layer it has beyond the ladder's toy of its size (fitted on toy-thin and toy-wide)")
            chunk = {t: v for t, v in (ref.get("dram_chunk_s_by_threads") or {}).items() if v}
            if chunk:
                con.print("a chunk of rows a thread starts in DRAM (its next chunk not where the last ended): "
                          + ", ".join(f"{t} thread(s) {v * 1e6:.2f} us" for t, v in chunk.items()))
            if not ramp and len(ladder) >= 4:
                con.print(f"[yellow]no step up on the cache ladder ({ladder[0] / 1e6:.0f}-{ladder[-1] / 1e6:.0f} MB): decode of "
                          f"models past {ladder[-1] / 1e6:.0f} MB is not verified on this machine[/]")
            for t, names in (ref.get("left_out_memory_bound_by_threads") or {}).items():
                con.print(f"[dim]left out of the {t}-thread kernel fit as memory-bound: {', '.join(names)}[/]")
        for why in profile["problems"]:
            con.print(f"[yellow]flagged: {why}[/]")
        for key, why in profile["skipped"].items():
            con.print(f"[dim]skipped {key}: {why}[/]")
    sys.stdout.flush()


@click.command("validate")
@click.option("--engine", type=click.Choice(["llama.cpp"]), default="llama.cpp", show_default=True, help="The engine to check against.")
@click.option("--models", default="toy-125m,toy-smol,toy-200m,toy-290m", show_default=True,
              help="Toy models to write (random weights): comma-separated (calibrate fits on toy-thin and toy-wide).")
@click.option("--presets", default="Q4_K_M,Q8_0", show_default=True, help="llama-quantize presets to make of each.")
@click.option("--gguf", "gguf_paths", multiple=True, type=click.Path(exists=True, dir_okay=False), help="Also run this GGUF file.")
@click.option("--threads", type=click.IntRange(1, 1024), help="Threads for llama.cpp (default: the physical cores).")
@click.option("--repetitions", default=3, show_default=True, type=click.IntRange(1, 20))
@click.option("--n-prompt", default=512, show_default=True, type=click.IntRange(0, 8192))
@click.option("--n-gen", default=128, show_default=True, type=click.IntRange(0, 4096))
@click.option("--realtime", is_flag=True, help="Time at real-time priority (root): other processes stay off the cores meanwhile.")
@click.option("--no-profile", is_flag=True, help="Ignore the machine profile: predict with the stored reference of this ISA class.")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1, 10), help="Passes over the models (repetitions of every pass kept).")
@click.option("--no-probe", is_flag=True, help="Do not time the level probe (toy-wide Q4_K) around each repetition; score against the fastest one.")
@click.option("--state", is_flag=True, help="Also time the state probes (toy-mini Q4_0, toy-wide-2, -10 and -24 Q4_K) around each decode "
              "repetition and score decode at the machine's state they give (where calibrate measured a cache ramp).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def validate(engine: str, models: str, presets: str, gguf_paths: tuple[str, ...], threads: int | None, repetitions: int,
             n_prompt: int, n_gen: int, realtime: bool, no_profile: bool, rounds: int, no_probe: bool, state: bool,
             as_json: bool) -> None:
    """Measured vs predicted prefill and decode tokens/s on this machine, llama-bench style. Each
    repetition runs between two runs of a level probe (a model the rates were fitted on), and a row
    is scored on its speed relative to the probe around each repetition, carried to the probe's
    calibrated speed ("vs probe"); the fastest repetition is shown and scored against too ("vs
    best"). With --state, where calibrate measured a cache ramp, four state probes run around each
    decode repetition too (in the cache, on the ramp, past it) and decode is scored at the machine's
    state they and the level probe give ("at state": how slow the kernels ran, where the cache ended,
    the DRAM stall), "vs probe" shown beside it. Rows whose repetitions disagree, or whose probe never reached 90 % of its calibrated
    speed, are flagged."""
    from ..api import validate as validate_api

    model_list = tuple(m for m in models.split(",") if m)
    preset_list = tuple(p for p in presets.split(",") if p)
    con = _console()
    err = __import__("rich.console", fromlist=["Console"]).Console(stderr=True)

    def on_row(r):
        if not as_json:
            err.print(f"[dim]{r.model} {r.preset}: tg{n_gen} {r.measured.best('tg'):.1f} tok/s measured, {r.predicted_tg:.1f} predicted[/]")

    with err.status("writing models and running llama.cpp (pp%d, tg%d, %d repetitions)..." % (n_prompt, n_gen, repetitions)):
        report = validate_api(models=model_list, presets=preset_list, gguf_paths=gguf_paths, threads=threads, repetitions=repetitions,
                              n_prompt=n_prompt, n_gen=n_gen, realtime=realtime, profile=not no_profile, on_row=on_row,
                              rounds=rounds, probe=not no_probe, state=state)
    if state and not any(r.tg_states for r in report.rows):
        err.print("[yellow]--state: no state probes ran: they need the level probe and a profile whose `inferlab calibrate --engine "
                  "llama.cpp` measured a cache ramp and timed the ladder and toy-mini Q4_0 at these threads (calibrations since 2026-12-06)[/]")
    if as_json:
        click.echo(json.dumps(report.to_dict()["rows"], indent=1, allow_nan=False))
        return
    rows = report._rows  # the measurement records behind the report's rows (samples, limits)
    from rich.console import Console
    from rich.table import Table

    con = Console(width=200) if not con.is_terminal else con  # piped: whole ids and columns, no wrapping at 80
    t = Table(title=f"llama.cpp on this machine vs inferlab ({rows[0].n_threads if rows else '?'} threads, best of {repetitions})",
              title_justify="left")
    probed = any(r.matched_error("tg") is not None or r.matched_error("pp") is not None for r in rows)
    stated = any(r.state_error() is not None for r in rows if r.measured.tg_tok_s)
    cols = ["model", "preset", "MB/tok", f"pp{n_prompt}", "pred.", "vs best"] + (["vs probe"] if probed else []) \
        + [f"tg{n_gen}", "pred.", "vs best"] + (["vs probe", "level"] if probed else []) \
        + (["at state", "cache"] if stated else []) + ["perf_model", "limit", "flag"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("model", "preset", "limit", "flag") else "right", no_wrap=col == "model")

    def pct(e, shaky=False):
        return "—" if e is None else f"{e:+.0%}" + ("?" if shaky else "")

    for r in rows:
        pm = "—" if r.perf_model_tg is None else f"{r.perf_model_tg:.1f} ({pct(r.perf_model_tg_error)})"
        has_pp, has_tg = bool(r.measured.pp_tok_s), bool(r.measured.tg_tok_s)
        cells = [r.model, r.preset, f"{r.decode_bytes / 1e6:.0f}", f"{r.measured.best('pp'):.1f}" if has_pp else "—",
                 "—" if r.predicted_pp is None else f"{r.predicted_pp:.1f}", pct(r.pp_error, r.unstable("pp"))]
        cells += [pct(r.matched_error("pp") if has_pp else None)] if probed else []
        cells += [f"{r.measured.best('tg'):.1f}" if has_tg else "—", f"{r.predicted_tg:.1f}", pct(r.tg_error if has_tg else None, r.unstable("tg"))]
        lv = r.level("tg")
        cells += [pct(r.matched_error("tg") if has_tg else None), "—" if lv is None else f"{lv:.2f}"] if probed else []
        cs = r.cache_scale()
        cells += [pct(r.state_error() if has_tg else None), "—" if cs is None else f"{cs:.2f}x"] if stated else []
        cells += [pm, "bandwidth" if r.limits.dominant == "bandwidth" else "per-core", "; ".join(r.flags) or ""]
        t.add_row(*cells)
    con.print(t)
    if rows:
        r = rows[0]
        con.print(f"CPU rates: {r.rates}")
        con.print(f"decode: bandwidth limit = bytes / ({r.limits.eta:.2f} x {r.limits.bandwidth_gbs:.1f} GB/s); per-core limit = "
                  "bytes / (llama.cpp's dequantize+dot rate per core x threads, inferlab.perf.cpu_model) + overhead per layer")
        con.print("prefill: 2 FLOP per block weight per token at each type's share of the fp32 peak (cpu_model)")
        if r.perf_model_note:
            con.print(f"[dim]perf_model: {r.perf_model_note}[/]")
        if probed:
            con.print("vs probe: predicted / (the probe's speed at calibrate x the median of this model's speed / the probe's around "
                      "each repetition) - 1 (level = the probe's decode speed here / at calibrate; its prediction where the rates have "
                      "no calibrate figure)")
        if stated:
            con.print("at state: decode predicted at the machine's state around each repetition (the level probe and the state probes "
                      "toy-mini Q4_0, toy-wide-2/-10/-24 Q4_K against their calibrate speeds: the kernels' slowdown, the cache ramp's scale, the DRAM "
                      "stall's) over that repetition's speed, median - 1; cache = the ramp's scale (1.00x: where calibrate saw it); "
                      "decode is scored at state where it is given")
        scored = [abs(e) for x in rows for e, m in ((x.scored_error("tg") if x.measured.tg_tok_s else None, "tg"),
                                                     (x.scored_error("pp") if x.measured.pp_tok_s else None, "pp"))
                  if e is not None and (probed or not x.unstable(m))]
        flagged = 0 if probed else sum(x.unstable(m) for x in rows for m in ("pp", "tg") if x.measured.samples(m))
        if scored:
            worst = max(scored)
            how = ("decode at state, prefill vs probe" if stated else "vs probe") if probed else "vs best"
            con.print(f"worst error ({how}) over {len(scored)} figures: {worst:.0%} "
                      f"({'within' if worst <= 0.15 else 'outside'} 15 %); {sum(e <= 0.15 for e in scored)} of {len(scored)} within 15 %"
                      + (f"; {flagged} figure(s) flagged: their repetitions disagree, so they are not scored" if flagged else ""))
        elif flagged:
            con.print(f"[yellow]every figure is flagged ({flagged}): the repetitions disagree; run again on a quiet machine or with --realtime[/]")

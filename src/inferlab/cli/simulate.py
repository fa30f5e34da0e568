"""``inferlab simulate``: a workload or a real trace through llama.cpp's, vLLM's and SGLang's KV managers."""

from __future__ import annotations

import sys
import time

import click

from ..errors import InvalidValueError, MissingDependencyError, UnknownNameError

ENGINE_NAMES = ("llamacpp", "vllm", "sglang")
LONG_TRACE_REQUESTS = 500  # show progress on stderr from this many requests


def _requests(workload, trace, limit, arrivals, rate, seed):
    from ..kv.traces import load_trace, retime
    from ..kv.workloads import WORKLOADS

    if (workload is None) == (trace is None):
        raise InvalidValueError("give exactly one of --workload NAME or --trace FILE")
    reqs = WORKLOADS[workload]() if workload else load_trace(trace, limit=limit)
    if workload and limit:
        reqs = reqs[:limit]
    if arrivals != "trace":
        reqs = retime(reqs, arrivals, rate=rate, seed=seed)
    return reqs


def _fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}{unit}" if abs(v) < 1000 else f"{v:,.0f}{unit}"
    if isinstance(v, int):
        return f"{v:,}{unit}"
    return str(v)


def _table(runs, title):
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    t.add_column("")
    for e in runs:
        t.add_column(e, justify="right")
    any_s = next(iter(runs.values())).summary
    u = " s" if any_s["time_unit"] == "s" else " steps"
    rows = [
        ("KV pool (tokens)", lambda s: _fmt(s["kv_capacity_tokens"])),
        ("requests finished / rejected", lambda s: f"{s['finished']:,} / {s['rejected']:,}"),
        ("prompt tokens", lambda s: _fmt(s["prompt_tokens"])),
        ("prefill computed", lambda s: _fmt(s["prefill_computed"])),
        ("prefill saved", lambda s: f"{s['prefill_saved_frac']:.1%}"),
        ("engine hit rate", lambda s: "-" if s["hit_rate"] is None else f"{s['hit_rate']:.1%} ({s['hit_rate_name']})"),
        ("recomputed (preemption)", lambda s: _fmt(s["recomputed_tokens"])),
        ("preemptions", lambda s: _fmt(s["preemptions"])),
        ("peak concurrency", lambda s: _fmt(s["peak_concurrency"])),
        ("KV peak / mean (tokens)", lambda s: f"{s['kv_peak_tokens']:,} / {s['kv_mean_tokens']:,.0f}"),
        ("TTFT p50 / p99", lambda s: f"{_fmt(s['ttft']['p50'])} / {_fmt(s['ttft']['p99'])}{u}"),
        ("TPOT p50", lambda s: _fmt(s["tpot"]["p50"], u)),
        ("end-to-end p50 / p90 / p99", lambda s: " / ".join(_fmt(s["e2e"][k]) for k in ("p50", "p90", "p99")) + u),
        ("output tokens per" + (" s" if u == " s" else " step"), lambda s: _fmt(s["throughput_tok_per_unit"])),
        ("steps", lambda s: _fmt(s["steps"])),
    ]
    for name, f in rows:
        t.add_row(name, *(f(r.summary) for r in runs.values()))
    Console().print(t)


PLOT_SUFFIXES = (".png", ".svg")


def plot_timeline(runs, path) -> None:
    """KV use, running and waiting requests over time, one line per engine, as a PNG or SVG
    (written atomically)."""
    from ..fileio import atomic_write
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("matplotlib", "--plot", extra="plot") from exc
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for i, (name, run) in enumerate(runs.items()):
        color = f"C{i}"
        tl = run.timeline
        n = len(tl["t"])
        stride = max(1, n // 4000)
        t = tl["t"][::stride]
        kv = [a + b for a, b in zip(tl["kv_used_tokens"][::stride], tl["kv_cached_tokens"][::stride])]
        axes[0].plot(t, tl["kv_used_tokens"][::stride], color=color, label=f"{name} in use")
        axes[0].plot(t, kv, color=color, linestyle=":", label=f"{name} in use + cached")
        axes[1].plot(t, tl["running"][::stride], color=color, label=name)
        axes[2].plot(t, tl["waiting"][::stride], color=color, label=name)
    unit = next(iter(runs.values())).summary["time_unit"]
    axes[0].set_ylabel("KV (tokens)")
    axes[1].set_ylabel("running")
    axes[2].set_ylabel("waiting")
    axes[2].set_xlabel(f"time ({unit})")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fmt = str(path).rsplit(".", 1)[-1].lower()
    try:
        atomic_write(path, lambda f: fig.savefig(f, dpi=110, format=fmt))
    finally:
        plt.close(fig)


ENGINE_OPTIONS = {"llamacpp": ("n_parallel", "kv_unified", "cache_ram_mib", "cache_reuse", "llamacpp_version"),
                  "vllm": ("block_size", "max_num_batched_tokens", "max_num_seqs", "vllm_version"),
                  "sglang": ("page_size", "schedule_policy", "chunked_prefill_size", "sglang_version")}


def _warn_ignored(ctx, names, arrivals, model, timed) -> None:
    """A warning line for each option given that this run does not use (issue 15 class 8)."""
    from .common import warn_ignored

    ignored = {}
    if arrivals != "poisson":
        ignored |= {"rate": "it is the rate of --arrivals poisson", "seed": "it seeds --arrivals poisson"}
    if model is None:
        ignored |= {"quant": "it prices the weights of --model", "speed": "it prices steps for --model/--on"}
    elif timed is False:
        ignored["speed_name"] = "--untimed runs count steps, not seconds"
    for engine, params in ENGINE_OPTIONS.items():
        if engine not in names:
            ignored |= {p: f"it is {engine}'s, and --engine is {','.join(names)}" for p in params}
    warn_ignored(ctx, {("speed_name" if k == "speed" else k): v for k, v in ignored.items()})


@click.command("simulate")
@click.option("--workload", type=click.Choice(["seed-chat", "shared-prefix", "multi-turn"]),
              help="A built-in workload.")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False),
              help="A Mooncake .jsonl or Azure .csv trace.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N requests.")
@click.option("--arrivals", type=click.Choice(["trace", "poisson", "at-once"]), default="trace", show_default=True)
@click.option("--rate", type=float, help="Requests per second for --arrivals poisson.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--engine", "engines", default="llamacpp,vllm,sglang", show_default=True,
              help="Comma-separated engines.")
@click.option("--capacity-tokens", type=int, help="KV pool in tokens (every engine).")
@click.option("--model", help="Model (catalog id): the KV pool and step times come from the performance model.")
@click.option("--on", "machine", help="Machine (catalog id) for --model.")
@click.option("--quant", default="Q4_K_M", show_default=True)
@click.option("--speed", "speed_name", type=click.Choice(["calibrated", "bandwidth-only", "lesson"]), default="calibrated", show_default=True,
              help="Speed model pricing the steps: fitted on llama-bench results, or fixed efficiencies (the seed lesson's).")
@click.option("--timed/--untimed", default=None,
              help="Price steps with the performance model (default: on with --model/--on).")
@click.option("--np", "n_parallel", type=int, help="llama.cpp: slots (-np; default auto = 4, unified KV).")
@click.option("--kv-unified/--no-kv-unified", default=None, help="llama.cpp: one KV buffer for all slots.")
@click.option("--cache-ram", "cache_ram_mib", type=float, help="llama.cpp: host prompt cache MiB (0 off, -1 unlimited).")
@click.option("--cache-reuse", "cache_reuse", type=int,
              help="llama.cpp: reuse cached chunks of at least N tokens after the common prefix, by KV shifting (0 off).")
@click.option("--llamacpp-version", type=click.Choice(["2026", "2024"]))
@click.option("--block-size", type=int, help="vLLM: tokens per block (16).")
@click.option("--max-num-batched-tokens", type=int, help="vLLM: token budget per step (2048).")
@click.option("--max-num-seqs", type=int, help="vLLM: running requests (256).")
@click.option("--vllm-version", type=click.Choice(["0.33", "0.11"]))
@click.option("--page-size", type=int, help="SGLang: tokens per page (1).")
@click.option("--schedule-policy", type=click.Choice(["fcfs", "lpm", "dfs-weight"]), help="SGLang (fcfs).")
@click.option("--chunked-prefill-size", type=int, help="SGLang (2048; -1 off).")
@click.option("--sglang-version", type=click.Choice(["0.5.23", "0.5.2"]))
@click.option("--json", "as_json", is_flag=True, help="Summaries (and configs) as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a timeline plot here (.png or .svg).")
@click.pass_context
def simulate(ctx, workload, trace, limit, arrivals, rate, seed, engines, capacity_tokens, model, machine, quant, speed_name, timed,
             n_parallel, kv_unified, cache_ram_mib, cache_reuse, llamacpp_version, block_size, max_num_batched_tokens,
             max_num_seqs, vllm_version, page_size, schedule_policy, chunked_prefill_size, sglang_version,
             as_json, plot):
    """Serve a workload or trace with each engine's KV manager and scheduler; compare side by side."""
    from ..api import simulate as simulate_api
    from ..fileio import check_output_path

    if plot:
        check_output_path(plot, PLOT_SUFFIXES, what="--plot")  # before the run, not after it

    if (model is None) != (machine is None):
        raise InvalidValueError("--model and --on go together")
    if capacity_tokens is None and not (model and machine):
        raise InvalidValueError("give --capacity-tokens N, or --model M --on MACHINE to size the KV pool")
    reqs = _requests(workload, trace, limit, arrivals, rate, seed)
    opts = {
        "llamacpp": {"n_parallel": n_parallel, "kv_unified": kv_unified, "cache_ram_mib": cache_ram_mib,
                     "cache_reuse": cache_reuse, "version": llamacpp_version},
        "vllm": {"block_size": block_size, "max_num_batched_tokens": max_num_batched_tokens,
                 "max_num_seqs": max_num_seqs, "version": vllm_version},
        "sglang": {"page_size": page_size, "schedule_policy": schedule_policy,
                   "chunked_prefill_size": chunked_prefill_size, "version": sglang_version},
    }
    names = [e.strip() for e in engines.split(",") if e.strip()]
    for e in names:
        if e not in ENGINE_NAMES:
            raise UnknownNameError("engine", e, ENGINE_NAMES)
    _warn_ignored(ctx, names, arrivals, model, timed)
    t0: dict[str, float] = {}

    def show_progress(name: str, done: int, total: int, now: float) -> None:
        start = t0.setdefault(name, time.perf_counter())
        sys.stderr.write(f"\r{name}: {done:,}/{total:,} requests, simulated {now:,.0f}, wall {time.perf_counter() - start:.1f} s")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    progress = show_progress if len(reqs) >= LONG_TRACE_REQUESTS else None
    report = simulate_api(reqs, engines=names, capacity_tokens=capacity_tokens, model=model, machine=machine, quant=quant,
                          speed=speed_name, timed=timed, engine_options={e: opts[e] for e in names},
                          workload=workload or str(trace), record_timeline=plot is not None, progress=progress)
    runs = {r.engine: r for r in report.runs}
    if plot:
        plot_timeline({e: r._run for e, r in runs.items()}, plot)
    if as_json:
        from .common import echo_json

        echo_json(report.to_dict())
        return
    src = workload or trace
    tm = next((r.time_model for r in report.runs if r.time_model), None)
    from .common import safe

    _table(runs, safe(f"{src}: {len(reqs):,} requests" + (f", {tm}" if tm else ", 1 step = 1 unit")))  # names from files
    if plot:
        click.echo(f"timeline written to {plot}")

"""`inferlab trace load|prefill|decode MODEL --on MACHINE`: what the hardware does, step by step."""

from __future__ import annotations


import click

from .common import echo_json, safe

EXIT_DOES_NOT_FIT = 1  # as `inferlab fit`: a prefill/decode trace of a configuration that does not fit, or a load that fails


def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    """A comma-separated list of integers (one-line error otherwise)."""
    if text is None:
        return None
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        from ..errors import InvalidValueError

        raise InvalidValueError(f"{name} must be comma-separated integers, got {text!r}") from None
    return out


def fit_options(f):
    """The configuration options `inferlab fit` takes (the same names and meanings)."""
    opts = [
        click.argument("model"),
        click.option("--on", "machine_name", required=True, help="Machine: a catalog key (see `inferlab machines`) or 'local'."),
        click.option("--quant", default=None, help="llama-quantize preset (Q4_K_M...) or 'type:Q4_K'; default Q4_K_M or the file's own."),
        click.option("--ctx", "n_ctx", type=int, default=None, help="Context (-c); default or 0: the trained context, shrunk by --fit."),
        click.option("--kv", "kv_type", default="f16", show_default=True, help="KV-cache type (-ctk/-ctv): f16, q8_0, q4_0..."),
        click.option("--flash-attn", "-fa", "flash_attn", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
                     help="Flash attention (-fa); llama.cpp refuses a quantized V cache with off."),
        click.option("--ngl", "n_gpu_layers", type=int, default=None, help="GPU layers (-ngl); default: chosen by --fit."),
        click.option("--n-cpu-moe", type=int, default=0, help="Keep the experts of the first N blocks in RAM."),
        click.option("--speed", "speed_name", type=click.Choice(["calibrated", "bandwidth-only", "lesson"]), default="calibrated",
                     show_default=True, help="Speed model (see `inferlab fit --help`)."),
        click.option("--order", type=click.Choice(["llama.cpp", "first-blocks", "lesson"]), default="llama.cpp", show_default=True,
                     help="Which layers -ngl moves."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
        click.option("--plot", "plot_path", default=None, help="Also draw it to FILE (.png or .svg)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _run(phase: str, plot_path, as_json, **kw):
    from ..api.trace import trace as trace_api

    if plot_path is not None:
        from ..plots import check_plot_path

        check_plot_path(plot_path)  # a bad destination fails before the computation
    r = trace_api(phase, kw.pop("model"), kw.pop("machine_name"), speed=kw.pop("speed_name"), **kw)
    if plot_path is not None:
        from ..plots.trace import save_trace

        save_trace(r, plot_path)
    if as_json:
        echo_json(r)
    else:
        render_trace(r)
        if plot_path is not None:
            click.echo(f"plot: {plot_path}")
    if not r.fits and (phase != "load" or any(s.name.startswith("allocation fails") for s in r.steps)):
        raise SystemExit(EXIT_DOES_NOT_FIT)


@click.group()
def trace():
    """What happens on the hardware, step by step: load, prefill or decode of MODEL on a machine.

    Each step: where (device or link), bytes moved, FLOPs, seconds, and what bounds it. Exit
    status: 0; 1 when the configuration does not fit (no prefill/decode is shown: it would not
    run; a load shows where the allocation fails); 2 on bad input."""


@trace.command("load")
@fit_options
@click.option("--disk-gbps", type=float, default=None, help="The drive's read rate, GB/s (default: 3.5, an assumed NVMe).")
def load(disk_gbps, plot_path, as_json, **kw):
    """Loading MODEL: header, mmap, copies of offloaded layers, KV and buffers, page-in; first and second launch."""
    from ..perf.trace import NVME_GBPS

    _run("load", plot_path, as_json, disk_gbps=NVME_GBPS if disk_gbps is None else disk_gbps, **kw)


@trace.command("prefill")
@fit_options
@click.option("--prompt", "n_tokens", type=int, default=512, show_default=True, help="Prompt tokens.")
@click.option("--context", type=int, default=0, show_default=True, help="Tokens already cached before the prompt.")
def prefill(n_tokens, context, plot_path, as_json, **kw):
    """Prefill of a prompt: per micro-batch (-ub 512) and device, with op offload of CPU layers."""
    _run("prefill", plot_path, as_json, n_tokens=n_tokens, context=context, **kw)


@trace.command("decode")
@fit_options
@click.option("--context", type=int, default=None, help="Cached tokens per sequence (default: half the cache, at most 4096).")
@click.option("--batch", type=int, default=1, show_default=True, help="Sequences decoded together.")
@click.option("--contexts", default=None, help="Contexts of the decode curve, comma-separated (default: 0, 1/8 ... all of the cache).")
@click.option("--curve-kv", default=None, help="KV types of the decode curve, comma-separated (default: --kv and q8_0).")
def decode(context, batch, contexts, curve_kv, plot_path, as_json, **kw):
    """One decode step per device (weights vs KV), and decode speed as the context grows, per KV type."""
    kv_types = tuple(x.strip() for x in curve_kv.split(",") if x.strip()) if curve_kv else None
    _run("decode", plot_path, as_json, context=context, batch=batch, contexts=_ints(contexts, "--contexts"), kv_types=kv_types, **kw)


def _bytes(b: float) -> str:
    if not b:
        return ""
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def _flops(f: float) -> str:
    if not f:
        return ""
    return f"{f / 1e12:.2f} T" if f >= 1e11 else f"{f / 1e9:.2f} G"


def _secs(s: float) -> str:
    return f"{s:.3f} s" if s >= 1 else f"{s * 1e3:.2f} ms"


SHOWN_MICRO_BATCHES = 4  # a long prompt's table shows the first ones and the last; --json has every step


def _table(con, steps) -> None:
    from rich.table import Table

    ubs = sorted({st.micro_batch for st in steps if st.micro_batch is not None})
    keep = set(ubs[:SHOWN_MICRO_BATCHES - 1] + ubs[-1:]) if len(ubs) > SHOWN_MICRO_BATCHES else set(ubs)
    t = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1))
    for col in ("#", "ub", "step", "where", "bytes", "FLOPs", "time", "bound") if ubs else ("#", "step", "where", "bytes", "FLOPs", "time", "bound"):
        t.add_column(col, justify="right" if col in ("#", "ub", "bytes", "FLOPs", "time") else "left")
    skipped = []
    for i, st in enumerate(steps, 1):
        if ubs and st.micro_batch not in keep:
            skipped.append(st)
            continue
        if skipped:
            n = len({x.micro_batch for x in skipped})
            t.add_row("…", "", f"{n} more micro-batches like these", "", "", "", _secs(sum(x.s for x in skipped)), "")
            skipped = []
        row = [safe(st.name), safe(st.where), _bytes(st.bytes_moved), _flops(st.flops), _secs(st.s), st.bound]
        t.add_row(str(i), *([str(st.micro_batch)] if ubs else []), *row)
    con.print(t)


def render_trace(r) -> None:
    """The human rendering of a TraceReport (the same numbers as its JSON)."""
    from rich.console import Console

    con = Console()
    con.print(f"[bold]{safe(r.model)}[/bold] · {safe(r.quant)} on [bold]{safe(r.machine)}[/bold] · -ngl {r.n_gpu_layers} · "
              f"-c {r.n_ctx} · KV {r.kv_type}" + ("" if r.fits else f" · [red]does not fit[/red]: {safe(r.reason)}"))
    if r.phase == "load":
        con.print("[bold]first launch[/bold] (weights from the drive)")
        _table(con, r.steps)
        con.print(f"load: [bold]{_secs(r.total_s or 0.0)}[/bold]; second launch (page cache): [bold]{_secs(r.second_launch_s or 0.0)}[/bold]")
    elif not r.steps:
        con.print(f"no {r.phase}: this configuration does not fit, so it would not run")
    else:
        if r.phase == "prefill":
            con.print(f"[bold]prefill[/bold] of {r.n_tokens} tokens after {r.context_tokens} cached")
        else:
            con.print(f"[bold]one decode step[/bold]: batch {r.batch} at {r.context_tokens} cached tokens each")
        _table(con, r.steps)
        con.print(f"total [bold]{_secs(r.total_s)}[/bold] = the speed model's {_secs(r.speed_model_s)} ({r.speed_model}) · "
                  f"[bold]{r.tok_per_s:.1f} tok/s[/bold]")
    if r.by_bound_s and r.total_s:
        con.print("time by bound: " + ", ".join(f"{k} {v / r.total_s:.0%}" for k, v in sorted(r.by_bound_s.items(), key=lambda kv: -kv[1]) if v))
    if r.curve:
        from rich.table import Table

        t = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1), title="decode as the context grows")
        for col in ("KV", "-ngl", "context", "tok/s", "weights read", "KV read"):
            t.add_column(col, justify="left" if col == "KV" else "right")
        for c in r.curve:
            t.add_row(c.kv_type, str(c.n_gpu_layers), str(c.context_tokens), f"{c.tok_per_s:.1f}", _bytes(c.weights_bytes), _bytes(c.kv_bytes))
        con.print(t)
    for n in r.notes:
        con.print(f"note: {safe(n)}")
    con.print("[dim]bytes in GB = 10^9 / MB = 10^6; FLOPs in T = 10^12 / G = 10^9[/dim]")

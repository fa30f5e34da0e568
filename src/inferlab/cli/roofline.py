"""`inferlab roofline --on MACHINE [--model M]`: peak compute and bandwidth, the ridge point, and
where decode and prefill sit."""

from __future__ import annotations

import click

from .common import echo_json, safe
from .trace import _ints


@click.command()
@click.option("--on", "machine_name", required=True, help="Machine: a catalog key (see `inferlab machines`) or 'local'.")
@click.option("--model", default=None, help="A model (catalog id or file) whose decode and prefill to place on the roofline.")
@click.option("--quant", default=None, help="Quantization (with --model: as `fit`; without: a GGML type for the bits per weight, default Q4_K).")
@click.option("--kv", "kv_type", default="f16", show_default=True, help="KV-cache type.")
@click.option("--batch", "batches", default="1,8,32,128", show_default=True, help="Decode batch sizes, comma-separated.")
@click.option("--contexts", default="512,2048,4096,8000", show_default=True, help="Context lengths for attention and prefill, comma-separated.")
@click.option("--context", type=int, default=2048, show_default=True, help="Cached tokens per sequence for the batched decode points.")
@click.option("--ctx", "n_ctx", type=int, default=None, help="Context (-c) the cache is allocated for (default: trained, shrunk by --fit).")
@click.option("--ngl", "n_gpu_layers", type=int, default=None, help="GPU layers (-ngl).")
@click.option("--speed", "speed_name", type=click.Choice(["calibrated", "bandwidth-only", "lesson"]), default="calibrated", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--plot", "plot_path", default=None, help="Also draw it to FILE (.png or .svg).")
@click.pass_context
def roofline(ctx, machine_name, model, quant, kv_type, batches, contexts, context, n_ctx, n_gpu_layers, speed_name, as_json, plot_path):
    """The roofline of a machine: ridge point, and where decode at each batch and prefill sit.

    Exit status: 0; 2 on bad input. Batches whose cache does not fit in the allocated -c are
    listed as refused, with the numbers."""
    from ..api.roofline import roofline as roofline_api
    from .common import warn_ignored

    if model is None:  # without a model there is no cache to allocate nor layers to place (issue 15 class 8)
        warn_ignored(ctx, {k: "it applies with --model" for k in ("kv_type", "n_ctx", "n_gpu_layers")})

    if plot_path is not None:
        from ..plots import check_plot_path

        check_plot_path(plot_path)
    r = roofline_api(machine_name, model, quant=quant, kv_type=kv_type, batches=_ints(batches, "--batch"),
                     contexts=_ints(contexts, "--contexts"), context=context, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, speed=speed_name)
    if plot_path is not None:
        from ..plots.roofline import save_roofline

        save_roofline(r, plot_path)
    if as_json:
        echo_json(r)
        return
    render_roofline(r)
    if plot_path is not None:
        click.echo(f"plot: {plot_path}")


def render_roofline(r) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]roofline of {safe(r.machine)}[/bold]" + (f" · {safe(r.model)} · {safe(r.quant)} · KV {r.kv_type} · -c {r.n_ctx}" if r.model else ""))
    t = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1))
    for col in ("device", "peak TFLOP/s", "GB/s", "ridge FLOP/byte"):
        t.add_column(col, justify="left" if col == "device" else "right")
    for x in r.roofs:
        t.add_row(safe(x.device) + (" ◀" if x.device == r.device else ""), f"{x.peak_flops / 1e12:.3g}", f"{x.bandwidth_bytes_per_s / 1e9:.4g}",
                  f"{x.ridge_flop_per_byte:.1f}")
    con.print(t)
    con.print(f"a weight matmul at {r.bits_per_weight:.2f} bpw turns compute-bound on {safe(r.device)} from batch [bold]{r.ridge_batch:.0f}[/bold]")
    t = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1))
    for col in ("work", "FLOP/byte", "attainable TFLOP/s", "of peak", "bound"):
        t.add_column(col, justify="left" if col in ("work", "bound") else "right")
    for p in r.points:
        t.add_row(p.label + (" (whole step)" if p.op == "model" else ""), f"{p.intensity_flop_per_byte:.3g}", f"{p.attainable_flops / 1e12:.3g}",
                  f"{p.utilization:.1%}", p.bound)
    con.print(t)
    if r.throughput:
        t = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1), title=f"decode at {r.decode_context_tokens} tokens ({r.speed_model})")
        for col in ("batch", "tok/s", "per sequence", "step", "bound"):
            t.add_column(col, justify="right" if col != "bound" else "left")
        for x in r.throughput:
            t.add_row(str(x.batch), f"{x.tok_per_s:.1f}", f"{x.per_sequence_tok_per_s:.1f}", f"{x.step_s * 1e3:.2f} ms", x.bound)
        con.print(t)
    for x in r.refused:
        con.print(f"refused: {safe(x.reason)}")
    if r.saturation_note:
        con.print(r.saturation_note)
    for n in r.notes:
        con.print(f"note: {safe(n)}")

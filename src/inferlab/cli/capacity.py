"""`inferlab capacity`: concurrent sessions per KV strategy, the case study's formula beside the engine's own pool."""

from __future__ import annotations

import click

from .common import echo_json, safe

GB = 1e9


def _ints(text: str, what: str) -> tuple[int, ...]:
    from ..errors import InvalidValueError

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InvalidValueError(f"{what} must be comma-separated integers, got {text!r}") from None


@click.command()
@click.argument("model")
@click.option("--on", "machine_name", required=True, help="Machine: a catalog key or 'local'.")
@click.option("--engine", type=click.Choice(["llamacpp", "vllm", "sglang"]), default="vllm", show_default=True)
@click.option("--ctx", "ctx_text", default="2000,4000,8000", show_default=True, help="Context lengths per session, comma-separated.")
@click.option("--kv", "kv_text", default="f16,int8", show_default=True, help="KV types: f16, int8 (the case study's 1 byte), fp8, q8_0, q4_0 ...")
@click.option("--window", type=int, default=None, help="Sliding-window eviction: keep the last W tokens per session.")
@click.option("--target-sessions", type=int, default=None, help="Sessions the deployment needs; says when it is out of reach.")
@click.option("--quant", default=None, help="Weights: a preset or type (default F16 for vLLM/SGLang, Q4_K_M for llama.cpp).")
@click.option("--weights-gb", type=float, default=None, help="Override the weights' size in GB (the case study assumes 14).")
@click.option("--plot", "plot_path", default=None, help="Write the case study's three plots to FILE (.png or .svg).")
@click.option("--json", "as_json", is_flag=True)
def capacity(model, machine_name, engine, ctx_text, kv_text, window, target_sessions, quant, weights_gb, plot_path, as_json):
    """How many concurrent sessions of each context fit, per KV strategy, by the engine's own accounting."""
    from ..api.capacity import capacity as run

    if plot_path:
        from ..plots import check_plot_path

        check_plot_path(plot_path)
    r = run(model, machine_name, engine=engine, contexts=_ints(ctx_text, "--ctx"), kv_types=tuple(k.strip() for k in kv_text.split(",") if k.strip()),
            window=window, target_sessions=target_sessions, quant=quant, weights_gb=weights_gb)
    if plot_path:
        from ..plots.capacity import save_capacity

        save_capacity(r, plot_path)
    if as_json:
        echo_json(r)
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]{safe(r.model)}[/bold] on [bold]{safe(r.machine)}[/bold] · {r.engine} ({r.engine_version}) · weights "
              f"{r.weights_bytes / GB:.2f} GB ({r.weights_origin}) · {r.gpu_bytes / GB:.1f} GB GPU · {r.budget_bytes / GB:.2f} GB for KV")
    con.print("KV bytes per token: " + ", ".join(f"{k.kv_type} {k.bytes_per_token:,.0f} B" for k in r.kv_per_token))
    t = Table(title="concurrent sessions: the case study's formula / the engine's own pool")
    t.add_column("strategy")
    for c in r.contexts:
        t.add_column(f"{c:,} tok", justify="right")
    for row in r.rows:
        cells = [f"{c.sessions}" + (f" / {c.engine_sessions}" if c.engine_sessions is not None else " / -") for c in row.cells]
        t.add_row(row.strategy, *cells)
    con.print(t)
    for row in r.rows:
        if row.note:
            con.print(f"  {row.strategy}: {safe(row.note)}")
    from ..kv.pool import LlamacppPool, SglangPool, VllmPool

    p = r.pool
    if p is not None:
        con.print(f"{r.engine} reports: {safe(p.log_line)}")
        if isinstance(p, VllmPool):
            con.print(f"  {p.gpu_memory_utilization} x {p.total_bytes / GB:.1f} GB = {p.requested_bytes / GB:.2f} GB − weights "
                      f"{p.weights_bytes / GB:.2f} − activations {p.activation_bytes / GB:.2f} − non-torch {p.non_torch_bytes / GB:.2f} − "
                      f"CUDA graphs {p.cuda_graph_bytes / GB:.2f} = KV {p.kv_bytes / GB:.2f} GB, {p.num_blocks} blocks of {p.block_size}")
        elif isinstance(p, LlamacppPool):
            con.print(f"  -np {p.n_parallel} slots x {r.contexts[-1]:,} tokens: -c {p.n_ctx:,} ({'unified' if p.unified else 'split'}), "
                      f"KV {p.kv_bytes / GB:.2f} GB, {p.gpu_bytes / GB:.2f} GB on the GPU with -ngl {p.n_gpu_layers}")
        elif isinstance(p, SglangPool):
            con.print(f"  mem_fraction_static {p.mem_fraction_static} (reserved {p.reserved_mib:.0f} MiB) x {p.total_bytes / GB:.1f} GB − "
                      f"weights {p.weights_bytes / GB:.2f} GB = KV {p.kv_bytes / GB:.2f} GB")
    for n in r.notes:
        con.print(f"[yellow]note[/yellow]: {safe(n)}")

"""`inferlab fit`, `inferlab models`, `inferlab machines`: placement, memory and speed."""

from __future__ import annotations

import click

from .common import bar, echo_json, safe, table_console

GB = 1e9
EXIT_DOES_NOT_FIT = 1  # `inferlab fit` exits 1 when the configuration does not fit (2 is bad input)


@click.command()
@click.argument("model")
@click.option("--on", "machine_name", required=True, help="Machine: a catalog key (see `inferlab machines`) or 'local'.")
@click.option("--quant", default=None, help="llama-quantize preset (Q4_K_M, Q2_K...); 'type:Q2_K' for every weight in one GGML type. "
              "Default: Q4_K_M, or the file's own tensors for a GGUF.")
@click.option("--ctx", "n_ctx", type=int, default=None, help="Context (-c). Default (or 0, as llama.cpp's -c 0): the trained context, shrunk by --fit to fit.")
@click.option("--kv", "kv_type", default="f16", show_default=True, help="KV-cache type (-ctk/-ctv): f16, q8_0, q4_0...")
@click.option("--flash-attn", "-fa", "flash_attn", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="Flash attention (-fa). llama.cpp refuses a quantized V cache (--kv q8_0...) with off.")
@click.option("--ngl", "n_gpu_layers", type=int, default=None, help="GPU layers (-ngl). Default: chosen by --fit.")
@click.option("--n-cpu-moe", type=int, default=0, help="Keep the experts of the first N blocks in RAM.")
@click.option("--context", type=int, default=None, help="Context at which to report decode speed (default: half of --ctx, at most 4096).")
@click.option("--prompt", "n_prompt", type=int, default=None, help="Prompt length for the prefill estimate (default: 512, or -c if shorter).")
@click.option("--speed", "speed_name", type=click.Choice(["calibrated", "bandwidth-only", "lesson"]), default="calibrated", show_default=True,
              help="Speed model: fitted on llama-bench results; or fixed efficiencies (η=0.7, 50% compute) on vendor figures "
                   "(bandwidth-only) or on the lesson's own device figures (lesson).")
@click.option("--order", type=click.Choice(["llama.cpp", "first-blocks", "lesson"]), default="llama.cpp", show_default=True,
              help="Which layers -ngl moves: llama.cpp's (output head first) or the lesson's (first blocks).")
@click.option("--no-profile", is_flag=True, help="With --on local: ignore this machine's calibration profile (`inferlab calibrate`).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fit(model, machine_name, quant, n_ctx, kv_type, flash_attn, n_gpu_layers, n_cpu_moe, context, n_prompt, speed_name, order, no_profile,
        as_json):
    """Does MODEL fit on a machine, where do its bytes live, and how fast will it run?

    Exit status: 0 when it fits, 1 when it does not (no speed is printed: it would not run),
    2 on bad input."""
    from ..api import fit as fit_api

    report = fit_api(model, machine_name, quant=quant, n_ctx=n_ctx, kv_type=kv_type, n_gpu_layers=n_gpu_layers,
                     n_cpu_moe=n_cpu_moe, context=context, n_prompt=n_prompt, speed=speed_name, order=order,
                     flash_attn=flash_attn, profile=not no_profile)
    if as_json:
        echo_json(report.to_dict())
    else:
        render_fit(report)
    if not report.fits:
        raise SystemExit(EXIT_DOES_NOT_FIT)


def render_fit(r) -> None:
    """The human rendering of a FitReport (the same numbers as its JSON)."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    verdict = "[green]fits[/green]" if r.fits else f"[red]does not fit[/red]: {r.reason}"
    con.print(f"[bold]{safe(r.model)}[/bold] · {r.quant} · {r.weights_bytes / GB:.2f} GB ({r.bits_per_weight:.2f} bpw)")
    con.print(f"on [bold]{safe(r.machine)}[/bold]: {verdict}")
    if r.file is not None:
        f = r.file
        types = ", ".join(f"{k} x{v}" for k, v in sorted(f.tensor_types.items(), key=lambda kv: -kv[1]))
        con.print(f"file: {(f.file_bytes or 0) / GB:.3f} GB in {f.n_files} part(s) · tensors {types}")
        con.print(f"      trained context {f.n_ctx_train} · chat template {'yes' if f.chat_template else 'no'} · "
                  f"tokenizer {f.tokenizer} with {f.n_vocab_tokens} tokens"
                  + (f" · vision projector {f.vision_bytes / GB:.3f} GB (not placed)" if f.vision_bytes else "")
                  + (" · imatrix" if f.imatrix else ""))
    ctx_note = " (shrunk by --fit)" if r.ctx_reduced else ""
    ngl_note = " (chosen by --fit)" if r.auto_ngl else ""
    con.print(f"-c {r.n_ctx}{ctx_note} · KV {r.kv_type} · -ngl {r.n_gpu_layers}/{r.n_gpu_layers_max}{ngl_note}")
    t = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1))
    for col in ("device", "blocks", "weights", "KV", "buffers", "total", "of", "use"):
        t.add_column(col, justify="right" if col not in ("device", "use") else "left", no_wrap=True)
    for x in r.devices:
        blocks = f"{x.n_blocks}" + ("+out" if x.output_head else "")
        name = "CPU + RAM" if x.kind == "cpu" else safe(x.name)
        t.add_row(name, blocks, f"{x.weights_bytes / GB:.2f}", f"{x.kv_bytes / GB:.2f}", f"{x.compute_bytes / GB:.2f}",
                  f"{x.total_bytes / GB:.2f}", f"{x.capacity_bytes / GB:.1f}", bar(x.total_bytes, x.capacity_bytes, 12))
    con.print(t)
    con.print("[dim]memory in GB (10^9 bytes); buffers = compute buffers[/dim]")
    dec, pre = r.decode, r.prefill
    if dec is None or pre is None:
        con.print("no speed: this configuration does not fit, so it would not run")
    else:
        con.print(f"decode  [bold]{dec.tok_per_s:.1f} tok/s[/bold] at {dec.context_tokens} tokens of context · "
                  f"CPU share {dec.cpu_share:.0%} · {dec.bound}-bound")
        con.print(f"prefill [bold]{pre.tok_per_s:.0f} tok/s[/bold] for a {pre.n_tokens}-token prompt ({pre.s:.2f} s)")
        con.print(f"bottleneck: {dec.bottleneck}")
    for n in r.notes:
        con.print(f"note: {n}")
    con.print(f"[dim]speed model: {r.speed_model}[/dim]")


@click.command()
@click.option("--json", "as_json", is_flag=True)
def models(as_json):
    """List the built-in model catalog."""
    from ..models.catalog import MODELS

    rows = [{"id": k, "name": m.name, "arch": m.arch, "params_b": m.total_params() / 1e9, "active_params_b": m.active_params() / 1e9,
             "layers": m.n_layers, "n_ctx_train": m.n_ctx_train, "source": m.source} for k, m in MODELS.items()]
    if as_json:
        echo_json(rows)
        return
    from rich.table import Table

    t = Table(header_style="bold", show_edge=False)
    for c in ("id", "name", "arch", "params", "active", "layers", "trained ctx"):
        t.add_column(c, justify="right" if c in ("params", "active", "layers", "trained ctx") else "left",
                     no_wrap=c in ("id", "params", "active"))  # ids whole; names wrap
    for r in rows:
        t.add_row(r["id"], r["name"], r["arch"], f"{r['params_b']:.2f}B", f"{r['active_params_b']:.2f}B", str(r["layers"]), str(r["n_ctx_train"]))
    table_console().print(t)


@click.command()
@click.option("--json", "as_json", is_flag=True)
def machines(as_json):
    """List the built-in machine catalog."""
    from ..hardware.catalog import MACHINES

    rows = []
    for k, m in MACHINES.items():
        g = m.gpu
        rows.append({"id": k, "name": m.name, "gpu_memory_gb": sum(x.memory_gb for x in m.gpus) if g else 0,
                     "gpu_bandwidth_gbs": g.bandwidth_gbs if g else None, "gpu_fp16_tflops": g.fp16_tflops if g else None,
                     "backend": g.backend if g else "cpu", "ram_gb": m.ram.memory_gb, "ram_bandwidth_gbs": m.ram.bandwidth_gbs,
                     "pcie_gbs": m.pcie_gbs, "unified": m.unified, "source": m.source})
    if as_json:
        echo_json(rows)
        return
    from rich.table import Table

    t = Table(header_style="bold", show_edge=False)
    for c in ("id", "name", "backend", "GPU GB", "GPU GB/s", "FP16 TFLOP/s", "RAM GB/s", "PCIe GB/s"):
        t.add_column(c, justify="left" if c in ("id", "name", "backend") else "right", no_wrap=c == "id")  # ids whole
    for r in rows:
        t.add_row(r["id"], r["name"], r["backend"], f"{r['gpu_memory_gb']:g}", f"{r['gpu_bandwidth_gbs'] or 0:g}", f"{r['gpu_fp16_tflops'] or 0:g}",
                  f"{r['ram_bandwidth_gbs']:g}", "unified" if r["unified"] else f"{r['pcie_gbs']:g}")
    table_console().print(t)

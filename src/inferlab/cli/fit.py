"""`inferlab fit`, `inferlab models`, `inferlab machines`: placement, memory and speed."""

from __future__ import annotations

import click

from .common import bar, echo_json, resolve_machine, resolve_model

GB = 1e9


@click.command()
@click.argument("model")
@click.option("--on", "machine_name", required=True, help="Machine: a catalog key (see `inferlab machines`) or 'local'.")
@click.option("--quant", default=None, help="llama-quantize preset (Q4_K_M, Q2_K...); 'type:Q2_K' for every weight in one GGML type. "
              "Default: Q4_K_M, or the file's own tensors for a GGUF.")
@click.option("--ctx", "n_ctx", type=int, default=None, help="Context (-c). Default: the trained context, shrunk by --fit to fit.")
@click.option("--kv", "kv_type", default="f16", show_default=True, help="KV-cache type (-ctk/-ctv): f16, q8_0, q4_0...")
@click.option("--ngl", "n_gpu_layers", type=int, default=None, help="GPU layers (-ngl). Default: chosen by --fit.")
@click.option("--n-cpu-moe", type=int, default=0, help="Keep the experts of the first N blocks in RAM.")
@click.option("--context", type=int, default=None, help="Context at which to report decode speed (default: half of --ctx, at most 4096).")
@click.option("--prompt", "n_prompt", type=int, default=512, show_default=True, help="Prompt length for the prefill estimate.")
@click.option("--speed", "speed_name", type=click.Choice(["calibrated", "lesson"]), default="calibrated", show_default=True,
              help="Speed model: fitted on llama-bench results, or the lesson's (η=0.7, 50% compute).")
@click.option("--order", type=click.Choice(["llama.cpp", "lesson"]), default="llama.cpp", show_default=True,
              help="Which layers -ngl moves: llama.cpp's (output head first) or the lesson's (first blocks).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fit(model, machine_name, quant, n_ctx, kv_type, n_gpu_layers, n_cpu_moe, context, n_prompt, speed_name, order, as_json):
    """Does MODEL fit on a machine, where do its bytes live, and how fast will it run?"""
    from ..perf.calibration import speed_model
    from ..perf.placement import place
    from ..quant.plan import effective_bpw, resolve_quant, weight_bytes
    from ..perf.speed import decode_step_time, prefill_time

    spec = resolve_model(model)
    machine = resolve_machine(machine_name, lesson=speed_name == "lesson")
    if quant is None:
        q = None if spec.tensors is not None else resolve_quant("Q4_K_M")
    else:
        q = resolve_quant(quant if ":" in quant else "preset:" + quant) if _is_preset(quant) else resolve_quant(quant)
    speed = speed_model(speed_name)
    p = place(spec, machine, q, n_ctx, kv_type, n_gpu_layers, n_cpu_moe=n_cpu_moe, order=order)
    ctx_at = context if context is not None else min(p.n_ctx // 2, 4096)
    d = decode_step_time(p, machine, min(ctx_at, p.n_ctx), 1, speed)
    f = prefill_time(p, machine, n_prompt, speed)
    wb = weight_bytes(spec, q)
    bpw = effective_bpw(spec, q)
    qlabel = q.label if q is not None else f"the file's own tensors ({spec.file_type or 'mixed'})"
    result = {
        "model": spec.name, "quant": qlabel, "machine": machine.name, "fits": p.fits, "reason": p.reason,
        "n_ctx": p.n_ctx, "ctx_reduced": p.ctx_reduced, "kv_type": kv_type, "n_gpu_layers": p.n_gpu_layers,
        "n_gpu_layers_max": spec.n_layers + 1, "auto_ngl": p.auto, "weights_bytes": wb["total"], "bits_per_weight": bpw,
        "devices": [{"name": x.name, "kind": x.kind, "blocks": x.n_blocks, "output_head": x.has_output, "weights_bytes": x.weights_bytes,
                     "kv_bytes": x.kv_bytes, "compute_bytes": x.compute_bytes, "total_bytes": x.total_bytes, "capacity_bytes": x.capacity_bytes}
                    for x in p.devices],
        "decode": {"context": d["context"], "tok_per_s": d["tok_per_s"], "step_s": d["total_s"], "cpu_share": d["cpu_s"] / d["total_s"] if d["total_s"] else 0.0,
                   "bound": d["bound"], "bottleneck": d["bottleneck"]},
        "prefill": {"n_tokens": n_prompt, "tok_per_s": f["tok_per_s"], "s": f["total_s"], "pcie_s": f["pcie_s"]},
        "speed_model": speed.name, "order": order, "notes": list(p.notes),
    }
    if "gguf_version" in spec.extra:  # facts from the file's header
        x = spec.extra
        result["file"] = {"path": (x.get("split_files") or [None])[0], "n_files": len(x.get("split_files") or []),
                          "file_bytes": x.get("file_bytes"), "tensor_types": x.get("tensor_types"), "n_ctx_train": spec.n_ctx_train,
                          "chat_template": bool(x.get("chat_template")), "tokenizer": x.get("tokenizer_model"),
                          "n_vocab_tokens": x.get("n_vocab_tokens"), "imatrix": x.get("imatrix"),
                          "vision_bytes": x.get("vision_bytes", 0) + (x.get("mmproj") or {}).get("n_bytes", 0)}
    if as_json:
        echo_json(result)
        return
    _print_fit(result, p)


def _is_preset(q: str) -> bool:
    """On the command line a bare name means the llama-quantize preset when one exists (that is
    how files are named); 'type:NAME' asks for every weight in one GGML type."""
    from ..quant.presets import preset_aliases, presets

    names = {k.upper() for k in presets()} | {k.upper() for k in preset_aliases()}
    return ":" not in q and q.upper() in names


def _print_fit(r: dict, p) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    verdict = "[green]fits[/green]" if r["fits"] else f"[red]does not fit[/red]: {r['reason']}"
    con.print(f"[bold]{r['model']}[/bold] · {r['quant']} · {r['weights_bytes'] / GB:.2f} GB ({r['bits_per_weight']:.2f} bpw)")
    con.print(f"on [bold]{r['machine']}[/bold]: {verdict}")
    if "file" in r:
        f = r["file"]
        types = ", ".join(f"{k} x{v}" for k, v in sorted((f["tensor_types"] or {}).items(), key=lambda kv: -kv[1]))
        con.print(f"file: {f['file_bytes'] / GB:.3f} GB in {f['n_files']} part(s) · tensors {types}")
        con.print(f"      trained context {f['n_ctx_train']} · chat template {'yes' if f['chat_template'] else 'no'} · "
                  f"tokenizer {f['tokenizer']} with {f['n_vocab_tokens']} tokens"
                  + (f" · vision projector {f['vision_bytes'] / GB:.3f} GB (not placed)" if f["vision_bytes"] else "")
                  + (" · imatrix" if f["imatrix"] else ""))
    ctx_note = " (shrunk by --fit)" if r["ctx_reduced"] else ""
    ngl_note = " (chosen by --fit)" if r["auto_ngl"] else ""
    con.print(f"-c {r['n_ctx']}{ctx_note} · KV {r['kv_type']} · -ngl {r['n_gpu_layers']}/{r['n_gpu_layers_max']}{ngl_note}")
    t = Table(show_edge=False, header_style="bold", box=None, padding=(0, 1))
    for col in ("device", "blocks", "weights", "KV", "buffers", "total", "of", "use"):
        t.add_column(col, justify="right" if col not in ("device", "use") else "left", no_wrap=True)
    for x in r["devices"]:
        blocks = f"{x['blocks']}" + ("+out" if x["output_head"] else "")
        name = "CPU + RAM" if x["kind"] == "cpu" else x["name"]
        t.add_row(name, blocks, f"{x['weights_bytes'] / GB:.2f}", f"{x['kv_bytes'] / GB:.2f}", f"{x['compute_bytes'] / GB:.2f}",
                  f"{x['total_bytes'] / GB:.2f}", f"{x['capacity_bytes'] / GB:.1f}", bar(x["total_bytes"], x["capacity_bytes"], 12))
    con.print(t)
    con.print("[dim]memory in GB (10^9 bytes); buffers = compute buffers[/dim]")
    dec, pre = r["decode"], r["prefill"]
    con.print(f"decode  [bold]{dec['tok_per_s']:.1f} tok/s[/bold] at {dec['context']} tokens of context · CPU share {dec['cpu_share']:.0%} · {dec['bound']}-bound")
    con.print(f"prefill [bold]{pre['tok_per_s']:.0f} tok/s[/bold] for a {pre['n_tokens']}-token prompt ({pre['s']:.2f} s)")
    con.print(f"bottleneck: {dec['bottleneck']}")
    for n in r["notes"]:
        con.print(f"note: {n}")
    con.print(f"[dim]speed model: {r['speed_model']}[/dim]")


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
    from rich.console import Console
    from rich.table import Table

    t = Table(header_style="bold", show_edge=False)
    for c in ("id", "name", "arch", "params", "active", "layers", "trained ctx"):
        t.add_column(c, justify="right" if c in ("params", "active", "layers", "trained ctx") else "left")
    for r in rows:
        t.add_row(r["id"], r["name"], r["arch"], f"{r['params_b']:.2f}B", f"{r['active_params_b']:.2f}B", str(r["layers"]), str(r["n_ctx_train"]))
    Console().print(t)


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
    from rich.console import Console
    from rich.table import Table

    t = Table(header_style="bold", show_edge=False)
    for c in ("id", "name", "backend", "GPU GB", "GPU GB/s", "FP16 TFLOP/s", "RAM GB/s", "PCIe GB/s"):
        t.add_column(c, justify="left" if c in ("id", "name", "backend") else "right")
    for r in rows:
        t.add_row(r["id"], r["name"], r["backend"], f"{r['gpu_memory_gb']:g}", f"{r['gpu_bandwidth_gbs'] or 0:g}", f"{r['gpu_fp16_tflops'] or 0:g}",
                  f"{r['ram_bandwidth_gbs']:g}", "unified" if r["unified"] else f"{r['pcie_gbs']:g}")
    Console().print(t)

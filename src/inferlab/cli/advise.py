"""`inferlab advise`: which engine for the job, and the exact command for each engine that can run it."""

from __future__ import annotations

import click

from .common import echo_json, safe

GB = 1e9


@click.command()
@click.argument("model")
@click.option("--on", "machine_name", required=True, help="Machine: a catalog key or 'local'.")
@click.option("--users", type=int, default=1, show_default=True, help="Concurrent users (requests in flight).")
@click.option("--ctx", type=int, default=None, help="Context each user needs (default 8192, or the trained length if shorter).")
@click.option("--shared-prefix", type=int, default=0, show_default=True, help="Tokens every request shares (system prompt, tools, documents).")
@click.option("--quant", default=None, help="A preset or type (default Q4_K_M, or the file's own tensors).")
@click.option("--lora-rank", type=int, default=None, help="Serve a LoRA adapter of this rank: its memory and extra time per token.")
@click.option("--draft", default=None, help="A draft model for speculative decoding (same tokenizer).")
@click.option("--acceptance", "acceptance_rate", type=float, default=0.7, show_default=True, help="Draft acceptance rate for the speedup estimate.")
@click.option("--speed", "speed_name", type=click.Choice(["calibrated", "bandwidth-only", "lesson"]), default="calibrated", show_default=True,
              help="Speed model (see `inferlab fit --help`).")
@click.option("--json", "as_json", is_flag=True)
def advise(model, machine_name, users, ctx, shared_prefix, quant, lora_rank, draft, acceptance_rate, speed_name, as_json):
    """Which engine fits the job (the lesson's recipes), with each engine's exact command and the figures it will report."""
    from ..api.advise import advise as run

    r = run(model, machine_name, users=users, ctx=ctx, shared_prefix=shared_prefix, quant=quant, lora_rank=lora_rank, draft=draft,
            acceptance_rate=acceptance_rate, speed=speed_name)
    if as_json:
        echo_json(r)
        return
    from rich.console import Console

    con = Console()
    con.print(f"[bold]{safe(r.model)}[/bold] on [bold]{safe(r.machine)}[/bold]: {r.users} user(s), {r.ctx:,} tokens"
              + (f", {r.shared_prefix_tokens:,} shared" if r.shared_prefix_tokens else ""))
    con.print(f"recipe: [bold]{r.recipe}[/bold] — {safe(r.recipe_text)}")
    con.print(f"engine: [bold]{r.engine}[/bold]")
    for x in r.reasons:
        con.print(f"  · {safe(x)}")
    for e in r.engines:
        speed = f"{e.tok_per_s:.1f} tok/s per stream" if e.tok_per_s else "no prediction"
        agg = f", {e.aggregate_tok_per_s:.0f} tok/s for all users" if e.aggregate_tok_per_s and r.users > 1 else ""
        con.print(f"\n[bold]{e.engine}[/bold] ({safe(e.command.engine_version)}): {speed}{agg}"
                  + (f", {e.sessions} sessions of {r.ctx:,} tokens" if e.sessions is not None else ""))
        con.print(f"  {safe(e.command.text)}", soft_wrap=True)
        for line in e.reports:
            con.print(f"  reports: {safe(line)}")
        for n in e.command.notes:
            con.print(f"  note: {safe(n)}")
    if r.placements and r.fit_default is not None:
        con.print(f"\nplacements ranked by predicted decode speed (llama.cpp's --fit default: -ngl {r.fit_default.n_gpu_layers}, "
                  f"{r.fit_default.tok_per_s:.1f} tok/s):")
        for p in r.placements:
            con.print(f"  {p.rank}. {p.tok_per_s:5.1f} tok/s  GPU {p.gpu_bytes / GB:5.1f} GB  RAM {p.host_bytes / GB:5.1f} GB  "
                      f"{safe(p.command.text)}", soft_wrap=True)
            if p.ot_command is not None:
                con.print(f"     same with -ot: {safe(p.ot_command.text)}", soft_wrap=True)
    if r.lora is not None:
        lc = r.lora
        con.print(f"\nLoRA rank {lc.rank}: {lc.adapter_bytes / 1e6:.0f} MB per adapter ({lc.n_matrices} matrices), vLLM reserves "
                  f"{lc.vllm_reserved_bytes / 1e6:.0f} MB; +{lc.extra_decode_s * 1e3:.2f} ms per token ({lc.slowdown:.3f}x); merged weights: +0")
        if lc.note:
            con.print(f"  note: {safe(lc.note)}")
    if r.speculative is not None:
        s = r.speculative
        con.print(f"\nspeculative decoding with {safe(s.draft)} (γ={s.n_draft}, acceptance {s.acceptance_rate:.0%}): "
                  f"{s.expected_tokens_per_pass:.2f} tokens per pass, {s.baseline_tok_per_s:.1f} → {s.tok_per_s:.1f} tok/s "
                  f"({s.speedup:.2f}x); draft {s.draft_weights_bytes / GB:.2f} GB + KV {s.draft_kv_bytes / GB:.2f} GB"
                  + ("" if s.fits else f" — {s.note}"))
    for n in r.notes:
        con.print(f"[yellow]note[/yellow]: {safe(n)}")

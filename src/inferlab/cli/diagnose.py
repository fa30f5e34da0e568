"""`inferlab diagnose`: which row of the lesson's symptom table applies, the fix and its predicted effect."""

from __future__ import annotations

import click

from .common import echo_json, safe


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("model")
@click.option("--on", "machine_name", required=True, help="Machine: a catalog key or 'local'.")
@click.option("--engine", type=click.Choice(["llamacpp", "vllm", "sglang"]), default="llamacpp", show_default=True)
@click.option("--quant", default=None, help="A preset or type (default Q4_K_M, or the file's own tensors).")
@click.option("--observed-tok-s", type=float, default=None, help="Decode speed you measured (tokens/s).")
@click.option("--observed-ttft-s", type=float, default=None, help="Time to first token you measured (s).")
@click.option("--prompt-tokens", type=int, default=None, help="Prompt length behind the TTFT.")
@click.option("--users", type=int, default=None, help="Concurrent users.")
@click.option("--error", "error_text", default=None, help="The error message the engine printed.")
@click.option("--speed", "speed_name", type=click.Choice(["calibrated", "bandwidth-only", "lesson"]), default="calibrated", show_default=True,
              help="Speed model (see `inferlab fit --help`).")
@click.option("--json", "as_json", is_flag=True)
@click.argument("engine_flags", nargs=-1, type=click.UNPROCESSED)
def diagnose(model, machine_name, engine, quant, observed_tok_s, observed_ttft_s, prompt_tokens, users, error_text, speed_name, as_json, engine_flags):
    """Diagnose MODEL on a machine run with ENGINE_FLAGS (after --, e.g. `-- -ngl 99 -c 32768 -ctk q8_0`)."""
    from ..api.diagnose import diagnose as run

    r = run(model, machine_name, flags=list(engine_flags), engine=engine, quant=quant, observed_tok_s=observed_tok_s,
            observed_ttft_s=observed_ttft_s, prompt_tokens=prompt_tokens, error=error_text, users=users, speed=speed_name)
    if as_json:
        echo_json(r)
        return
    from rich.console import Console

    con = Console()
    pred = f"{r.predicted_tok_per_s:.1f} tok/s" if r.predicted_tok_per_s else "does not run"
    con.print(f"[bold]{safe(r.model)}[/bold] on [bold]{safe(r.machine)}[/bold]: {safe(r.command)}", soft_wrap=True)
    con.print(f"  -ngl {r.n_gpu_layers}, -c {r.n_ctx:,}, KV {r.kv_type}: {'fits' if r.fits else 'does not fit: ' + safe(r.reason)}; predicted {pred}"
              + (f", TTFT {r.predicted_ttft_s:.2f} s" if r.predicted_ttft_s else ""))
    if not r.findings:
        con.print("no row of the symptom table applies")
    for f in r.findings:
        con.print(f"\n[bold]{safe(f.symptom)}[/bold] ({f.row})\n  cause: {safe(f.cause)}\n  here: {safe(f.evidence)}\n  fix: {safe(f.fix)}")
        for e in f.effects:
            con.print(f"  → {safe(e)}")
    for n in r.notes:
        con.print(f"[yellow]note[/yellow]: {safe(n)}")

"""`inferlab run` (generate text with the torch runtime, streamed, with TTFT and decode speed) and
`inferlab profile` (the KV-cache case study's sweep on a real model, beside perf_model)."""

from __future__ import annotations

import functools
import json
import os
import sys

import click

from ..errors import InvalidValueError, MissingDependencyError

SMALL_MODEL = "small"  # `inferlab profile small`: the case study's SmallTransformer, random weights


def _need_torch():
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError("torch", "the runtime", "runtime") from exc


def _int_list(name: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidValueError(f"--{name} takes comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise InvalidValueError(f"--{name} takes positive integers, got {text!r}")
    return values


@functools.lru_cache(maxsize=2)  # one load per process (tests invoke the command many times)
def _load_cached(model_path: str, mtime_ns: int, device: str, dtype: str, n_ctx: int | None):
    from ..runtime.device import select_device
    from ..runtime.llama import load_gguf

    return load_gguf(model_path, device=select_device(device), dtype=dtype, n_ctx=n_ctx)


def _load(model_path: str, device: str, dtype: str, n_ctx: int | None):
    if not os.path.isfile(model_path):
        raise InvalidValueError(f"model file {model_path!r} does not exist")
    path = os.path.abspath(model_path)
    return _load_cached(path, os.stat(path).st_mtime_ns, device, dtype, n_ctx)


_device_opt = click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
_dtype_opt = click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16", "int8", "int4"]), default="float32",
                          show_default=True, help="How weights are held in memory (int8: weight-only, per-row scales; "
                          "int4: groups of 32 as Q4_1, bf16 activations in the matmuls, CPU only).")


@click.command("run")
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("prompt")
@click.option("--max-tokens", default=64, show_default=True, type=int, help="Tokens to generate at most.")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 is greedy.")
@click.option("--top-k", default=0, type=int, help="Sample from the k most likely tokens (0: off).")
@click.option("--top-p", default=1.0, type=float, help="Nucleus sampling mass (1.0: off).")
@click.option("--seed", default=None, type=int, help="Seed for sampling.")
@click.option("--raw", is_flag=True, help="Skip the chat template: the prompt is the text.")
@click.option("--cache", "cache", default="contiguous", show_default=True, help="contiguous, paged, int8 or window:W.")
@click.option("--json", "as_json", is_flag=True, help="Print prompt ids, generated ids, text and timings as JSON.")
@_device_opt
@_dtype_opt
@click.pass_context
def run(ctx, model, prompt, max_tokens, temperature, top_k, top_p, seed, raw, cache, as_json, device, dtype):
    """Generate from a GGUF with inferlab's torch runtime: streamed text, TTFT, decode tok/s."""
    _need_torch()
    from ..runtime.generate import SamplingParams, generate
    from .common import strip_control, warn_ignored

    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    if sampling.greedy:
        warn_ignored(ctx, {k: "--temperature 0 is greedy (argmax); sampling options apply with --temperature > 0"
                           for k in ("top_k", "top_p", "seed")})
    if not prompt:
        raise InvalidValueError("the prompt is empty: give some text")
    llm, tok = _load(model, device, dtype, None)
    text = prompt if raw or not tok.chat_template else tok.apply_chat_template([{"role": "user", "content": prompt}])
    ids = tok.encode(text, special=not raw)
    stop = {tok.eos_id} if tok.eos_id is not None else set()
    out_ids: list[int] = []
    shown = [""]

    def stream(step, new):
        out_ids.append(new[0])
        if as_json:
            return
        full = tok.decode(out_ids, skip_special=True)
        if not full.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            sys.stdout.write(strip_control(full[len(shown[0]):]))  # a model's output may hold escape sequences
            sys.stdout.flush()
            shown[0] = full

    res = generate(llm, ids, max_tokens, sampling=sampling, cache=cache, stop_ids=stop, on_token=stream)
    timings = {"ttft_s": res.ttft_s, "prompt_tokens": len(ids), "prefill_tok_per_s": res.prefill_tok_per_s,
               "generated_tokens": res.n_generated, "decode_tok_per_s": res.decode_tok_per_s,
               "device": str(llm.device), "weights": dtype, "cache": res.cache, "finish_reason": res.finish_reason}
    if as_json:
        click.echo(json.dumps({"prompt": text, "prompt_ids": ids, "token_ids": list(res.token_ids[0]),
                               "text": tok.decode(res.token_ids[0], skip_special=True), "timings": timings}, indent=2))
        return
    click.echo()
    sys.stdout.flush()
    click.echo(f"TTFT {res.ttft_s * 1e3:.1f} ms ({len(ids)} prompt tokens, {res.prefill_tok_per_s:.0f} tok/s) · "
               f"decode {res.decode_tok_per_s:.1f} tok/s ({res.n_generated} tokens, {llm.device}, {dtype} weights, {res.cache} cache)",
               err=True)


PLOT_SUFFIXES = (".png", ".svg")


@click.command("profile")
@click.argument("model")
@click.option("--ctx", "ctx", default="64,128,256", show_default=True, help="Context lengths (prompt tokens), comma-separated.")
@click.option("--batch", "batch", default="1", show_default=True, help="Batch sizes, comma-separated.")
@click.option("--cache", "caches", default="contiguous", show_default=True,
              help="KV caches, comma-separated: contiguous, paged, int8, window:W.")
@click.option("--new-tokens", default=8, show_default=True, type=int, help="Tokens generated per run.")
@click.option("--no-naive", is_flag=True, help="Skip the naive (no cache) runs.")
@click.option("--quality/--no-quality", default=True, show_default=True,
              help="Measure int8/window quality cost (top-1, KL, perplexity) on a real text.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", "plot", type=click.Path(dir_okay=False), default=None, help="Write TTFT/step-time charts to FILE (.png or .svg).")
@_device_opt
@_dtype_opt
def profile(model, ctx, batch, caches, new_tokens, no_naive, quality, as_json, plot, device, dtype):
    """The KV-cache case study's sweep on MODEL (a GGUF, or 'small' for its SmallTransformer),
    each figure beside perf_model's prediction."""
    _need_torch()
    from ..fileio import check_output_path
    from ..runtime.device import device_name, select_device

    if plot:
        check_output_path(plot, PLOT_SUFFIXES, what="--plot")  # before the sweep, not after it
    from ..runtime.kv_cache import CacheSpec
    from ..runtime.predict import Predictor
    from ..runtime.profile import ProfileReport, profile_model

    contexts, batches = _int_list("ctx", ctx), _int_list("batch", batch)
    specs = [CacheSpec.parse(c) for c in caches.split(",") if c.strip()]
    dev = select_device(device)
    tok = None
    if model == SMALL_MODEL:
        import torch

        from ..runtime.small_transformer import SmallTransformer

        torch.manual_seed(42)  # the case study's seed
        llm = SmallTransformer().to(dev).eval()
        name = "SmallTransformer (case study, random weights)"
    else:
        if not os.path.isfile(model):
            raise InvalidValueError(f"model {model!r} is neither a GGUF file nor {SMALL_MODEL!r} (the case study's SmallTransformer)")
        llm, tok = _load(model, device, dtype, None)
        name = llm.config.name or os.path.basename(model)
    predictor = Predictor.for_model(llm, dev)
    progress = None if as_json else (lambda r: click.echo(f"  measured ctx={r.context} batch={r.batch} cache={r.cache}", err=True))
    rows = profile_model(llm, contexts, batches, specs, n_new_tokens=new_tokens, naive=not no_naive, predictor=predictor, progress=progress)
    lossy = [s for s in specs if s.kind in ("int8", "window")]
    costs, quality_text = (), ""
    if quality and lossy:
        from ..runtime.quality import CASE_STUDY_TEXT, quality_cost

        if tok is not None:
            ids = tok.encode(CASE_STUDY_TEXT)
            quality_text = f"the case study's own prose, {len(ids)} tokens"
        else:  # random weights: any token sequence is as "real" as another
            import torch

            ids = torch.randint(0, llm.config.vocab_size, (256,), generator=torch.Generator().manual_seed(0)).tolist()
            quality_text = "256 random tokens (the model has random weights)"
        costs = tuple(quality_cost(llm, ids, lossy))
    report = ProfileReport(model=name, device=f"{dev.type}: {device_name(dev)}", weight_dtype=dtype if tok else "float32",
                           prediction_note=predictor.note, rows=tuple(rows), quality=costs,
                           quality_text=quality_text)
    if plot:
        _plot(report, plot)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print_report(report)


def _fmt(v, spec=".1f", none="—"):
    return none if v is None else format(v, spec)


def _pct(v):
    return "—" if v is None else f"{v:+.0%}"


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    from .common import safe

    console = Console(width=None if sys.stdout.isatty() else 200)  # pipes get the full table
    console.print(f"[bold]{safe(report.model)}[/] on {safe(report.device)}, {report.weight_dtype} weights")
    t = Table(title="Naive vs cached (ms); pred = perf_model, err = (pred - measured) / measured")
    for col in ("ctx", "B", "cache", "naive TTFT", "naive step", "pred", "prefill", "pred", "err", "step", "pred", "err",
                "speedup", "tok/s", "GB/s"):
        t.add_column(col, justify="right")
    for r in report.rows:
        t.add_row(str(r.context), str(r.batch), r.cache, _fmt(r.naive_ttft_ms), _fmt(r.naive_mean_step_ms),
                  _fmt(r.predicted_naive_step_ms), _fmt(r.cached_prefill_ms), _fmt(r.predicted_prefill_ms), _pct(r.prefill_error),
                  _fmt(r.cached_mean_step_ms, ".2f"), _fmt(r.predicted_step_ms, ".2f"), _pct(r.step_error),
                  _fmt(r.speedup, ".1f") + ("x" if r.speedup else ""), _fmt(r.decode_tok_per_s), _fmt(r.achieved_gbps, ".2f"))
    console.print(t)
    m = Table(title="Memory (MB = 10^6 bytes): exact tensor bytes, measured peak")
    for col in ("ctx", "B", "cache", "weights", "KV cache", "activations", "peak"):
        m.add_column(col, justify="right")
    for r in report.rows:
        m.add_row(str(r.context), str(r.batch), r.cache, f"{r.weights_bytes / 1e6:.1f}", f"{r.kv_cache_bytes / 1e6:.2f}",
                  f"{r.activations_bytes / 1e6:.1f}", f"{r.peak_bytes / 1e6:.1f}")
    m.caption = (f"peak: {report.rows[0].peak_source}; activations: peak bytes of the tensors a generation creates "
                 "beyond the KV cache (exact, every storage counted)") if report.rows else None
    console.print(m)
    if report.quality:
        q = Table(title=f"Quality cost vs the fp32 cache, on {report.quality_text}")
        for col in ("cache", "tokens", "top-1 agree", "KL mean (nats)", "KL max", "ppl fp32", "ppl", "ppl change", "cache MB"):
            q.add_column(col, justify="right")
        for c in report.quality:
            q.add_row(c.cache, str(c.n_tokens), f"{c.top1_agreement:.1%}", f"{c.kl_mean_nats:.2e}", f"{c.kl_max_nats:.2e}",
                      f"{c.perplexity_ref:.2f}", f"{c.perplexity:.2f}", f"{c.perplexity_change:+.2%}", f"{c.cache_bytes / 1e6:.2f}")
        console.print(q)
    console.print(f"[dim]{report.prediction_note}[/]")


def _plot(report, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("matplotlib", "--plot", "plot") from exc
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    groups: dict = {}
    for r in report.rows:
        groups.setdefault((r.batch, r.cache), []).append(r)
    for (b, cache), rows in groups.items():
        ctx = [r.context for r in rows]
        axes[0].plot(ctx, [r.cached_prefill_ms for r in rows], "s-", label=f"cached prefill B={b} {cache}")
        axes[1].plot(ctx, [r.cached_mean_step_ms for r in rows], "s-", label=f"cached step B={b} {cache}")
        if rows[0].naive_ttft_ms is not None:
            axes[0].plot(ctx, [r.naive_ttft_ms for r in rows], "o-", label=f"naive TTFT B={b}")
            axes[1].plot(ctx, [r.naive_mean_step_ms for r in rows], "o-", label=f"naive step B={b}")
        if rows[0].predicted_step_ms is not None:
            axes[0].plot(ctx, [r.predicted_prefill_ms for r in rows], "k:", label=f"perf_model prefill B={b} {cache}")
            axes[1].plot(ctx, [r.predicted_step_ms for r in rows], "k:", label=f"perf_model step B={b} {cache}")
    axes[0].set_title("First-token latency vs context")
    axes[1].set_title("Per-step decode latency vs context")
    for ax in axes:
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("ms")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{report.model} on {report.device}")
    fig.tight_layout()
    from ..fileio import atomic_write

    try:
        atomic_write(path, lambda f: fig.savefig(f, dpi=120, format=str(path).rsplit(".", 1)[-1].lower()))
    finally:
        plt.close(fig)

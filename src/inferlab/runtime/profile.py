"""The case study's profiling sweep on a real model: per context length, batch size and KV cache,
naive vs cached TTFT and mean step time, the speedup, memory split into weights, KV cache and
activations, and perf_model's prediction with its error beside each measurement."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import cast

import torch

from ..errors import InvalidValueError, check_positive
from .device import PeakMemory, TensorBytesPeak
from .generate import generate
from .kv_cache import CacheSpec
from .predict import Predictor, relative_error


@dataclass(frozen=True)
class ProfileRow:
    context: int
    batch: int
    cache: str
    n_new_tokens: int
    naive_ttft_ms: float | None  # None when the naive run was skipped (only the first cache runs it)
    naive_mean_step_ms: float | None
    cached_prefill_ms: float
    cached_mean_step_ms: float
    weights_bytes: int  # exact tensor bytes
    kv_cache_bytes: int  # exact tensor bytes of the cache
    activations_bytes: int  # exact: peak bytes of the tensors a generation creates, beyond the KV cache
    peak_bytes: int  # measured: torch.cuda max allocated, or process peak RSS
    peak_source: str
    decode_bytes_per_step: int  # weights + KV the runtime streams per decode step (exact tensor bytes)
    predicted_prefill_ms: float | None = None
    predicted_step_ms: float | None = None
    predicted_naive_step_ms: float | None = None

    @property
    def speedup(self) -> float | None:
        if self.naive_mean_step_ms is None or not self.cached_mean_step_ms:
            return None
        return self.naive_mean_step_ms / self.cached_mean_step_ms

    @property
    def decode_tok_per_s(self) -> float:
        return self.batch * 1e3 / self.cached_mean_step_ms if self.cached_mean_step_ms else float("nan")

    @property
    def achieved_gbps(self) -> float:
        return self.decode_bytes_per_step / (self.cached_mean_step_ms * 1e-3) / 1e9 if self.cached_mean_step_ms else float("nan")

    @property
    def prefill_error(self) -> float | None:
        return relative_error(self.cached_prefill_ms, self.predicted_prefill_ms)

    @property
    def step_error(self) -> float | None:
        return relative_error(self.cached_mean_step_ms, self.predicted_step_ms)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(speedup=self.speedup, decode_tok_per_s=self.decode_tok_per_s, achieved_gbps=self.achieved_gbps,
                 prefill_error=self.prefill_error, step_error=self.step_error)
        return d


@dataclass(frozen=True)
class ProfileReport:
    model: str
    device: str
    weight_dtype: str
    prediction_note: str
    rows: tuple[ProfileRow, ...]
    quality: tuple = field(default=())  # QualityCost per lossy cache
    quality_text: str = ""  # what the quality was measured on

    def as_dict(self) -> dict:
        return {"model": self.model, "device": self.device, "weight_dtype": self.weight_dtype,
                "prediction_note": self.prediction_note, "rows": [r.as_dict() for r in self.rows],
                "quality": [dict(asdict(q), perplexity_change=q.perplexity_change) for q in self.quality],
                "quality_text": self.quality_text}


def _kv_read_bytes(spec: CacheSpec, cache_bytes: int, capacity: int, context: int) -> int:
    """KV bytes one decode step reads: the cache's bytes per stored position times the positions
    attended (the window caps them)."""
    if spec.kind == "window" and spec.window:
        return int(cache_bytes / spec.window * min(context, spec.window))
    slots = -(-capacity // spec.block_size) * spec.block_size if spec.kind == "paged" and spec.block_size else capacity
    return int(cache_bytes / slots * context)


def _check_memory(model, tokens: int, batch: int) -> None:
    """Refuse, before any allocation, a sweep whose KV cache alone would not fit in this
    machine's memory (a typo like --batch 99999999999 asked torch for 6.4 TB)."""
    import os

    # the config's kv_bytes_per_token(dtype_bytes) (small_transformer, gguf_weights), when it has one
    per_token = cast("Callable[[int], int] | None", getattr(model.config, "kv_bytes_per_token", None))
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    need = batch * tokens * (int(per_token(4)) if callable(per_token) else 0)
    if need > ram:
        raise InvalidValueError(f"batch {batch:,} x {tokens:,} tokens needs {need / 1e9:,.1f} GB of fp32 KV cache; "
                                f"this machine has {ram / 1e9:.1f} GB: lower --batch or --ctx")


def profile_model(model, contexts=(64, 128, 256), batches=(1,), caches=("contiguous",), *, n_new_tokens: int = 8,
                  naive: bool = True, predictor: Predictor | None = None, seed: int = 0, n_warmup: int = 1,
                  progress=None) -> list[ProfileRow]:
    """Measure every (context, batch, cache). The naive run (cache-independent) happens once per
    (context, batch), with the first cache."""
    check_positive("n_new_tokens", n_new_tokens)
    specs = [CacheSpec.parse(c) if isinstance(c, str) else c for c in caches]
    if not specs:
        raise InvalidValueError("give at least one KV cache kind")
    for ctx in contexts:
        check_positive("context", ctx)
        if ctx + n_new_tokens > model.n_ctx:
            raise InvalidValueError(f"context {ctx} + {n_new_tokens} new tokens exceeds the model's context of {model.n_ctx}")
    for batch in batches:
        check_positive("batch", batch)
    _check_memory(model, max(contexts, default=0) + n_new_tokens, max(batches, default=1))
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        warm = torch.randint(0, model.config.vocab_size, (1, min(32, model.n_ctx)), generator=gen).to(model.device)
        for _ in range(n_warmup):
            model.step(warm)
    rows = []
    for batch in batches:
        check_positive("batch", batch)
        for ctx in contexts:
            prompt = torch.randint(0, model.config.vocab_size, (batch, ctx), generator=gen).to(model.device)
            naive_res = generate(model, prompt, n_new_tokens, mode="naive") if naive else None
            for spec in specs:
                with PeakMemory(model.device) as mem:
                    res = generate(model, prompt, n_new_tokens, mode="cached", cache=spec)
                # exact tensor bytes on a pass of their own (counting slows every op): the prefill
                # and two decode steps; activations peak in the prefill, the cache lives throughout
                with TensorBytesPeak() as tensors:
                    counted = generate(model, prompt, min(n_new_tokens, 3), mode="cached", cache=spec)
                mid_ctx = ctx + n_new_tokens // 2  # the mean context a decode step attends to
                row = ProfileRow(
                    context=ctx, batch=batch, cache=spec.label, n_new_tokens=n_new_tokens,
                    naive_ttft_ms=naive_res.ttft_s * 1e3 if naive_res and spec is specs[0] else None,
                    naive_mean_step_ms=statistics.fmean(naive_res.step_times_s) * 1e3 if naive_res and spec is specs[0] else None,
                    cached_prefill_ms=res.ttft_s * 1e3,
                    cached_mean_step_ms=statistics.fmean(res.step_times_s) * 1e3 if res.step_times_s else 0.0,
                    weights_bytes=model.weight_bytes,
                    kv_cache_bytes=res.cache_bytes,
                    activations_bytes=tensors.peak_bytes - counted.cache_bytes,  # that pass's own (smaller) cache
                    peak_bytes=mem.peak_bytes,
                    peak_source=mem.source,
                    decode_bytes_per_step=model.decode_weight_bytes + _kv_read_bytes(spec, res.cache_bytes, ctx + n_new_tokens, mid_ctx),
                )
                if predictor is not None and predictor.available:
                    row = _with_predictions(row, predictor, spec, mid_ctx)
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def _with_predictions(row: ProfileRow, predictor: Predictor, spec: CacheSpec, mid_ctx: int) -> ProfileRow:
    from dataclasses import replace

    step = predictor.decode_step_s(mid_ctx, row.batch, spec.kind, spec.window)
    prefill = predictor.prefill_s(row.context, row.batch, spec.kind)
    naive = predictor.naive_mean_step_s(row.context, row.n_new_tokens, row.batch) if row.naive_mean_step_ms is not None else None
    ms = lambda s: None if s is None else s * 1e3  # noqa: E731
    return replace(row, predicted_prefill_ms=ms(prefill), predicted_step_ms=ms(step), predicted_naive_step_ms=ms(naive))

"""``capacity(model, machine, engine=...) -> CapacityReport``: concurrent sessions that fit, per KV strategy.

The case study's bare formula (GPU memory − weights) / (2·L·H·d·n·b) beside the engine's own
accounting (vLLM's profiled pool, SGLang's static fraction, llama.cpp's -c shared by -np slots),
see ``advise.capacity``. Weights and placements come from ``configure`` (one source of truth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..advise.capacity import StrategyRow, bytes_per_value, strategy_rows, target_advice
from ..kv.pool import (LlamacppPool, SglangPool, VllmPool, engine_kv_type, kv_values_per_token, llamacpp_max_sessions, llamacpp_pool,
                       sglang_pool, vllm_pool)
from ..advise.flags import ENGINES, flag_table
from ..errors import InvalidValueError, UnknownNameError, check_positive
from ..perf.placement import GB, gpu_capacity_bytes
from ..quant.plan import weight_bytes
from .report import Figure, Report
from .setup import configure

DEFAULT_CONTEXTS = (2000, 4000, 8000)
DEFAULT_KV = ("f16", "int8")


@dataclass(frozen=True)
class KvPerToken:
    kv_type: str
    bytes_per_value: float
    bytes_per_token: float  # all layers, K and V


@dataclass(frozen=True)
class TargetCheck:
    strategy: str
    context_tokens: int
    kv_bytes_per_session: float
    footprint_at_target_bytes: float  # target sessions x per session
    sessions: int  # that fit (bare formula)
    engine_sessions: int | None
    reached: bool
    advice: str  # what would reach the target, when it is out of reach


@dataclass(frozen=True)
class CapacityReport(Report):
    model: str
    machine: str
    engine: str
    engine_version: str
    quant: str
    gpu_bytes: float
    weights_bytes: float
    weights_origin: str  # "estimated" (the tensor plan) or "assumed" (given by the caller)
    budget_bytes: float  # GPU memory − weights: what the bare formula shares out
    contexts: tuple[int, ...]
    window: int | None
    kv_per_token: tuple[KvPerToken, ...]
    rows: tuple[StrategyRow, ...]
    pool: VllmPool | SglangPool | LlamacppPool | None  # the engine's own reservations at the largest context, baseline KV
    target_sessions: int | None
    target_checks: tuple[TargetCheck, ...]
    notes: tuple[str, ...]
    figures: tuple[Figure, ...]


def _contexts(contexts) -> tuple[int, ...]:
    cs = tuple(contexts)
    if not cs:
        raise InvalidValueError("give at least one context length")
    for c in cs:
        if isinstance(c, bool) or not isinstance(c, int) or c <= 0:
            raise InvalidValueError(f"context lengths must be integers > 0 tokens, got {c!r}")
    return cs


def capacity(model: Any, machine: Any, *, engine: str = "vllm", contexts=DEFAULT_CONTEXTS, kv_types=DEFAULT_KV,
             window: int | None = None, target_sessions: int | None = None, quant: Any = None, weights_gb: float | None = None,
             gpu_memory_utilization: float | None = None, mem_fraction_static: float | None = None) -> CapacityReport:
    """Concurrent sessions of each context that fit on ``machine``'s GPU, per KV strategy, for ``engine``."""
    if engine not in ENGINES:
        raise UnknownNameError("engine", engine, ENGINES)
    cs = _contexts(contexts)
    kvs = tuple(k.lower() for k in kv_types)
    if not kvs:
        raise InvalidValueError("give at least one KV cache type")
    for k in kvs:
        bytes_per_value(k)  # unknown names raise here
    if window is not None:
        check_positive("window", window)
        if not isinstance(window, int):
            raise InvalidValueError(f"window must be an integer number of tokens, got {window!r}")
    if target_sessions is not None:
        check_positive("target_sessions", target_sessions)
    if weights_gb is not None:
        check_positive("weights_gb", weights_gb)
    if quant is None and engine != "llamacpp":
        quant = "type:F16"  # a Hugging Face checkpoint in 16-bit
    setup = configure(model, machine, quant=quant, n_ctx=max(cs), profile=False)
    spec, m = setup.spec, setup.machine
    if not m.gpus:
        if engine != "llamacpp":
            raise InvalidValueError(f"{engine} needs a GPU; {m.name} has none (try --engine llamacpp)")
    gpu = gpu_capacity_bytes(m.gpus[0], m) if m.gpus else m.ram.memory_gb * GB
    w = weights_gb * GB if weights_gb is not None else float(weight_bytes(spec, setup.scheme)["total"])
    budget = gpu - w
    notes = []
    if budget <= 0:
        notes.append(f"the weights ({w / GB:.1f} GB) do not fit in {gpu / GB:.1f} GB: no session fits on this GPU")
    if any(spec.swa_layers):
        notes.append(f"{sum(spec.swa_layers)} of {spec.n_layers} layers use a {spec.sliding_window}-token sliding window: the formula "
                     + ("and this vLLM/SGLang estimate count" if engine != "llamacpp" else "counts")
                     + " them in full (an upper bound on the cache); llama.cpp's placement keeps only the window there")
    if max(cs) > spec.n_ctx_train:
        notes.append(f"contexts above {spec.name}'s trained length ({spec.n_ctx_train:,} tokens) need RoPE scaling; "
                     f"vLLM refuses a --max-model-len above it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    rows = strategy_rows(spec, m, setup.scheme, engine, cs, kvs, window, budget, target_sessions) if m.gpus or engine == "llamacpp" else ()
    per_tok = tuple(KvPerToken(k, bytes_per_value(k), kv_values_per_token(spec) * bytes_per_value(k)) for k in kvs)
    pool = None
    base_kv = engine_kv_type(engine, kvs[0]) or ("f16" if engine == "llamacpp" else "auto")
    if m.gpus and budget > 0:
        if engine == "vllm":
            pool = vllm_pool(spec, m, setup.scheme, base_kv, max(cs), gpu_memory_utilization=gpu_memory_utilization or 0.92)
        elif engine == "sglang":
            pool = sglang_pool(spec, m, setup.scheme, base_kv, mem_fraction_static=mem_fraction_static)
        else:
            s = llamacpp_max_sessions(spec, m, setup.scheme, base_kv, max(cs))
            pool = llamacpp_pool(spec, m, setup.scheme, base_kv, max(cs), max(s, 1))
        if pool is not None and getattr(pool, "kv_bytes", 1) <= 0:
            notes.append(f"{engine} has no room for a KV pool after its reservations")
    checks = []
    if target_sessions is not None:
        for r in rows:
            for c in r.cells:
                reached = c.sessions >= target_sessions
                adv = "" if reached else target_advice(spec, budget, gpu, w, target_sessions, c.context_tokens, r.window, (r.kv_type,))
                checks.append(TargetCheck(r.strategy, c.context_tokens, c.kv_bytes_per_session, target_sessions * c.kv_bytes_per_session,
                                          c.sessions, c.engine_sessions, reached, adv))
        if not any(c.reached for c in checks if c.context_tokens == max(cs)):
            notes.append(f"no strategy reaches {target_sessions} sessions at {max(cs):,} tokens; "
                         + target_advice(spec, budget, gpu, w, target_sessions, max(cs), window, kvs))
        for c in checks:
            if "int8" in c.strategy and "window" in c.strategy and c.context_tokens == max(cs):
                notes.append(f"{c.strategy} at {c.context_tokens:,} tokens: {c.kv_bytes_per_session / GB:.2f} GB per session, "
                             f"{target_sessions} sessions need {c.footprint_at_target_bytes / GB:.1f} GB of KV cache "
                             f"(not 'under 3 GB', as the case study's summary says); {c.sessions} fit in the "
                             f"{budget / GB:.1f} GB left after the weights")
    figs = (Figure("GPU memory", gpu / GB, "GB", "catalog", m.gpus[0].source if m.gpus else m.ram.source),
            Figure("weights", w / GB, "GB", "assumed" if weights_gb is not None else "estimated",
                   "given by the caller" if weights_gb is not None else "inferlab's tensor plan of the quantization"),
            Figure("model dimensions", spec.name, "", "catalog" if not spec.tensors else "file", spec.source))
    return CapacityReport(spec.name, m.name, engine, flag_table(engine).version, setup.scheme.label if setup.scheme else "file",
                          gpu, w, "assumed" if weights_gb is not None else "estimated", budget, cs, window, per_tok, rows, pool,
                          target_sessions, tuple(checks), tuple(notes), figs)

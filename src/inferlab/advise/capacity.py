"""How many concurrent sessions fit: the case study's bare formula beside each engine's own accounting.

* Bare formula (the case study, 004_…): KV bytes per session = 2 · L · H · d · n · b (MHA: H = all
  heads; inferlab counts the model's KV heads, which is the same for MHA), sessions =
  floor((GPU memory − weights) / per session). Its int8 factor is 0.5 (one byte per value, scales
  not counted); a window W caps n at W.
Each engine's accounting lives in ``kv.pool`` (the simulator sizes its pools with the same functions):
* vLLM 0.33 (vllm/v1/worker/gpu_worker.py determine_available_memory, v1/core/kv_cache_utils.py):
  requested = --gpu-memory-utilization × total memory; KV = requested − weights − peak activations
  (a profile run of max_num_batched_tokens tokens) − non-torch memory − the CUDA-graph estimate
  (applied by default: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1; none with --enforce-eager);
  blocks of 16 tokens; it logs "GPU KV cache size: N tokens, Maximum concurrency for M tokens per
  request: X.XXx" with X = blocks / ceil(M / 16) and N = int(X · M).
* SGLang 0.5.23 (python/sglang/srt/arg_groups/memory_hook.py): --mem-fraction-static defaults to
  (memory − reserved) / memory, reserved (MiB) = 512 + 1.5 · max(chunked_prefill_size, 2048) +
  tp·pp/8·1024 + 2 · cuda_graph_max_bs (at least 10 GiB above 60 GiB), chunked_prefill_size and
  max_bs by GPU memory; the pool is mem_fraction_static × memory − weights, token-granular; the
  scheduler logs "max_total_num_tokens=N".
* llama.cpp: -c cells shared by -np slots (unified with -kvu: any slot may use all; split: -c/-np
  each); sessions = the largest -np whose full offload at -c = np × n still fits (``place``).
Memory is the catalog's GB (10^9 bytes), as ``perf.placement`` counts it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnknownNameError
from ..hardware.device import Machine
from ..models.spec import ModelSpec
from ..perf.kv_size import KV_TYPES
from ..perf.placement import GB
from ..kv.pool import (KV_ALIASES, VLLM_BLOCK_SIZE, VLLM_CUDA_GRAPH_BYTES, VLLM_GPU_MEMORY_UTILIZATION,  # noqa: F401 (re-exported)
                       VLLM_NON_TORCH_BYTES, LlamacppPool, SglangPool, VllmPool, engine_kv_type, kv_values_per_token,
                       llamacpp_max_sessions, llamacpp_pool, sglang_defaults, sglang_pool, vllm_batch_defaults, vllm_pool)

GiB = 2**30
BARE_BYTES_PER_VALUE = {"f16": 2.0, "bf16": 2.0, "fp16": 2.0, "f32": 4.0, "int8": 1.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}


def bytes_per_value(kv: str) -> float:
    """Bytes of one cached value: the case study's dtype bytes (int8 = 1, no scales) or a GGML cache type's true block size."""
    k = kv.lower()
    if k in BARE_BYTES_PER_VALUE:
        return BARE_BYTES_PER_VALUE[k]
    from ..perf.kv_size import kv_bytes_per_value

    if k not in KV_TYPES:
        raise UnknownNameError("KV cache type", kv, sorted(set(KV_TYPES) | set(BARE_BYTES_PER_VALUE)))
    return kv_bytes_per_value(k)


@dataclass(frozen=True)
class StrategyCell:
    context_tokens: int
    effective_tokens: int  # min(context, window)
    kv_bytes_per_session: float
    sessions: int  # the bare formula
    engine_sessions: int | None  # the engine's own accounting (None: the engine cannot do this strategy)
    meets_target: bool | None


@dataclass(frozen=True)
class StrategyRow:
    strategy: str
    kv_type: str  # as asked (f16, int8, q8_0...)
    engine_kv_type: str | None  # the engine's name for it
    window: int | None
    cells: tuple[StrategyCell, ...]
    note: str


def strategy_rows(spec: ModelSpec, machine: Machine, scheme, engine: str, contexts: tuple[int, ...], kv_types: tuple[str, ...],
                  window: int | None, budget_bytes: float, target: int | None) -> tuple[StrategyRow, ...]:
    """The case study's strategy table: each KV type, with and without the window, per context."""
    values = kv_values_per_token(spec)
    rows = []
    for kv in kv_types:
        for w in ((None, window) if window else (None,)):
            ek = engine_kv_type(engine, kv)
            note = ""
            if ek is None:
                note = f"{engine} has no {kv} KV cache" + (" (fp8 is vLLM's and SGLang's; llama.cpp: q8_0)" if kv.startswith("fp8") else "")
            elif w is not None and engine != "llamacpp":
                note = (f"{engine} keeps every token of a full-attention model; no flag evicts to a {w}-token window "
                        "(only models trained with sliding-window attention get one)")
            elif w is not None:
                note = f"llama.cpp: -c {w} per slot with --context-shift drops the oldest tokens when a slot is full"
            if ek is not None and ek != kv and not note:
                note = f"{engine} spells it {ek}" + (" (8.5 bits a value with its scales)" if ek == "q8_0" else "")
                if engine == "vllm" and kv == "int8":
                    note += " (0.33 also has int8_per_token_head: one byte a value plus a scale per token and head)"
            cells = []
            for n in contexts:
                eff = min(n, w) if w else n
                per = values * bytes_per_value(kv) * eff
                bare = int(budget_bytes // per) if per > 0 and budget_bytes > 0 else 0
                eng = None
                if ek is not None and (w is None or engine == "llamacpp"):
                    eng = engine_sessions(spec, machine, scheme, engine, ek, eff)
                cells.append(StrategyCell(n, eff, per, bare, eng, None if target is None else bare >= target))
            label = ("baseline " if kv in ("f16", "auto") and w is None else "") + f"{kv} KV" + (f" + window W={w}" if w else "")
            rows.append(StrategyRow(label, kv, ek, w, tuple(cells), note))
    return tuple(rows)


def engine_sessions(spec: ModelSpec, machine: Machine, scheme, engine: str, engine_kv: str, context: int) -> int:
    """Sessions of ``context`` tokens that fit by the engine's own accounting."""
    if engine == "llamacpp":
        return llamacpp_max_sessions(spec, machine, scheme, engine_kv, context)
    if not machine.gpus:
        return 0
    if engine == "vllm":
        pool = vllm_pool(spec, machine, scheme, engine_kv, context)
        return int(pool.max_concurrency)
    pool = sglang_pool(spec, machine, scheme, engine_kv)
    return pool.max_total_num_tokens // context


def target_advice(spec: ModelSpec, budget_bytes: float, gpu_bytes: float, weights: float, target: int, context: int,
                  window: int | None, kv_types: tuple[str, ...]) -> str:
    """Why ``target`` sessions of ``context`` tokens are out of reach, and what would reach them."""
    values = kv_values_per_token(spec)
    eff = min(context, window) if window else context
    best_kv = min(kv_types, key=bytes_per_value)
    per = values * bytes_per_value(best_kv) * eff
    need = target * per
    parts = [f"{target} sessions x {eff:,} tokens at {best_kv} need {need / GB:.1f} GB of KV cache, "
             f"{budget_bytes / GB:.1f} GB is left after {weights / GB:.1f} GB of weights"]
    max_tokens = int(budget_bytes // (values * bytes_per_value(best_kv) * target)) if budget_bytes > 0 else 0
    parts.append(f"at {best_kv} {target} sessions fit up to {max_tokens:,} tokens each")
    parts.append(f"or a GPU with {(need + weights) / GB:.0f} GB")
    if spec.n_kv_heads == spec.n_heads:
        parts.append(f"a GQA model with {spec.n_heads // 4} KV heads would need 4x less")
    return "; ".join(parts)

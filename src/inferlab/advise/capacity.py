"""How many concurrent sessions fit: the case study's bare formula beside each engine's own accounting.

* Bare formula (the case study, 004_…): KV bytes per session = 2 · L · H · d · n · b (MHA: H = all
  heads; inferlab counts the model's KV heads, which is the same for MHA), sessions =
  floor((GPU memory − weights) / per session). Its int8 factor is 0.5 (one byte per value, scales
  not counted); a window W caps n at W.
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

import math
from dataclasses import dataclass

from ..errors import InvalidValueError, UnknownNameError, check_positive
from ..hardware.device import Machine
from ..models.spec import ModelSpec
from ..perf.kv_size import KV_PAD_TOKENS, KV_TYPES, kv_bytes_per_token
from ..perf.placement import GB, MiB, compute_buffer_bytes, gpu_capacity_bytes, place
from ..quant.plan import weight_bytes

GiB = 2**30
VLLM_GPU_MEMORY_UTILIZATION = 0.92  # vllm CacheConfig.gpu_memory_utilization default (data/engines/vllm.json)
VLLM_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
VLLM_CUDA_GRAPH_BYTES = 0.5 * GiB  # assumed: vLLM profiles it at startup (profile_cudagraph_memory); typical 0.2-1 GiB
VLLM_NON_TORCH_BYTES = 0.25 * GiB  # assumed: NCCL/cuBLAS workspaces counted in non_kv_cache_memory
# the engines' names for a KV type the case study calls "int8" (one byte per value)
KV_ALIASES = {
    "llamacpp": {"int8": "q8_0", "fp8": None, "f16": "f16", "auto": "f16"},
    "vllm": {"int8": "fp8", "q8_0": "fp8", "f16": "auto", "auto": "auto", "fp8": "fp8"},
    "sglang": {"int8": "fp8_e4m3", "q8_0": "fp8_e4m3", "fp8": "fp8_e4m3", "f16": "auto", "auto": "auto"},
}
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


def kv_values_per_token(spec: ModelSpec) -> float:
    """K and V values one token adds over all layers: 2 · L · n_kv · d_head for plain attention."""
    return kv_bytes_per_token(spec, "f16") / 2.0  # perf.kv_size in f16 (2 bytes a value), back to values


def engine_kv_type(engine: str, kv: str) -> str | None:
    """The engine's own name for a KV type (None: the engine has no such cache type)."""
    k = kv.lower()
    table = KV_ALIASES.get(engine, {})
    if k in table:
        return table[k]
    if engine == "llamacpp":
        return k if k in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1") else None
    if k in ("fp8_e4m3", "fp8_e5m2"):
        return k
    return None


def _engine_value_bytes(engine: str, kv_name: str) -> float:
    if engine == "llamacpp":
        return bytes_per_value(kv_name)
    return 2.0 if kv_name == "auto" else 1.0  # fp8 variants: one byte a value


@dataclass(frozen=True)
class VllmPool:
    total_bytes: float
    gpu_memory_utilization: float
    requested_bytes: float
    weights_bytes: float
    activation_bytes: float  # peak of the profile run (estimated: FFN intermediates + logits)
    non_torch_bytes: float  # assumed
    cuda_graph_bytes: float  # assumed (0 with --enforce-eager)
    kv_bytes: float
    block_size: int
    num_blocks: int
    max_model_len: int
    max_concurrency: float
    kv_tokens: int
    max_num_batched_tokens: int
    max_num_seqs: int
    log_line: str


@dataclass(frozen=True)
class SglangPool:
    total_bytes: float
    mem_fraction_static: float
    reserved_mib: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    weights_bytes: float
    kv_bytes: float
    max_total_num_tokens: int
    log_line: str


@dataclass(frozen=True)
class LlamacppPool:
    n_ctx: int  # -c
    n_parallel: int  # -np
    unified: bool
    per_slot_ctx: int
    fits: bool
    n_gpu_layers: int
    gpu_bytes: float
    kv_bytes: float
    log_line: str


def vllm_batch_defaults(total_bytes: float, device_name: str = "") -> tuple[int, int]:
    """max_num_batched_tokens and max_num_seqs of `vllm serve` (vllm/engine/arg_utils.py get_batch_defaults, API server):
    16384 / 1024 from 160 GiB; 8192 / 1024 from 70 GiB except on an A100; else 2048 / 256."""
    if total_bytes >= 160 * GiB:
        return 16384, 1024
    if total_bytes >= 70 * GiB and "a100" not in device_name.lower():
        return 8192, 1024
    return 2048, 256


def vllm_pool(spec: ModelSpec, machine: Machine, scheme, kv_type: str = "auto", max_model_len: int | None = None, *,
              gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION, enforce_eager: bool = False,
              max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None) -> VllmPool:
    """vLLM's KV pool for ``spec`` on the machine's first GPU (see the module docstring)."""
    if not machine.gpus:
        raise InvalidValueError(f"vLLM needs a GPU; {machine.name} has none (llama.cpp runs on CPUs)")
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    total = gpu_capacity_bytes(machine.gpus[0], machine)
    mnbt, mns = vllm_batch_defaults(total, machine.gpus[0].name)
    mnbt, mns = max_num_batched_tokens or mnbt, max_num_seqs or mns
    mml = max_model_len or spec.n_ctx_train
    check_positive("max_model_len", mml)
    weights = weight_bytes(spec, scheme)["total"]  # every tensor on the GPU, embeddings included
    # profile run: the FFN's intermediates for mnbt tokens, logits for the sampled rows (f32, as placement counts them)
    activations = compute_buffer_bytes(spec, mnbt, False) + min(mns, mnbt) * 4 * spec.vocab_size
    graphs = 0.0 if enforce_eager else VLLM_CUDA_GRAPH_BYTES
    requested = gpu_memory_utilization * total
    kv = requested - weights - activations - VLLM_NON_TORCH_BYTES - graphs
    page = VLLM_BLOCK_SIZE * kv_values_per_token(spec) * _engine_value_bytes("vllm", kv_type)  # one block of every layer
    blocks = max(0, int(kv // page))
    conc = blocks / math.ceil(mml / VLLM_BLOCK_SIZE)
    tokens = int(conc * mml)
    line = f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for {mml:,} tokens per request: {conc:.2f}x"
    return VllmPool(total, gpu_memory_utilization, requested, weights, activations, VLLM_NON_TORCH_BYTES, graphs, kv,
                    VLLM_BLOCK_SIZE, blocks, mml, conc, tokens, mnbt, mns, line)


def sglang_defaults(total_bytes: float, tp: int = 1) -> tuple[float, float, int, int]:
    """SGLang's default mem_fraction_static, reserved MiB, chunked_prefill_size and decode CUDA-graph max_bs
    for a GPU of ``total_bytes`` (memory_hook.py _handle_gpu_memory_settings, prefill graphs off)."""
    mib = total_bytes / MiB
    if mib < 20 * 1024:
        chunk, bs = 2048, 8
    elif mib < 35 * 1024:
        chunk, bs = 4096, 48 if tp < 4 else 160
    elif mib < 60 * 1024:
        chunk, bs = 4096, 32 if tp < 4 else 160
    else:
        chunk, bs = 8192, 256 if tp < 4 else 512
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + bs * 2  # metadata + activations + parallel slack + decode graphs
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3), reserved, chunk, bs


def sglang_pool(spec: ModelSpec, machine: Machine, scheme, kv_type: str = "auto", *, mem_fraction_static: float | None = None,
                context_length: int | None = None) -> SglangPool:
    if not machine.gpus:
        raise InvalidValueError(f"SGLang needs a GPU; {machine.name} has none (llama.cpp runs on CPUs)")
    total = gpu_capacity_bytes(machine.gpus[0], machine)
    frac, reserved, chunk, bs = sglang_defaults(total)
    if mem_fraction_static is not None:
        if not 0 < mem_fraction_static <= 1:
            raise InvalidValueError(f"mem_fraction_static must be in (0, 1], got {mem_fraction_static!r}")
        frac = mem_fraction_static
    weights = weight_bytes(spec, scheme)["total"]
    kv = frac * total - weights
    tokens = max(0, int(kv // (kv_values_per_token(spec) * _engine_value_bytes("sglang", kv_type))))
    line = f"max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, context_len={context_length or spec.n_ctx_train}"
    return SglangPool(total, frac, reserved, chunk, bs, weights, kv, tokens, line)


def llamacpp_pool(spec: ModelSpec, machine: Machine, scheme, kv_type: str, context: int, n_parallel: int, *,
                  unified: bool = True, n_gpu_layers: int | None = None) -> LlamacppPool:
    """llama-server with -np ``n_parallel`` slots of ``context`` tokens: -c np × context, which llama.cpp pads up
    to a multiple of 256 cells (llama_context: n_ctx); split (no -kvu) gives each slot n_ctx / np of them. Placed by
    ``place``; the log line is llama.cpp's own (llama_context and llama_kv_cache at startup)."""
    check_positive("n_parallel", n_parallel)
    n_ctx = -(-n_parallel * context // KV_PAD_TOKENS) * KV_PAD_TOKENS
    ngl = spec.n_layers + 1 if (n_gpu_layers is None and machine.gpus) else (n_gpu_layers or 0)
    p = place(spec, machine, scheme, n_ctx, kv_type, ngl, n_seq=n_parallel)  # SWA layers keep a window per sequence
    per_slot = n_ctx if unified else n_ctx // n_parallel
    line = (f"llama_context: n_ctx = {n_ctx}, n_ctx_seq = {per_slot}, kv_unified = {'true' if unified else 'false'}; "
            f"llama_kv_cache: size = {p.kv_total / MiB:.2f} MiB ({per_slot} cells, {spec.n_layers} layers, "
            f"{n_parallel}/{1 if unified else n_parallel} seqs)")
    return LlamacppPool(n_ctx, n_parallel, unified, per_slot, p.fits, p.n_gpu_layers, p.gpu_total, p.kv_total, line)


def llamacpp_max_sessions(spec: ModelSpec, machine: Machine, scheme, kv_type: str, context: int, *, limit: int = 4096) -> int:
    """Largest -np whose slots of ``context`` tokens fit with every layer offloaded (0: not even one)."""
    def fits(s: int) -> bool:
        return llamacpp_pool(spec, machine, scheme, kv_type, context, s).fits

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


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

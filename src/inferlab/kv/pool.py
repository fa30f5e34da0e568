"""The KV pool each engine gets for a model on a machine, by the engine's own accounting, and the
placement a simulated engine runs with.

* vLLM 0.33 (vllm/v1/worker/gpu_worker.py determine_available_memory, v1/core/kv_cache_utils.py):
  requested = --gpu-memory-utilization x total memory; KV = requested - weights - peak activations
  (a profile run of max_num_batched_tokens tokens) - non-torch memory - the CUDA-graph estimate
  (applied by default: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1; none with --enforce-eager);
  blocks of 16 tokens; it logs "GPU KV cache size: N tokens, Maximum concurrency for M tokens per
  request: X.XXx" with X = blocks / ceil(M / 16) and N = int(X * M).
* SGLang 0.5.23 (python/sglang/srt/arg_groups/memory_hook.py): --mem-fraction-static defaults to
  (memory - reserved) / memory, reserved (MiB) = 512 + 1.5 * max(chunked_prefill_size, 2048) +
  tp*pp/8*1024 + 2 * cuda_graph_max_bs (at least 10 GiB above 60 GiB), chunked_prefill_size and
  max_bs by GPU memory; the pool is mem_fraction_static x memory - weights, token-granular; the
  scheduler logs "max_total_num_tokens=N".
* llama.cpp: -c cells shared by -np slots (unified with -kvu: any slot may use all; split: -c/-np
  each), -c padded up to 256 cells; with --fit (the default) the context shrinks to what fits.
Memory is the catalog's GB (10^9 bytes), as ``perf.placement`` counts it.

``engine_placement`` is the one placement a simulated engine runs with: ``kv_pool_tokens`` reads
its pool for the simulator from the same accounting as ``inferlab capacity``, and the step times
are priced on that placement (``TimeModel.from_placement``), so the three always agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import DoesNotFitError, InvalidValueError, check_positive
from ..hardware.device import Machine
from ..hardware.resolve import resolve_machine
from ..models.resolve import resolve_model
from ..models.spec import ModelSpec
from ..perf.kv_size import KV_PAD_TOKENS, kv_bytes_per_token, kv_bytes_per_value
from ..perf.placement import MiB, Placement, compute_buffer_bytes, gpu_capacity_bytes, place
from ..quant.plan import weight_bytes
from .registry import ENGINES, manager_class

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
        return 2.0 if kv_name.lower() in ("f16", "bf16", "auto") else kv_bytes_per_value(kv_name.lower())
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


VLLM_PROFILE_CTX = 4096  # the context of the placement a vLLM/SGLang step is priced on (every layer on the GPU)


def engine_placement(engine: str, model, machine, quant: Any = "Q4_K_M", kv_type: str = "f16") -> Placement:
    """Where ``engine`` keeps ``model`` on ``machine`` (llama.cpp's layer order): llama.cpp with
    ``--fit`` (context and -ngl chosen to fit, possibly a partial offload); vLLM and SGLang hold
    every layer on the GPU (they do not offload layers to the CPU)."""
    manager_class(engine)  # unknown engines raise UnknownNameError
    model, machine = resolve_model(model), resolve_machine(machine)
    if engine == "llamacpp":
        p = place(model, machine, quant, None, kv_type=kv_type)  # llama.cpp's own order and --fit
        if not p.fits:
            raise DoesNotFitError(f"{model.name} {quant} does not fit on {machine.name}: {p.reason}")
        return p
    if machine.cpu_only:
        raise DoesNotFitError(f"{engine} needs a GPU; {machine.name} has none (llama.cpp runs on CPUs)")
    return place(model, machine, quant, VLLM_PROFILE_CTX, kv_type=kv_type, n_gpu_layers=model.n_layers + 1)


def kv_pool_tokens(engine: str, model, machine, quant: Any = "Q4_K_M", kv_type: str = "f16", *,
                   gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION, mem_fraction_static: float | None = None,
                   placement: Placement | None = None) -> int:
    """KV pool in tokens for ``engine`` serving ``model`` (catalog name or spec) on ``machine``: llama.cpp's -c
    off its placement (``engine_placement``), vLLM's blocks x 16 and SGLang's max_total_num_tokens by their own
    accounting (``vllm_pool``, ``sglang_pool``, as ``inferlab capacity`` reports them)."""
    model, machine = resolve_model(model), resolve_machine(machine)
    p = placement if placement is not None else engine_placement(engine, model, machine, quant, kv_type)
    if engine == "llamacpp":
        return int(p.n_ctx)
    scheme = p.scheme if p.scheme is not None else quant
    engine_kv = engine_kv_type(engine, kv_type)
    if engine_kv is None:
        raise InvalidValueError(f"{engine} has no KV cache type {kv_type!r}")
    if engine == "vllm":
        v = vllm_pool(model, machine, scheme, engine_kv, gpu_memory_utilization=gpu_memory_utilization)
        tokens, what = v.num_blocks * v.block_size, f"{v.kv_bytes / 1e9:.2f} GB after weights, activations and CUDA graphs"
    else:
        sg = sglang_pool(model, machine, scheme, engine_kv, mem_fraction_static=mem_fraction_static)
        tokens, what = sg.max_total_num_tokens, f"{sg.kv_bytes / 1e9:.2f} GB after weights at mem_fraction_static {sg.mem_fraction_static}"
    if tokens < 1:
        raise DoesNotFitError(f"{model.name} {quant} leaves no KV pool on {machine.name} for {engine} ({what})")
    return tokens


__all__ = ["ENGINES", "engine_placement", "kv_pool_tokens", "vllm_pool", "sglang_pool", "llamacpp_pool", "llamacpp_max_sessions",
           "VllmPool", "SglangPool", "LlamacppPool", "engine_kv_type", "kv_values_per_token", "vllm_batch_defaults", "sglang_defaults",
           "VLLM_GPU_MEMORY_UTILIZATION"]

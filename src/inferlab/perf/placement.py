"""Where the bytes live: llama.cpp's placement of weights, KV cache and compute buffers.

llama.cpp (src/llama-model.cpp, load_tensors) keeps ``token_embd`` in host memory, and gives
the GPU the *last* ``ngl`` "layers" of ``0 … n_layers``, where layer ``n_layers`` is the output
head: ``i_gpu_start = n_layers + 1 - ngl``. So ``ngl = n_layers + 1`` puts everything on the GPU,
and a partial offload keeps the *first* blocks on the CPU. Each block's KV slice lives with the
block (unless ``-nkvo``). ``--fit`` (on by default) picks the largest ``ngl`` that leaves
``--fit-target`` (1024 MiB) free per device, after shrinking an unset context towards
``--fit-ctx`` (4096). An explicit ``ngl`` is never clipped: a placement that does not fit says so.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from ..errors import InvalidValueError
from ..hardware.device import Device, Machine
from .kv_size import kv_bytes_per_value, swa_cache_tokens
from ..models.spec import ModelSpec
from ..models.inventory import block_roles, global_tensors
from ..quant.plan import Preset, PureType, layer_bytes, plan_memo, resolve_quant, tensor_plan

MiB = 2**20
GB = 1e9
FIT_TARGET_BYTES = 1024 * MiB  # llama.cpp --fit-target default, per device
FIT_CTX_MIN = 4096  # llama.cpp --fit-ctx default
MAX_N_CTX = 2**31 - 1  # llama.cpp parses -c with std::stoi (common/arg.cpp): a 32-bit int
N_UBATCH = 512  # llama.cpp -ub default: the physical batch that sizes compute buffers
ORDERS = ("llama.cpp", "first-blocks", "lesson")  # "lesson": the seed lesson's name for "first-blocks"


def _cumsum(xs) -> tuple[float, ...]:
    out, acc = [0.0], 0.0
    for x in xs:
        acc += x
        out.append(acc)
    return tuple(out)


@dataclass(frozen=True)
class _Prefix:
    """Prefix sums over blocks of what placement moves (one model, one quant), so that any range
    of blocks costs O(1): p[b] - p[a] is the sum over blocks a … b-1."""

    token_embd: float  # input embeddings (always host)
    output: float  # output head + final norm (+ rope tables): llama.cpp's "output layer"
    tied_output: float  # token_embd bytes when the output head is tied to it (else 0)
    output_params: float  # weights the output matmul multiplies (2 FLOPs each per token)
    block: tuple[float, ...]  # all weights of each block
    expert: tuple[float, ...]  # routed-expert weights (stacked *_exps tensors)
    active_params: tuple[float, ...]  # weights touched per token (MoE: n_used of n_experts)
    kv_full: tuple[float, ...]  # KV values per token in full-attention blocks (count, not bytes)
    kv_swa: tuple[float, ...]  # KV values per token in sliding-window blocks
    attn_flops: tuple[float, ...]  # attention FLOPs per query token per cached token
    memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # _layout's and _gpu_curve's answers


def _prefix(model: ModelSpec, quant) -> _Prefix:
    memo = plan_memo(model, quant)  # cached with the plan (a file's: by its own tensor table)
    pre = memo.get("placement")
    if pre is None:
        pre = memo["placement"] = _compute_prefix(model, quant)
    return pre


def _compute_prefix(model: ModelSpec, quant) -> _Prefix:
    if quant is None:
        return _file_prefix(model)
    # a planned file: bytes per block from the plan's sums, the rest from the model alone
    lb = layer_bytes(model, quant)
    static = _model_sums(model)
    # the output head is token_embd itself when tied: read every step, and copied (TENSOR_DUPLICATED)
    # only when the output layer lives on another device than the host
    tied = float(lb.token_embd) if model.tied_embeddings else 0.0
    return _Prefix(float(lb.token_embd), float(lb.output + lb.other), tied, static.output_params, _cumsum(lb.layers),
                   _cumsum(lb.layer_experts), static.active_params, static.kv_full, static.kv_swa, static.attn_flops)


class _ModelSums(NamedTuple):
    """The prefix sums that do not depend on the quant (see _Prefix)."""

    output_params: float
    active_params: tuple[float, ...]
    kv_full: tuple[float, ...]
    kv_swa: tuple[float, ...]
    attn_flops: tuple[float, ...]


@lru_cache(maxsize=1024)
def _model_sums(model: ModelSpec) -> _ModelSums:
    n = model.n_layers
    used = model.n_experts_used / model.n_experts if model.is_moe else 1.0
    active = []
    for i in range(n):
        acc = 0.0
        for t in block_roles(model, i):
            n_elements = math.prod(t.shape)
            acc += n_elements * used if t.is_expert else n_elements  # a token reaches n_used of n_experts
        active.append(acc)
    head, tail = global_tensors(model)
    out_params = 0.0
    for t in (*head, *tail):
        if t.name == "output.weight":
            out_params += t.n_elements
    if model.tied_embeddings:
        out_params += next(t for t in head if t.name == "token_embd.weight").n_elements
    return _ModelSums(out_params, _cumsum(active), *_context_sums(model))


def _context_sums(model: ModelSpec):
    """Prefix sums of KV values per token (full-attention and sliding-window blocks) and attention FLOPs."""
    n = model.n_layers
    kv = [model.kv_elements_per_token(i) for i in range(n)]
    swa = [model.layer_is_swa(i) for i in range(n)]
    return (_cumsum(0 if w else k for k, w in zip(kv, swa)), _cumsum(k if w else 0 for k, w in zip(kv, swa)),
            _cumsum(_attn_flops_per_ctx(model, i) for i in range(n)))


def _file_prefix(model: ModelSpec) -> _Prefix:
    """A file's own tensors, which may differ from the inventory (other names, extra tensors)."""
    plan = tensor_plan(model, None)
    n = model.n_layers
    block, expert, active = [0.0] * n, [0.0] * n, [0.0] * n
    embd = out = out_params = 0.0
    used = model.n_experts_used / model.n_experts if model.is_moe else 1.0
    for t in plan:
        if t.layer is None:
            if t.name.startswith("token_embd"):
                embd += t.n_bytes
            else:
                out += t.n_bytes
                if t.name == "output.weight":
                    out_params += t.n_elements
            continue
        block[t.layer] += t.n_bytes
        if t.is_expert:
            expert[t.layer] += t.n_bytes
            active[t.layer] += t.n_elements * used  # a token reaches n_used of n_experts
        else:
            active[t.layer] += t.n_elements
    tied = 0.0
    if model.tied_embeddings:
        emb = next(t for t in plan if t.name == "token_embd.weight")
        tied = float(emb.n_bytes)
        out_params += emb.n_elements
    return _Prefix(embd, out, tied, out_params, _cumsum(block), _cumsum(expert), _cumsum(active), *_context_sums(model))


class DeviceUse(NamedTuple):
    """What one device holds and reads in a placement."""

    name: str
    kind: str  # "gpu" or "cpu"
    capacity_bytes: float  # memory the engine may use on it
    weights_bytes: float
    kv_bytes: float
    compute_bytes: float
    n_blocks: int
    has_output: bool
    dense_read_bytes: float  # weights every decode step reads here (all but routed experts)
    expert_bytes: float  # routed-expert weights held here (a step reads the experts its tokens route to)
    kv_full_bytes_per_token: float  # cache bytes read per token of context (full-attention layers)
    kv_swa_bytes_per_token: float  # same for sliding-window layers (read up to the window)
    flops_per_token: float  # weight-matmul FLOPs one token costs here (2 per weight touched)
    attn_flops_per_token_ctx: float  # attention FLOPs per token per token of context (QK^T and AV)

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes

    @property
    def free_bytes(self) -> float:
        return self.capacity_bytes - self.total_bytes


class Placement(NamedTuple):
    """Where every byte of one configuration lives (an immutable record: a sweep makes many thousands)."""

    model: ModelSpec
    machine: Machine
    quant: str  # label of the quantization
    n_ctx: int
    kv_type: str
    n_gpu_layers: int  # llama.cpp -ngl (0 … n_layers + 1)
    devices: tuple[DeviceUse, ...]  # host CPU first, then the GPUs
    fits: bool
    reason: str = ""
    auto: bool = False  # ngl chosen by --fit
    ctx_reduced: bool = False  # --fit shrank an unset context
    unified: bool = False
    notes: tuple[str, ...] = ()
    scheme: Preset | PureType | None = None  # the resolved quant (Preset or PureType); None: the file's own tensors

    @property
    def cpu(self) -> DeviceUse:
        return self.devices[0]

    @property
    def gpus(self) -> tuple[DeviceUse, ...]:
        return self.devices[1:]

    @property
    def gpu_total(self) -> float:
        """Bytes on the GPU(s): weights + KV + compute buffers."""
        return sum(d.total_bytes for d in self.gpus)

    @property
    def cpu_total(self) -> float:
        return self.cpu.total_bytes

    @property
    def weights_total(self) -> float:
        return sum(d.weights_bytes for d in self.devices)

    @property
    def kv_total(self) -> float:
        return sum(d.kv_bytes for d in self.devices)

    @property
    def n_layers(self) -> int:
        return self.model.n_layers

    @property
    def fully_offloaded(self) -> bool:
        return bool(self.gpus) and self.n_gpu_layers >= self.model.n_layers + 1


def gpu_capacity_bytes(dev: Device, machine: Machine) -> float:
    """Memory the engine may use on a GPU. Marketed GB (10^9 bytes), as the lesson counts it; on
    Apple silicon Metal may wire about 2/3 of unified memory up to 36 GB and 3/4 above
    (recommendedMaxWorkingSetSize)."""
    if machine.unified:
        frac = 0.75 if dev.memory_gb > 36 else 2 / 3
        return dev.memory_gb * GB * frac
    return dev.memory_gb * GB


def compute_buffer_bytes(model: ModelSpec, n_ubatch: int, with_output: bool) -> float:
    """Approximate compute buffer of one device for a micro-batch of n_ubatch f32 activations:
    the logits when the output head runs there, plus the feed-forward's three intermediates per
    token (gate, up and their product, each as wide as the FFN; MoE: the routed experts' and the
    shared expert's widths). Flash attention keeps the score matrix out of it."""
    ffn = max(model.d_ff, model.n_experts_used * model.d_ff_expert + model.d_ff_shared)  # widest FFN a token passes
    per_token = 3 * ffn + (model.vocab_size if with_output else 0)  # f32 values per token
    return n_ubatch * 4 * per_token


def _attn_flops_per_ctx(model: ModelSpec, i: int) -> float:
    # per query token and per cached token: QK^T (2 x heads x key size) + AV (2 x heads x value size)
    if model.is_mla:
        return 2.0 * model.n_heads * (model.kv_lora_rank + model.qk_rope_head_dim + model.kv_lora_rank)
    return 2.0 * model.n_heads * (model.head_dim + model.head_dim_v)


def _split_counts(shares: list[float], n: int) -> list[int]:
    """llama.cpp's layer split: GPU layer j (of n) goes to the first device whose cumulative share
    exceeds j/n (-ts, default proportional to memory); returns how many each device gets."""
    if len(shares) == 1:
        return [n]
    total = sum(shares)
    counts, acc, prev = [], 0.0, 0
    for x in shares[:-1]:
        acc += x / total
        upto = min(n, math.ceil(acc * n - 1e-9))  # layers j with j/n < cumulative share
        counts.append(upto - prev)
        prev = upto
    counts.append(n - prev)
    return counts


def _catalog_machine(name: object) -> Machine:
    """A catalog machine by name (this computer, "local", is detected by hardware.resolve, above perf/)."""
    from ..hardware.catalog import MACHINES

    if not isinstance(name, str):
        raise InvalidValueError(f"machine must be a Machine or a catalog machine name such as 'rtx4090', got {type(name).__name__} {name!r:.80}")
    if name == "local":
        raise InvalidValueError("place() takes catalog machine names; for this computer pass hardware.resolve.resolve_machine('local')")
    return MACHINES[name]


def place(
    model: ModelSpec | str,
    machine: Machine | str,
    quant: str | Preset | PureType | None = "Q4_K_M",
    n_ctx: int | None = None,
    kv_type: str = "f16",
    n_gpu_layers: int | None = None,
    *,
    n_cpu_moe: int = 0,
    cpu_moe: bool = False,
    tensor_split: tuple[float, ...] | None = None,
    no_kv_offload: bool = False,
    n_seq: int = 1,
    n_ubatch: int = N_UBATCH,
    fit_target_bytes: float = FIT_TARGET_BYTES,
    fit_ctx: int = FIT_CTX_MIN,
    order: str = "llama.cpp",
) -> Placement:
    """Place a model on a machine as llama.cpp would (see the module docstring).

    quant: a llama-quantize preset or GGML type name (see quant.plan.resolve_quant), or None for
    a spec read from a file (its own tensors). n_ctx None: the trained context, which --fit may
    shrink towards fit_ctx. n_gpu_layers None: --fit picks it; an explicit value is kept even
    when it does not fit (fits=False, with the reason). n_cpu_moe / cpu_moe keep the routed
    experts of the first N (all) blocks in host memory (-ot exps=CPU).
    order: "llama.cpp" (the output head is offloaded first, then the last blocks) or "first-blocks"
    (the seed lesson's simplification, also accepted as "lesson": blocks 0 … ngl-1, the output head
    only at ngl = n_layers + 1).
    model and machine may be catalog names (``place("llama-3.1-8b", "rtx4090")``).
    """
    if not isinstance(model, ModelSpec):
        from ..models.resolve import resolve_model

        model = resolve_model(model)
    if not isinstance(machine, Machine):
        machine = _catalog_machine(machine)
    if order not in ORDERS:
        raise InvalidValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if order == "lesson":
        order = "first-blocks"  # one spelling inside
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0):
        raise InvalidValueError(f"n_ctx must be an integer number of tokens > 0, got {n_ctx!r}")
    if n_ctx is not None and n_ctx > MAX_N_CTX:
        raise InvalidValueError(f"n_ctx {n_ctx:,} is beyond what llama.cpp accepts: -c is a 32-bit int (at most {MAX_N_CTX:,})")
    L = model.n_layers
    if n_gpu_layers is not None and (not isinstance(n_gpu_layers, int) or n_gpu_layers < 0):
        raise InvalidValueError(f"n_gpu_layers must be an integer >= 0 (at most {L + 1} for {model.name}), got {n_gpu_layers!r}")
    if isinstance(n_cpu_moe, bool) or not isinstance(n_cpu_moe, int) or n_cpu_moe < 0:
        raise InvalidValueError(f"n_cpu_moe must be an integer >= 0, got {n_cpu_moe!r:.60}")
    if not isinstance(kv_type, str):
        raise InvalidValueError(f"kv_type must be a KV cache type name (f16, q8_0...), got {type(kv_type).__name__} {kv_type!r:.60}")
    if tensor_split is not None and (len(tensor_split) != len(machine.gpus) or any(x < 0 for x in tensor_split) or sum(tensor_split) <= 0):
        raise InvalidValueError(f"tensor_split {tensor_split!r} must have {len(machine.gpus)} non-negative entries with a positive sum")
    scheme = resolve_quant(quant) if quant is not None else None
    pre = _prefix(model, scheme)
    label = scheme.label if scheme is not None else (model.file_type or "file")
    gpus = machine.gpus
    if cpu_moe:
        n_cpu_moe = L
    if not gpus:
        n_gpu_layers = 0
    ngl_max = L + 1 if gpus else 0
    user_ctx = n_ctx is not None
    ctx = n_ctx if user_ctx else model.n_ctx_train

    if n_gpu_layers is None and user_ctx and len(gpus) == 1 and not n_cpu_moe and not no_kv_offload:
        # --fit on one GPU: read the largest ngl that fits off the cached curve of GPU bytes against ngl
        curve = _gpu_curve(model, pre, ctx, kv_type, n_seq, n_ubatch, order)
        ngl = max(0, bisect.bisect_right(curve, gpu_capacity_bytes(gpus[0], machine) - fit_target_bytes) - 1)
        return _build(model, machine, pre, scheme, label, ctx, kv_type, ngl, n_cpu_moe, tensor_split, no_kv_offload, n_seq,
                      n_ubatch, fit_target_bytes, order, True, False)

    def build(ngl: int, c: int, auto: bool = False, ctx_reduced: bool = False) -> Placement:
        return _build(model, machine, pre, scheme, label, c, kv_type, min(ngl, ngl_max), n_cpu_moe, tensor_split, no_kv_offload, n_seq,
                      n_ubatch, fit_target_bytes, order, auto, ctx_reduced)

    if n_gpu_layers is not None:
        p = build(n_gpu_layers, ctx)
        if not user_ctx and not _gpus_fit(p, fit_target_bytes) and p.gpus:
            p = _shrink_ctx(lambda n, c: build(n, c, False, True), n_gpu_layers, ctx, fit_ctx, fit_target_bytes) or p
        return p
    # --fit: full offload at the largest context that fits, else shrink layers
    best = build(ngl_max, ctx, True)
    ctx_reduced = False
    if not _gpus_fit(best, fit_target_bytes) and not user_ctx:
        shrunk = _shrink_ctx(build, ngl_max, ctx, fit_ctx, fit_target_bytes)
        if shrunk is not None:
            flagged = _shrink_ctx(lambda n, c: build(n, c, True, True), ngl_max, ctx, fit_ctx, fit_target_bytes)
            assert flagged is not None  # the same search as `shrunk` (the flags only label the placement): it fits too
            return flagged
        ctx, ctx_reduced = min(ctx, fit_ctx), ctx > fit_ctx
        best = build(ngl_max, ctx, True, ctx_reduced)
    if not _gpus_fit(best, fit_target_bytes) and gpus:
        lo, hi = 0, ngl_max  # largest ngl whose GPUs fit: use is monotone in ngl
        if len(gpus) == 1 and not n_cpu_moe and not no_kv_offload:
            # one GPU: read the answer off the cached curve of GPU bytes against ngl
            curve = _gpu_curve(model, pre, ctx, kv_type, n_seq, n_ubatch, order)
            lo = hi = max(0, bisect.bisect_right(curve, gpu_capacity_bytes(gpus[0], machine) - fit_target_bytes) - 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _gpus_fit(build(mid, ctx), fit_target_bytes):
                lo = mid
            else:
                hi = mid - 1
        best = build(lo, ctx, True, ctx_reduced)
    return best


def _gpu_curve(model: ModelSpec, pre: _Prefix, n_ctx: int, kv_type: str, n_seq: int, n_ubatch: int, order: str) -> tuple[float, ...]:
    """Bytes on a single GPU for ngl = 0 … n_layers + 1 (non-decreasing), as _build counts them."""
    key = ("curve", n_ctx, kv_type, n_seq, n_ubatch, order)
    hit = pre.memo.get(key)
    if hit is None:
        hit = _remember(pre, key, _compute_gpu_curve(model, pre, n_ctx, kv_type, n_seq, n_ubatch, order))
    return hit


def _compute_gpu_curve(model: ModelSpec, pre: _Prefix, n_ctx, kv_type, n_seq, n_ubatch, order) -> tuple[float, ...]:
    L = model.n_layers
    b_kv = kv_bytes_per_value(kv_type)
    swa_cells = swa_cache_tokens(model, n_ctx, n_seq, n_ubatch) if model.swa_layers else n_ctx

    def blocks(a: int, b: int) -> float:  # weights and KV of blocks a … b-1
        kv = ((pre.kv_full[b] - pre.kv_full[a]) * n_ctx + (pre.kv_swa[b] - pre.kv_swa[a]) * swa_cells) * b_kv
        return pre.block[b] - pre.block[a] + kv

    # the first GPU reserves the logits either way (its own output head, or op offload)
    buffers = compute_buffer_bytes(model, n_ubatch, True)
    curve = [0.0]
    for ngl in range(1, L + 2):
        if order == "first-blocks":
            lo, hi, out = 0, min(ngl, L), ngl > L
        else:
            lo, hi, out = max(L + 1 - ngl, 0), L, True
        curve.append(blocks(lo, hi) + (pre.output + pre.tied_output if out else 0.0) + buffers)
    return tuple(curve)


def _gpus_fit(p: Placement, fit_target: float) -> bool:
    return all(d.free_bytes >= fit_target for d in p.gpus)


def _shrink_ctx(build, ngl: int, ctx: int, fit_ctx: int, fit_target: float) -> Placement | None:
    """Largest context (multiple of 256, >= fit_ctx) at which ngl layers fit, if any."""
    lo, hi = fit_ctx // 256, ctx // 256
    if lo > hi or not _gpus_fit(build(ngl, lo * 256), fit_target):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _gpus_fit(build(ngl, mid * 256), fit_target):
            lo = mid
        else:
            hi = mid - 1
    return build(ngl, lo * 256)


class _Share(NamedTuple):
    """What one device takes of a layout, before context and machine are known (sums over blocks)."""

    weights_bytes: float
    dense_read_bytes: float
    expert_bytes: float
    flops_per_token: float
    kv_full_values: float  # KV values per token of context (full-attention blocks)
    kv_swa_values: float  # same for sliding-window blocks
    attn_flops_per_token_ctx: float
    n_blocks: int
    has_output: bool
    buffers: int  # compute buffers it reserves: 0 none, 1 the FFN's, 2 the FFN's and the logits


def _layout(pre: _Prefix, L: int, ngl: int, order: str, shares: tuple[float, ...], n_cpu_moe: int,
            no_kv_offload: bool) -> tuple[_Share, ...]:
    """Which blocks each device holds for this -ngl, host first: cached per (model, quant), since a
    sweep asks for the same few layouts at every context and on every machine with that many GPUs."""
    key = ("layout", ngl, order, shares, n_cpu_moe, no_kv_offload)
    hit = pre.memo.get(key)
    if hit is None:
        hit = _remember(pre, key, _compute_layout(pre, L, ngl, order, shares, n_cpu_moe, no_kv_offload))
    return hit


def _remember(pre: _Prefix, key: tuple, value):
    if len(pre.memo) > 4096:  # user contexts and tensor splits are unbounded: keep the memo small
        pre.memo.clear()
    pre.memo[key] = value
    return value


def _compute_layout(pre: _Prefix, L, ngl, order, shares, n_cpu_moe, no_kv_offload) -> tuple[_Share, ...]:
    n_dev = 1 + len(shares)
    # llama.cpp's layers 0 … L (L = the output head) that go to GPUs, as one contiguous range
    if not shares or ngl <= 0:
        lo = hi = 0
        out_on_gpu = False
    elif order == "first-blocks":
        lo, hi, out_on_gpu = 0, min(ngl, L), ngl > L
    else:
        lo, hi, out_on_gpu = max(L + 1 - ngl, 0), L, True  # i_gpu_start = n_layers + 1 - ngl
    n_gpu_layers_total = (hi - lo) + out_on_gpu
    # block ranges per device: host gets the rest, GPUs split the range by their shares
    ranges: list[list[tuple[int, int]]] = [[] for _ in range(n_dev)]
    ranges[0] = [(0, lo), (hi, L)]
    d_out = 0
    if n_gpu_layers_total and len(shares) == 1:
        ranges[1].append((lo, hi))
        d_out = 1 if out_on_gpu else 0
    elif n_gpu_layers_total:
        counts = _split_counts(list(shares), n_gpu_layers_total)
        start = lo
        for g, count in enumerate(counts):
            blocks = min(count, hi - start)
            ranges[1 + g].append((start, start + blocks))
            start += blocks
        if out_on_gpu:  # the output layer is the last GPU layer
            d_out = 1 + max(g for g, c in enumerate(counts) if c)
    out: dict[int, _Share] = {}  # device index -> its share (every index is filled below)
    held_back = 0.0  # routed experts of GPU blocks kept in host memory (--n-cpu-moe)
    p_block, p_expert, p_active = pre.block, pre.expert, pre.active_params
    p_kvf, p_kvs, p_attn = pre.kv_full, pre.kv_swa, pre.attn_flops
    for d in [*range(1, n_dev), 0]:  # GPUs first: the host also takes what they hold back
        w = dense = exp = act = kvf = kvs = att = 0.0
        nblk = 0
        for a, b in ranges[d]:
            if b <= a:
                continue
            nblk += b - a
            blk = p_block[b] - p_block[a]
            ex = p_expert[b] - p_expert[a]
            if d and n_cpu_moe > a:  # -ot exps=CPU: experts of blocks < n_cpu_moe stay on the host
                moved = p_expert[min(b, n_cpu_moe)] - p_expert[a]
                ex -= moved
                blk -= moved
                held_back += moved
            w += blk
            dense += blk - ex
            exp += ex
            act += p_active[b] - p_active[a]
            if not no_kv_offload or d == 0:
                kvf += p_kvf[b] - p_kvf[a]
                kvs += p_kvs[b] - p_kvs[a]
                att += p_attn[b] - p_attn[a]
        if d == 0:
            w += pre.token_embd + held_back  # input embeddings stay on the host; decode reads one row (negligible)
            exp += held_back
            if no_kv_offload:  # -nkvo: every block's cache stays in RAM
                kvf, kvs, att = p_kvf[L], p_kvs[L], p_attn[L]
        flops = 2.0 * act  # one multiply and one add per weight touched
        if d == d_out:
            w += pre.output + (pre.tied_output if d else 0.0)  # on the host the tied head is token_embd itself
            dense += pre.output + pre.tied_output
            flops += 2.0 * pre.output_params
        # logits live where the output matmul runs; with op offload a CPU-resident output head's
        # prompt-batch matmul runs on the first GPU, so that GPU reserves them too
        buffers = (2 if d == d_out or (d == 1 and d_out == 0) else 1) if (d == 0 or nblk or d == d_out) else 0
        out[d] = _Share(w, dense, exp, flops, kvf, kvs, att, nblk, d == d_out, buffers)
    return tuple(out[d] for d in range(n_dev))


def _build(model, machine, pre: _Prefix, scheme, label, n_ctx, kv_type, ngl, n_cpu_moe, tensor_split, no_kv_offload, n_seq, n_ubatch, fit_target,
           order, auto=False, ctx_reduced=False) -> Placement:
    gpus = machine.gpus
    # the split shares matter only between several GPUs (-ts, default proportional to memory)
    shares = tuple(tensor_split) if tensor_split else (tuple(g.memory_gb for g in gpus) if len(gpus) > 1 else (1.0,) * len(gpus))
    layout = _layout(pre, model.n_layers, ngl, order, shares, n_cpu_moe, no_kv_offload)
    b_kv = kv_bytes_per_value(kv_type)
    swa_cells = swa_cache_tokens(model, n_ctx, n_seq, n_ubatch) if model.swa_layers else n_ctx
    buffer_bytes = _buffer_bytes(model, pre, n_ubatch)
    make = tuple.__new__  # DeviceUse(...) and Placement(...) without the keyword-handling constructor: placements are hot
    devs = []
    for d, s in enumerate(layout):
        if d == 0:
            name, kind, cap = machine.ram.name, "cpu", machine.ram.memory_gb * GB
        else:
            g = gpus[d - 1]
            name, kind, cap = g.name, "gpu", gpu_capacity_bytes(g, machine)
        kv_bytes = (s.kv_full_values * n_ctx + s.kv_swa_values * swa_cells) * b_kv  # values per token x cells x bytes per value
        devs.append(make(DeviceUse, (name, kind, cap, s.weights_bytes, kv_bytes, buffer_bytes[s.buffers], s.n_blocks, s.has_output,
                                     s.dense_read_bytes, s.expert_bytes, s.kv_full_values * b_kv, s.kv_swa_values * b_kv,
                                     s.flops_per_token, s.attn_flops_per_token_ctx)))
    reasons = []
    for d in devs[1:]:
        if d.free_bytes < fit_target:
            reasons.append(f"{d.name} needs {d.total_bytes / GB:.2f} GB but has {d.capacity_bytes / GB:.2f} GB "
                           f"(keeping a {fit_target / MiB:.0f} MiB margin)")
    host_cap = machine.ram.memory_gb * GB
    host_need = sum(d.total_bytes for d in devs) if machine.unified else devs[0].total_bytes
    if host_need > host_cap:
        reasons.append(f"host memory needs {host_need / GB:.2f} GB but has {host_cap / GB:.2f} GB "
                       "(with mmap llama.cpp still starts, paging weights from disk at drive speed)")
    return make(Placement, (model, machine, label, n_ctx, kv_type, ngl, tuple(devs), not reasons, "; ".join(reasons),
                            auto, ctx_reduced, machine.unified, (), scheme))  # notes: none


def _buffer_bytes(model: ModelSpec, pre: _Prefix, n_ubatch: int) -> tuple[float, float, float]:
    """The compute buffers a device may reserve: none, the FFN's, the FFN's and the f32 logits."""
    key = ("buffers", n_ubatch)
    hit = pre.memo.get(key)
    if hit is None:
        cb_ffn = compute_buffer_bytes(model, n_ubatch, False)
        hit = _remember(pre, key, (0.0, cb_ffn, cb_ffn + n_ubatch * 4 * model.vocab_size))
    return hit

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
from dataclasses import dataclass, field
from functools import lru_cache

from .errors import InvalidValueError, check_positive
from .hardware.device import Device, Machine
from .kv_size import kv_bytes_per_value, layer_kv_bytes
from .models.spec import ModelSpec
from .quant.plan import resolve_quant, tensor_plan

MiB = 2**20
GB = 1e9
FIT_TARGET_BYTES = 1024 * MiB  # llama.cpp --fit-target default, per device
FIT_CTX_MIN = 4096  # llama.cpp --fit-ctx default
N_UBATCH = 512  # llama.cpp -ub default: the physical batch that sizes compute buffers
ORDERS = ("llama.cpp", "lesson")


@dataclass(frozen=True)
class LayerBytes:
    """A model's weight bytes grouped the way placement moves them (one quant)."""

    token_embd: int  # input embeddings (always host)
    output: int  # output head + final norm (+ rope tables): llama.cpp's "output layer"
    block: tuple[int, ...]  # all weights of each block
    block_expert: tuple[int, ...]  # routed-expert weights of each block (subset of block)
    block_flops: tuple[int, ...]  # weights of each block touched per token (MoE: active experts)
    output_params: int  # weights in the output head (its matmul FLOPs: 2 per weight)

    @property
    def total(self) -> int:
        return self.token_embd + self.output + sum(self.block)


@lru_cache(maxsize=2048)
def layer_bytes(model: ModelSpec, quant) -> LayerBytes:
    q = resolve_quant(quant) if quant is not None else None
    plan = tensor_plan(model, q)
    n = model.n_layers
    block = [0] * n
    expert = [0] * n
    active = [0] * n
    embd = out = out_params = 0
    for t in plan:
        if t.layer is None:
            if t.name.startswith("token_embd"):
                embd += t.n_bytes
            else:
                out += t.n_bytes
                if t.name.startswith("output.") and t.name.endswith("weight"):
                    out_params += t.n_elements
            continue
        block[t.layer] += t.n_bytes
        if t.is_expert:
            expert[t.layer] += t.n_bytes
            active[t.layer] += t.n_elements * model.n_experts_used // model.n_experts
        else:
            active[t.layer] += t.n_elements
    if model.tied_embeddings:
        # llama.cpp duplicates token_embd as the output head onto the output layer's device
        emb = next(t for t in plan if t.name == "token_embd.weight")
        out += emb.n_bytes
        out_params += emb.n_elements
    return LayerBytes(embd, out, tuple(block), tuple(expert), tuple(active), out_params)


@dataclass(frozen=True)
class DeviceUse:
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


@dataclass(frozen=True)
class Placement:
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
    notes: tuple[str, ...] = field(default=())

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
    """Approximate compute buffer of one device for a micro-batch of n_ubatch tokens: f32 logits
    for the batch when the output head runs there, plus about eight f32 hidden-state-sized
    activations per token (flash attention keeps the score matrix out of it)."""
    per_token = 8 * model.d_model + (model.vocab_size if with_output else 0)  # f32 values per token
    return n_ubatch * 4 * per_token


@dataclass(frozen=True)
class _KVLayers:
    bytes_: tuple[float, ...]  # per layer, at n_ctx
    full_per_tok: tuple[float, ...]  # per layer, read per context token (full-attention layers)
    swa_per_tok: tuple[float, ...]  # per layer, read per context token up to the window


@lru_cache(maxsize=4096)
def _kv_layers(model: ModelSpec, n_ctx: int, kv_type: str, n_seq: int) -> _KVLayers:
    b = kv_bytes_per_value(kv_type)
    per = [model.kv_elements_per_token(i) * b for i in range(model.n_layers)]
    swa = [model.layer_is_swa(i) for i in range(model.n_layers)]
    return _KVLayers(
        layer_kv_bytes(model, n_ctx, kv_type, n_seq),
        tuple(0.0 if s else p for p, s in zip(per, swa)),
        tuple(p if s else 0.0 for p, s in zip(per, swa)),
    )


def _attn_flops_per_ctx(model: ModelSpec, i: int) -> float:
    # per query token and per cached token: QK^T (2 x heads x key size) + AV (2 x heads x value size)
    if model.is_mla:
        return 2.0 * model.n_heads * (model.kv_lora_rank + model.qk_rope_head_dim + model.kv_lora_rank)
    return 2.0 * model.n_heads * (model.head_dim + model.head_dim_v)


def _split_points(weights: list[float], n: int) -> list[int]:
    """llama.cpp's layer split: device d gets the layers whose fraction of the GPU range falls
    below its cumulative share (-ts, default proportional to memory)."""
    total = sum(weights)
    cum, acc = [], 0.0
    for w in weights:
        acc += w
        cum.append(acc / total)
    return [min(bisect.bisect_right(cum, j / n), len(weights) - 1) for j in range(n)]


def place(
    model: ModelSpec,
    machine: Machine,
    quant="Q4_K_M",
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
    order: "llama.cpp" (the output head is offloaded first, then the last blocks) or "lesson"
    (the seed's simplification: blocks 0 … ngl-1, the output head only at ngl = n_layers + 1).
    """
    if order not in ORDERS:
        raise InvalidValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if n_ctx is not None:
        check_positive("n_ctx", n_ctx)
        if isinstance(n_ctx, float):
            raise InvalidValueError(f"n_ctx must be an integer number of tokens, got {n_ctx!r}")
    L = model.n_layers
    if n_gpu_layers is not None and (not isinstance(n_gpu_layers, int) or n_gpu_layers < 0):
        raise InvalidValueError(f"n_gpu_layers must be an integer >= 0 (at most {L + 1} for {model.name}), got {n_gpu_layers!r}")
    if n_cpu_moe < 0:
        raise InvalidValueError(f"n_cpu_moe must be >= 0, got {n_cpu_moe!r}")
    lb = layer_bytes(model, quant)
    label = resolve_quant(quant).label if quant is not None else (model.file_type or "file")
    gpus = machine.gpus
    if cpu_moe:
        n_cpu_moe = L
    if not gpus:
        n_gpu_layers = 0
    ngl_max = L + 1 if gpus else 0
    user_ctx = n_ctx is not None
    ctx = n_ctx if user_ctx else model.n_ctx_train

    def build(ngl: int, c: int) -> Placement:
        return _build(model, machine, lb, label, c, kv_type, min(ngl, ngl_max), n_cpu_moe, tensor_split, no_kv_offload, n_seq, n_ubatch, fit_target_bytes, order)

    if n_gpu_layers is not None:
        p = build(n_gpu_layers, ctx)
        if not user_ctx and not p.fits and p.gpus:
            p = _shrink_ctx(build, n_gpu_layers, ctx, fit_ctx) or p
        return p
    # --fit: full offload at the largest context that fits, else shrink layers
    best = build(ngl_max, ctx)
    ctx_reduced = False
    if not best.fits and not user_ctx:
        shrunk = _shrink_ctx(build, ngl_max, ctx, fit_ctx)
        if shrunk is not None:
            best, ctx_reduced = shrunk, True
        else:
            ctx, ctx_reduced = min(ctx, fit_ctx), ctx > fit_ctx
            best = build(ngl_max, ctx)
    if not best.fits and gpus:
        lo, hi = 0, ngl_max  # largest ngl whose GPUs fit: use is monotone in ngl
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if all(d.free_bytes >= fit_target_bytes for d in build(mid, ctx).gpus):
                lo = mid
            else:
                hi = mid - 1
        best = build(lo, ctx)
    return _replace(best, auto=True, ctx_reduced=ctx_reduced)


def _shrink_ctx(build, ngl: int, ctx: int, fit_ctx: int) -> Placement | None:
    """Largest context (multiple of 256, >= fit_ctx) at which ngl layers fit, if any."""
    lo, hi = fit_ctx // 256, ctx // 256
    if lo > hi or not build(ngl, lo * 256).fits:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if build(ngl, mid * 256).fits:
            lo = mid
        else:
            hi = mid - 1
    return _replace(build(ngl, lo * 256), ctx_reduced=True)


def _replace(p: Placement, **kw) -> Placement:
    from dataclasses import replace

    return replace(p, **kw)


def _build(model, machine, lb: LayerBytes, label, n_ctx, kv_type, ngl, n_cpu_moe, tensor_split, no_kv_offload, n_seq, n_ubatch, fit_target, order) -> Placement:
    L = model.n_layers
    gpus = machine.gpus
    kvl = _kv_layers(model, n_ctx, kv_type, n_seq)
    n_dev = 1 + len(gpus)
    # device index per layer 0..L (L = output head); 0 = host
    if order == "lesson":
        gpu_layers = list(range(min(ngl, L))) + ([L] if ngl > L else [])
    else:
        gpu_layers = list(range(max(L + 1 - ngl, 0), L + 1))  # i_gpu_start = n_layers + 1 - ngl
    dev_of = [0] * (L + 1)
    if gpus and ngl > 0:
        share = list(tensor_split) if tensor_split else [g.memory_gb for g in gpus]
        if len(share) != len(gpus) or any(s < 0 for s in share) or sum(share) <= 0:
            raise InvalidValueError(f"tensor_split {tensor_split!r} must have {len(gpus)} non-negative entries with a positive sum")
        split = _split_points(share, len(gpu_layers))
        for j, il in enumerate(gpu_layers):
            dev_of[il] = 1 + split[j]
    w = [0.0] * n_dev
    kv = [0.0] * n_dev
    dec = [0.0] * n_dev
    exb = [0.0] * n_dev
    kv_full = [0.0] * n_dev
    kv_swa = [0.0] * n_dev
    flops = [0.0] * n_dev
    attn = [0.0] * n_dev
    nblk = [0] * n_dev
    w[0] += lb.token_embd  # input embeddings stay on the host; decode reads one row (negligible)
    for i in range(L):
        d = dev_of[i]
        blk, exp = lb.block[i], lb.block_expert[i]
        de = 0 if (exp and i < n_cpu_moe) else d  # -ot exps=CPU: this block's experts stay on the host
        w[d] += blk - exp
        dec[d] += blk - exp
        w[de] += exp
        exb[de] += exp
        flops[d] += 2.0 * lb.block_flops[i]  # one multiply and one add per weight touched
        kd = 0 if no_kv_offload else d
        kv[kd] += kvl.bytes_[i]
        kv_full[kd] += kvl.full_per_tok[i]
        kv_swa[kd] += kvl.swa_per_tok[i]
        attn[kd] += _attn_flops_per_ctx(model, i)
        nblk[d] += 1
    d_out = dev_of[L]
    w[d_out] += lb.output
    dec[d_out] += lb.output
    flops[d_out] += 2.0 * lb.output_params
    cb = [0.0] * n_dev
    for d in range(n_dev):
        if d == 0 or nblk[d] or d_out == d:
            # logits live where the output matmul runs; with op offload a CPU-resident output
            # head's prompt-batch matmul runs on the first GPU, so that GPU reserves them too
            cb[d] = compute_buffer_bytes(model, n_ubatch, with_output=(d == d_out or (d == 1 and d_out == 0)))
    devs = []
    host_cap = machine.ram.memory_gb * GB
    devs.append(DeviceUse(machine.ram.name, "cpu", host_cap, w[0], kv[0], cb[0], nblk[0], d_out == 0,
                          dec[0], exb[0], kv_full[0], kv_swa[0], flops[0], attn[0]))
    for k, g in enumerate(gpus, start=1):
        devs.append(DeviceUse(g.name, "gpu", gpu_capacity_bytes(g, machine), w[k], kv[k], cb[k], nblk[k], d_out == k,
                              dec[k], exb[k], kv_full[k], kv_swa[k], flops[k], attn[k]))
    reasons = []
    for d in devs[1:]:
        if d.free_bytes < fit_target:
            reasons.append(f"{d.name} needs {d.total_bytes / GB:.2f} GB but has {d.capacity_bytes / GB:.2f} GB "
                           f"(keeping a {fit_target / MiB:.0f} MiB margin)")
    host_need = devs[0].total_bytes
    notes = []
    if machine.unified:
        host_need = sum(d.total_bytes for d in devs)
    if host_need > host_cap:
        notes.append(f"host memory holds {host_need / GB:.1f} GB of {host_cap / GB:.1f} GB: the OS will page weights from disk (mmap)")
    return Placement(model, machine, label, n_ctx, kv_type, ngl, tuple(devs), not reasons, "; ".join(reasons),
                     unified=machine.unified, notes=tuple(notes))

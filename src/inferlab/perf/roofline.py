"""The roofline (Williams, Waterman and Patterson, 2009): attainable FLOP/s = min(P, I x beta).

A kernel that does F FLOPs while moving B bytes has arithmetic intensity I = F / B. The device's
two roofs, peak compute P (dense FP16, FP32 accumulate) and memory bandwidth beta, meet at the
ridge point I* = P / beta: below it a kernel is memory-bound, above it compute-bound.

Two kinds of work sit on it, as the seed lesson and the KV-cache case study place them:
* weight matmuls: a batch of B tokens does 2B FLOPs per weight over bpw/8 bytes (I = 16B/bpw),
  so decode at batch 1 sits far down the slope and prefill (a micro-batch of up to 512 tokens)
  on the flat part;
* attention: decode reads every cached K/V of every sequence for 2 x heads x (d_k + d_v) FLOPs
  per cached token, so its intensity is fixed by the architecture (MHA f16: 1 FLOP/byte; GQA
  raises it by n_heads / n_kv_heads) whatever the context or the batch; prefill attends each of
  n prompt tokens to the ones before it (n^2/2 pairs) while its compulsory traffic (Q, O and the
  prompt's K/V once) grows with n, so its intensity grows with the prompt.
A whole-model point adds both up for one configuration (from the placement, as ``speed`` reads it).
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidValueError, check_positive
from ..hardware.device import Device
from ..models.spec import ModelSpec
from .kv_size import kv_bytes_per_value
from .placement import Placement, _attn_flops_per_ctx
from .speed import BANDWIDTH_ONLY, SpeedModel, decode_step_time, expert_read_fraction

ACTIVATION_BYTES = 2  # f16 activations (Q in, O out) in the attention kernel's compulsory traffic


@dataclass(frozen=True)
class Roof:
    """One device's two roofs and where they meet."""

    device: str
    kind: str  # "gpu" or "cpu"
    peak_flops: float  # dense FP16 matmul throughput, FLOP/s
    bandwidth_bytes_per_s: float
    ridge_flop_per_byte: float  # I* = P / beta


@dataclass(frozen=True)
class RooflinePoint:
    """One piece of work on a device's roofline."""

    label: str
    op: str  # "weights" (the weight matmuls), "attention" (QK^T and AV over the cache), "model" (both)
    phase: str  # "decode" or "prefill"
    device: str
    batch: int  # sequences (decode) or tokens per micro-batch (prefill weight matmuls)
    context_tokens: int  # cached tokens attended to (decode) or prompt tokens (prefill)
    flops: float
    bytes_moved: float
    intensity_flop_per_byte: float
    attainable_flops: float  # min(P, I x beta)
    bound: str  # "memory" or "compute"
    utilization: float  # attainable / peak


def roof(device: Device, kind: str | None = None) -> Roof:
    return Roof(device.name, kind or ("cpu" if device.is_cpu else "gpu"), device.fp16_flops, device.bandwidth_bytes_per_s,
                device.fp16_flops / device.bandwidth_bytes_per_s)


def point(r: Roof, label: str, op: str, phase: str, batch: int, context: int, flops: float, bytes_moved: float) -> RooflinePoint:
    """Place F FLOPs over B bytes on a roof."""
    if bytes_moved <= 0:
        raise InvalidValueError(f"{label}: bytes moved must be > 0, got {bytes_moved!r}")
    i = flops / bytes_moved
    att = min(r.peak_flops, i * r.bandwidth_bytes_per_s)
    return RooflinePoint(label, op, phase, r.device, batch, context, flops, bytes_moved, i, att,
                         "compute" if i >= r.ridge_flop_per_byte else "memory", att / r.peak_flops)


def weight_matmul_point(r: Roof, batch: int, bits_per_weight: float, n_weights: float = 1.0, phase: str = "decode") -> RooflinePoint:
    """A weight matmul over ``batch`` tokens: 2 FLOPs per weight per token over bpw/8 bytes per weight."""
    _check_batch(batch)
    check_positive("bits_per_weight", bits_per_weight)
    return point(r, f"{phase} weights, batch {batch}", "weights", phase, batch, 0,
                 2.0 * batch * n_weights,  # one multiply and one add per weight and token
                 n_weights * bits_per_weight / 8)  # the weights, read once for the whole batch


def _attn_totals(spec: ModelSpec, kv_type: str) -> tuple[float, float]:
    """Attention FLOPs per query token per cached token, and cache bytes per cached token, over all layers."""
    flops = sum(_attn_flops_per_ctx(spec, i) for i in range(spec.n_layers))  # 2 x heads x (d_k + d_v) per layer
    kv = sum(spec.kv_elements_per_token(i) for i in range(spec.n_layers)) * kv_bytes_per_value(kv_type)
    return flops, kv


def decode_attention_point(r: Roof, spec: ModelSpec, context: int, kv_type: str = "f16", batch: int = 1) -> RooflinePoint:
    """Attention of one decode step: each of ``batch`` sequences reads its own ``context`` cached
    tokens of K/V (sliding-window layers at most the window) for one query token."""
    _check_batch(batch)
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InvalidValueError(f"context must be an integer >= 1 token, got {context!r}")
    b = kv_bytes_per_value(kv_type)
    w = spec.sliding_window or context
    cells = [min(context, w) if spec.layer_is_swa(i) else context for i in range(spec.n_layers)]
    flops = batch * sum(_attn_flops_per_ctx(spec, i) * c for i, c in enumerate(cells))
    kv = batch * sum(spec.kv_elements_per_token(i) * b * c for i, c in enumerate(cells))  # every sequence its own cache
    return point(r, f"decode attention, {context} tokens, batch {batch}", "attention", "decode", batch, context, flops, kv)


def prefill_attention_point(r: Roof, spec: ModelSpec, n_tokens: int, kv_type: str = "f16") -> RooflinePoint:
    """Attention over a prompt of ``n_tokens`` (causal: n^2/2 query-key pairs, as ``prefill_time``
    counts them). Bytes: the compulsory traffic of a fused (flash) attention kernel: Q read and O
    written once in f16, the prompt's K/V written to the cache and read back once."""
    check_positive("n_tokens", n_tokens)
    per_flops, kv = _attn_totals(spec, kv_type)
    flops = per_flops * n_tokens * n_tokens / 2
    q_o = spec.n_layers * spec.n_heads * (spec.head_dim + spec.head_dim_v) * ACTIVATION_BYTES  # Q in, O out, per token
    bytes_ = n_tokens * (q_o + 2 * kv)  # K/V written, then read once
    return point(r, f"prefill attention, {n_tokens} tokens", "attention", "prefill", n_tokens, n_tokens, flops, bytes_)


def model_decode_point(r: Roof, placement: Placement, context: int, batch: int = 1) -> RooflinePoint:
    """A whole decode step of the configuration (every device's work summed, as ``decode_step_time``
    counts it): weights read once for the batch (MoE: the experts the batch routes to), each
    sequence's cached K/V, 2 FLOPs per weight touched plus the attention FLOPs."""
    _check_batch(batch)
    spec = placement.model
    frac = expert_read_fraction(spec.n_experts, spec.n_experts_used, batch)
    swa_ctx = min(context, spec.sliding_window or context)
    bytes_ = flops = 0.0
    for d in placement.devices:
        bytes_ += d.dense_read_bytes + d.expert_bytes * frac + batch * (d.kv_full_bytes_per_token * context + d.kv_swa_bytes_per_token * swa_ctx)
        flops += batch * (d.flops_per_token + d.attn_flops_per_token_ctx * context)
    return point(r, f"decode, batch {batch}, {context} tokens", "model", "decode", batch, context, flops, bytes_)


def model_prefill_point(r: Roof, placement: Placement, n_tokens: int, n_ubatch: int = 512) -> RooflinePoint:
    """A whole prompt of the configuration: every micro-batch reads the weights once (a micro-batch
    of hundreds of tokens touches every expert), the prompt's K/V is written and read once, 2 FLOPs
    per weight and token plus n^2/2 attention pairs."""
    check_positive("n_tokens", n_tokens)
    check_positive("n_ubatch", n_ubatch)
    spec = placement.model
    n_ub = -(-n_tokens // n_ubatch)
    ub = min(n_tokens, n_ubatch)
    frac = expert_read_fraction(spec.n_experts, spec.n_experts_used, ub)
    weights = sum(d.dense_read_bytes + d.expert_bytes * frac for d in placement.devices)
    kv_tok = sum(d.kv_full_bytes_per_token + d.kv_swa_bytes_per_token for d in placement.devices)
    flops = sum(n_tokens * d.flops_per_token + d.attn_flops_per_token_ctx * n_tokens * n_tokens / 2 for d in placement.devices)
    bytes_ = n_ub * weights + 2 * n_tokens * kv_tok
    return point(r, f"prefill, {n_tokens} tokens", "model", "prefill", ub, n_tokens, flops, bytes_)


def saturation_batch(placement: Placement, machine, context: int, speed: SpeedModel = BANDWIDTH_ONLY, *, gain: float = 0.05,
                     max_batch: int = 1 << 16) -> int | None:
    """The batch where decode throughput stops growing: the smallest B at which doubling the batch
    raises tokens/s (``decode_step_time``) by less than ``gain``. None: still growing at max_batch
    (the cache, not the weights, dominates and its reads grow with the batch)."""
    def tok_s(b: int) -> float:
        return decode_step_time(placement, machine, context, b, speed)["tok_per_s"]

    def flat(b: int) -> bool:
        return tok_s(2 * b) < (1 + gain) * tok_s(b)

    hi = 1
    while not flat(hi):
        if hi >= max_batch:
            return None
        hi *= 2
    lo = hi // 2 + 1 if hi > 1 else 1  # flat(hi // 2) was False
    while lo < hi:
        mid = (lo + hi) // 2
        if flat(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _check_batch(batch) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidValueError(f"batch must be an integer >= 1, got {batch!r}")

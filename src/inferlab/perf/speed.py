"""How fast: decode and prefill time from a placement, on the roofline.

Decode reads, per step, every weight it touches plus the cached K/V of every sequence, from the
device that holds them; each device's time is the larger of bytes / (η·β) and FLOPs / (ε·P)
(the roofline), and devices run one after another (layer split). Prefill pushes the prompt
through in micro-batches: compute-bound, with a CPU-resident layer's weights copied over PCIe
to the GPU for large batches (llama.cpp's op offload).

Two parameter sets: ``BANDWIDTH_ONLY`` applies fixed efficiencies to the vendor peaks (η = 0.7 of
bandwidth everywhere, 50 % of peak compute for prefill, the CPU's assumed throughput: the seed
lesson's constants, which ``inferlab.perf_model`` exposes as ``LESSON``); ``CALIBRATED`` is fitted
on published llama-bench results (see calibration.py).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidValueError, check_positive
from ..hardware.device import Device, Machine
from .placement import Placement

OP_OFFLOAD_MIN_BATCH = 32  # llama.cpp CUDA: CPU-layer matmuls move to the GPU from this batch size

DeviceRate = Callable[[Device, Placement], float]  # (device, placement) -> a rate (bytes/s or FLOP/s)
OptionalDeviceRate = Callable[[Device, Placement], "float | None"]  # the same, None where the device has no such roof


@dataclass(frozen=True)
class SpeedModel:
    name: str
    decode_bw_eff: float = 0.7  # η: fraction of peak bandwidth decode kernels reach
    decode_bw_eff_by_backend: dict[str, float] = field(default_factory=dict)  # backend -> η (overrides)
    prefill_compute_eff: float = 0.5  # fraction of peak FP16 throughput prefill reaches
    prefill_compute_eff_by_backend: dict[str, float] = field(default_factory=dict)
    decode_compute_eff: float = 0.5  # for batched decode on the compute roof
    layer_overhead_s: dict[str, float] = field(default_factory=dict)  # backend -> fixed seconds per block per step (launches, syncs)
    cpu_decode_rate: DeviceRate | None = None  # callable(device, placement) -> bytes/s limit of dequantize+dot on CPU cores, or None
    cpu_layer_overhead: Callable[[Device], float] | None = None  # callable(device) -> seconds per block per step on that CPU (else layer_overhead_s["cpu"])
    cpu_prefill_rate: DeviceRate | None = None  # callable(device, placement) -> FLOP/s of that CPU's prompt matmuls (else ε·P)
    cpu_decode_bw_eff: Callable[[Device], float] | None = None  # callable(device) -> η of that CPU's decode, measured with its rates (else η)
    gpu_decode_rate: OptionalDeviceRate | None = None  # callable(device, placement) -> bytes/s a GPU's mat-vec kernels can issue (a roof below η·β), or None
    gpu_prefill_rate: OptionalDeviceRate | None = None  # callable(device, placement) -> FLOP/s of a GPU's prompt matmuls (else ε·P), or None
    device_class: Callable[[Device], "str | None"] | None = None  # callable(device) -> a finer key than the backend ("cuda/turing") for the dicts above, or None
    host_kv_layer_s: dict[str, float] = field(default_factory=dict)  # backend -> seconds per GPU block per step when its KV cache is in host RAM (-nkvo)
    host_attention_flops: float | None = None  # FLOP/s of prompt attention run on the host when the KV cache is in RAM (-nkvo); None: not modelled
    prefill_head_every_token: bool = True  # lesson: the output head runs for every prompt token; llama.cpp: the last only
    op_offload_transfers_per_ubatch: bool = False  # lesson: CPU weights cross PCIe once per prompt
    n_ubatch: int = 512
    attention_flops: bool = True  # count QK^T and AV FLOPs in prefill
    pcie_eff: float = 0.7  # fraction of the PCIe link's bandwidth weight copies reach

    def key(self, dev: Device, table: dict[str, float]) -> str:
        """The key of `table` that describes dev: its class (backend/generation) when the table has it, else its backend."""
        if self.device_class is not None:
            k = self.device_class(dev)
            if k is not None and k in table:
                return k
        return dev.backend

    def eta(self, dev: Device) -> float:
        if dev.is_cpu and self.cpu_decode_bw_eff is not None:
            return self.cpu_decode_bw_eff(dev)  # the share of bandwidth llama.cpp's decode reached on that CPU
        return self.decode_bw_eff_by_backend.get(self.key(dev, self.decode_bw_eff_by_backend), self.decode_bw_eff)

    def eps(self, dev: Device) -> float:
        return self.prefill_compute_eff_by_backend.get(self.key(dev, self.prefill_compute_eff_by_backend), self.prefill_compute_eff)


# Fixed efficiencies on the vendor peaks (the seed lesson's constants): η = 0.7 for every memory and
# the PCIe link, 50 % of peak FP16 for prefill, weight FLOPs only (2 per weight, token_embd excluded:
# it is a lookup), CPU weights cross PCIe once per prompt.
BANDWIDTH_ONLY = SpeedModel("bandwidth-only", attention_flops=False)


def _hw(placement: Placement, machine: Machine) -> list[Device]:
    _check_objects(placement, machine)
    return [machine.ram, *machine.gpus]


def _check_objects(placement, machine) -> None:
    """Typed errors naming the argument (not an AttributeError from inside)."""
    if not isinstance(placement, Placement):
        raise InvalidValueError(f"placement must be a Placement (from perf.placement.place), got {type(placement).__name__} {placement!r:.60}")
    if not isinstance(machine, Machine):
        raise InvalidValueError(f"machine must be a Machine (resolve a name with hardware.resolve.resolve_machine), "
                                f"got {type(machine).__name__} {machine!r:.60}")


def _check_ctx(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidValueError(f"{name} must be an integer >= 0 tokens, got {v!r}")


def expert_read_fraction(n_experts: int, n_used: int, batch: int) -> float:
    """Expected share of a layer's experts a batch touches, with routing spread uniformly:
    1 - (1 - k/n)^B (one token: k/n)."""
    if not n_experts:
        return 0.0
    return 1.0 - (1.0 - n_used / n_experts) ** batch


def _layer_overhead_s(model: SpeedModel, hw: Device) -> float:
    if hw.is_cpu and model.cpu_layer_overhead is not None:
        return model.cpu_layer_overhead(hw)  # the measured CPU's own graph and barrier cost per block
    return model.layer_overhead_s.get(model.key(hw, model.layer_overhead_s), 0.0)


def decode_step_time(placement: Placement, machine: Machine, context: int, batch: int = 1, model: SpeedModel = BANDWIDTH_ONLY) -> dict[str, Any]:
    """Seconds for one decode step of `batch` sequences at `context` cached tokens each.

    Returns total_s, tok_per_s (tokens generated per second, all sequences), gpu_s, cpu_s,
    per_device (seconds and bytes), bound of the slowest device ("memory", "compute", or
    "cpu-kernels" when the CPU's dequantize-and-dot throughput, not its memory, limits it) and
    bottleneck (a sentence).
    """
    _check_objects(placement, machine)
    _check_ctx("context", context)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidValueError(f"batch must be an integer >= 1, got {batch!r}")
    spec = placement.model
    frac = expert_read_fraction(spec.n_experts, spec.n_experts_used, batch)
    swa_ctx = min(context, spec.sliding_window or context)  # sliding-window layers read at most the window
    cpu_rate = model.cpu_decode_rate
    per: list[dict[str, Any]] = []
    total = 0.0
    for d, hw in zip(placement.devices, _hw(placement, machine)):
        weights = d.dense_read_bytes + d.expert_bytes * frac  # weights read once for the whole batch
        kv = batch * (d.kv_full_bytes_per_token * context + d.kv_swa_bytes_per_token * swa_ctx)  # every sequence reads its own cache
        bytes_ = weights + kv
        if not bytes_ and not d.flops_per_token:  # a device with nothing to do this step (the host of a full offload)
            p = {"device": d.name, "kind": d.kind, "s": 0.0, "bytes": 0.0, "weights_bytes": 0.0, "kv_bytes": 0.0,
                 "memory_s": 0.0, "compute_s": 0.0, "overhead_s": 0.0, "bound": "memory"}
        else:
            bw = hw.bandwidth_bytes_per_s * model.eta(hw)
            kernel_bound = False
            if cpu_rate is not None and weights and hw.is_cpu:
                rate = cpu_rate(hw, placement)  # dequantize-and-dot throughput of the cores
                kernel_bound = rate < bw
                bw = min(bw, rate)
            elif model.gpu_decode_rate is not None and weights and not hw.is_cpu:
                rate = model.gpu_decode_rate(hw, placement)  # bytes/s the GPU's cores dequantize and dot (None: no such roof)
                if rate is not None:
                    kernel_bound = rate < bw
                    bw = min(bw, rate)
            mem_s = bytes_ / bw
            flops = batch * (d.flops_per_token + d.attn_flops_per_token_ctx * context)
            comp_s = flops / (hw.fp16_flops * model.decode_compute_eff)
            over = _layer_overhead_s(model, hw) * d.n_blocks
            if (model.host_kv_layer_s and not hw.is_cpu and d.n_blocks and not (d.kv_full_bytes_per_token or d.kv_swa_bytes_per_token)
                    and placement.devices[0].kv_full_bytes_per_token + placement.devices[0].kv_swa_bytes_per_token):
                # -nkvo: each GPU block's attention runs on the host, against the cache in RAM: a round trip per block
                over += model.host_kv_layer_s.get(model.key(hw, model.host_kv_layer_s), 0.0) * d.n_blocks
            t = max(mem_s, comp_s) + over if (bytes_ or flops) else 0.0
            p = {"device": d.name, "kind": d.kind, "s": t, "bytes": bytes_, "weights_bytes": weights, "kv_bytes": kv,
                 "memory_s": mem_s, "compute_s": comp_s, "overhead_s": over,
                 "bound": "compute" if comp_s > mem_s else ("cpu-kernels" if kernel_bound and hw.is_cpu else "memory")}
        per.append(p)
        total += p["s"]
    slow = max(per, key=lambda p: p["s"])  # the first of the slowest devices
    cpu_s = per[0]["s"]
    gpu_s = total - cpu_s
    if cpu_s > 0.5 * total and len(per) > 1:
        why = f"partial offload: {cpu_s / total:.0%} of each step is spent on the CPU's layers in system RAM"
    elif slow["bound"] == "cpu-kernels":
        why = (f"per-core compute on {slow['device']}: the CPU cores dequantize and multiply the weights slower "
               f"than its memory delivers them ({slow['bytes'] / 1e9:.2f} GB per step)")
    elif slow["bound"] == "compute":
        why = f"compute-bound on {slow['device']} (batch {batch} is past the ridge point)"
    else:
        why = f"memory-bandwidth-bound on {slow['device']}: {slow['bytes'] / 1e9:.2f} GB read per step"
    return {"total_s": total, "tok_per_s": batch / total if total else math.inf, "gpu_s": gpu_s, "cpu_s": cpu_s,
            "batch": batch, "context": context, "per_device": per, "bound": slow["bound"], "bottleneck": why}


def check_kv_room(placement: Placement, context: int, batch: int = 1) -> None:
    """Refuse a decode of ``batch`` sequences at ``context`` cached tokens each when they do not fit
    in the cache the placement allocated: llama.cpp reserves ``-c`` cells shared by all sequences
    (one unified buffer), so they need batch x context <= n_ctx. The message gives the numbers."""
    from .kv_size import kv_cache_bytes

    _check_ctx("context", context)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidValueError(f"batch must be an integer >= 1, got {batch!r}")
    cells = batch * context
    if cells <= placement.n_ctx:
        return
    need = kv_cache_bytes(placement.model, cells, placement.kv_type, batch)
    raise InvalidValueError(
        f"batch {batch} x context {context:,} = {cells:,} cached tokens do not fit in the KV cache allocated for "
        f"-c {placement.n_ctx:,} ({placement.kv_total / 1e9:.2f} GB of {placement.kv_type}); they need "
        f"{need / 1e9:.2f} GB: raise -c to at least {cells:,}, or lower the batch or the context")


def prefill_time(placement: Placement, machine: Machine, n_tokens: int, model: SpeedModel = BANDWIDTH_ONLY, context: int = 0) -> dict[str, Any]:
    """Seconds to process a prompt of n_tokens (after `context` cached tokens).

    GPU layers compute at ε·P of their GPU. CPU layers compute on the CPU, unless op offload
    applies (a GPU is present and the micro-batch has >= 32 tokens): then their matmuls run on
    the GPU and their weights cross PCIe (once per prompt in the lesson, once per micro-batch in
    llama.cpp, which `op_offload_transfers_per_ubatch` selects).
    """
    _check_objects(placement, machine)
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Integral) or n_tokens < 1:
        raise InvalidValueError(f"n_tokens must be a whole number of tokens >= 1, got {n_tokens!r}")
    n_tokens = int(n_tokens)
    _check_ctx("context", context)
    hw = _hw(placement, machine)
    gpu_hw = hw[1] if len(hw) > 1 else None
    n_ub = math.ceil(n_tokens / model.n_ubatch)
    ub = min(n_tokens, model.n_ubatch)
    avg_ctx = context + n_tokens / 2 if model.attention_flops else 0  # mean cached tokens a prompt token attends to
    per: list[dict[str, Any]] = []
    pcie_s = 0.0
    head = 2.0 * placement.model.vocab_size * placement.model.d_model  # FLOPs of the output head per token
    for d, h in zip(placement.devices, hw):
        flops = n_tokens * (d.flops_per_token + d.attn_flops_per_token_ctx * avg_ctx)
        if d.has_output and not model.prefill_head_every_token:
            flops -= (n_tokens - 1) * head  # logits for the batch's last token only
        # --n-cpu-moe: the host holds GPU blocks' routed experts but owns none of their FLOPs (they stay on
        # the GPU's share: op offload runs them there); it still pays their PCIe copy below, so it is not skipped
        holds_weights = h.is_cpu and (d.dense_read_bytes or d.expert_bytes)
        if not flops and not holds_weights:
            per.append({"device": d.name, "s": 0.0, "compute_s": 0.0, "transfer_s": 0.0, "where": h.name})
            continue
        host_attn_s = 0.0
        nkvo_blocks = sum(g.n_blocks for g in placement.devices[1:] if not (g.kv_full_bytes_per_token or g.kv_swa_bytes_per_token))
        if h.is_cpu and model.host_attention_flops and nkvo_blocks and d.attn_flops_per_token_ctx and avg_ctx:
            # -nkvo: the attention of the GPU's blocks runs on the host, against the cache in RAM (never op-offloaded);
            # the host's attention FLOPs are its own blocks' and those, in proportion to the blocks
            attn = n_tokens * d.attn_flops_per_token_ctx * avg_ctx * nkvo_blocks / (nkvo_blocks + d.n_blocks)
            host_attn_s = attn / model.host_attention_flops
            flops -= attn
        runs_on = h
        transfer = 0.0
        if h.is_cpu and gpu_hw is not None and ub >= OP_OFFLOAD_MIN_BATCH and not machine.unified:
            runs_on = gpu_hw  # op offload: the CPU layers' matmuls run on the GPU
            moved = d.dense_read_bytes + d.expert_bytes
            transfer = moved * (n_ub if model.op_offload_transfers_per_ubatch else 1) / (machine.pcie_gbs * 1e9 * model.pcie_eff)
        gpu_rate = model.gpu_prefill_rate(runs_on, placement) if (model.gpu_prefill_rate is not None and not runs_on.is_cpu) else None
        if runs_on.is_cpu and model.cpu_prefill_rate is not None:
            comp = flops / model.cpu_prefill_rate(runs_on, placement)  # the CPU's measured rate for these weight types
        elif gpu_rate is not None:
            comp = flops / gpu_rate  # the GPU's rate for these weight types' matmul kernels (MMQ or dequantize + GEMM)
        else:
            comp = flops / (runs_on.fp16_flops * model.eps(runs_on))
        over = _layer_overhead_s(model, runs_on) * d.n_blocks * n_ub
        per.append({"device": d.name, "s": comp + transfer + over + host_attn_s, "compute_s": comp, "transfer_s": transfer, "where": runs_on.name,
                    "host_attention_s": host_attn_s})
        pcie_s += transfer
    total = sum(p["s"] for p in per)
    return {"total_s": total, "tok_per_s": n_tokens / total, "n_tokens": n_tokens, "pcie_s": pcie_s,
            "cpu_s": per[0]["s"], "gpu_s": total - per[0]["s"], "per_device": per}


def ridge_batch(device: Device, bits_per_weight: float) -> float:
    """Batch at which a weight matmul turns compute-bound: 16·B/bpw = P/β (FLOP per byte)."""
    check_positive("bits_per_weight", bits_per_weight)
    ridge_intensity = device.fp16_flops / device.bandwidth_bytes_per_s  # FLOP/byte where the roofs meet
    return ridge_intensity * bits_per_weight / 16  # 2B FLOP per weight over bpw/8 bytes per weight


def arithmetic_intensity(batch: int, bits_per_weight: float) -> float:
    """FLOP per byte of a weight matmul over `batch` tokens: 2B / (bpw/8)."""
    return 2 * batch / (bits_per_weight / 8)


def roofline_point(device: Device, batch: int, bits_per_weight: float, eta: float = 1.0) -> dict:
    """Attainable throughput of a weight matmul at a batch: min(P, I·β)."""
    i = arithmetic_intensity(batch, bits_per_weight)
    mem_roof = i * device.bandwidth_bytes_per_s * eta
    attained = min(device.fp16_flops, mem_roof)
    return {"batch": batch, "intensity_flop_per_byte": i, "attained_tflops": attained / 1e12,
            "peak_tflops": device.fp16_tflops, "ridge_intensity": device.fp16_flops / device.bandwidth_bytes_per_s,
            "bound": "compute" if mem_roof >= device.fp16_flops else "memory", "utilization": attained / device.fp16_flops}


def throughput(placement: Placement, machine: Machine, batch: int, context: int, model: SpeedModel = BANDWIDTH_ONLY) -> dict:
    """Aggregate decode tokens/s of `batch` concurrent sequences (the roofline in practice)."""
    d = decode_step_time(placement, machine, context, batch, model)
    return {"batch": batch, "tok_per_s": d["tok_per_s"], "per_sequence_tok_per_s": d["tok_per_s"] / batch, "step_s": d["total_s"], "bound": d["bound"]}

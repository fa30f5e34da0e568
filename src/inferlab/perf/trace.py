"""What happens on the hardware, step by step: a llama.cpp load, a prefill, a decode step.

Each phase is a tuple of :class:`Step` records (where, bytes moved, FLOPs, seconds, what bounds
it), computed from a placement and the speed functions of ``speed.py``: a prefill trace's seconds
add up to ``prefill_time``'s total and a decode trace's to ``decode_step_time``'s, for the same
placement and speed model (the traces split those figures, they do not re-model them).

The load follows llama.cpp (src/llama-model.cpp load_tensors, src/llama-kv-cache.cpp): the GGUF
header and tensor table are read, the file is mmap'd (addressable, not read), each offloaded
layer is read from the file and copied into VRAM (bounded by the slower of the drive and the PCIe
link; on unified memory Metal wraps the mapped pages and nothing is copied), the KV cache is
allocated for the whole context and cleared (``ggml_backend_buffer_clear(buf, 0)``), compute
buffers are reserved, and the warm-up pass (llama-server's default, ``--no-warmup`` skips it)
touches every weight, so the CPU-resident layers page in from the drive. A second launch finds
the file in the OS page cache. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InvalidValueError, check_positive
from ..hardware.device import Machine
from .placement import Placement
from .speed import BANDWIDTH_ONLY, OP_OFFLOAD_MIN_BATCH, SpeedModel, decode_step_time, expert_read_fraction, prefill_time

# what bounds a step: a memory's bandwidth, a processor's arithmetic, the PCIe link, the drive,
# the CPU cores' dequantize-and-dot rate, a fixed per-kernel cost, or nothing (bookkeeping)
BOUNDS = ("memory", "compute", "link", "disk", "cpu-kernels", "overhead", "none")
NVME_GBPS = 3.5  # assumed drive: a PCIe 3/4 NVMe's sequential read, GB/s (the lesson's 3-7 GB/s range)
PHASES = ("load", "prefill", "decode")


@dataclass(frozen=True)
class Step:
    """One thing the hardware does, with what it costs."""

    name: str
    where: str  # a device (its name) or a link ("PCIe", "drive")
    bytes_moved: float  # bytes read, written or copied
    flops: float  # floating-point operations
    s: float  # seconds
    bound: str  # one of BOUNDS
    detail: str = ""
    micro_batch: int | None = None  # prefill: which micro-batch (0-based)


def total_s(steps) -> float:
    """Seconds of a trace: its steps run one after another."""
    return math.fsum(st.s for st in steps)


def device_labels(placement: Placement) -> tuple[str, ...]:
    """A distinct name per device of the placement, host first: a GPU's name, numbered when the
    machine has several of the same kind ("RTX 3090 #0", "RTX 3090 #1")."""
    names = [d.name for d in placement.devices]
    out = [names[0]]
    for i, n in enumerate(names[1:]):
        out.append(f"{n} #{i}" if names[1:].count(n) > 1 else n)
    return tuple(out)


# ---------------------------------------------------------------- load


def _token_embd_bytes(placement: Placement) -> float:
    """Input-embedding bytes: a token reads one row of it, so it never pages in whole (unless the
    output head is tied to it and runs on the host)."""
    from .placement import _prefix  # the placement's own per-model sums

    return _prefix(placement.model, placement.scheme).token_embd


def load_steps(placement: Placement, machine: Machine, *, disk_gbps: float = NVME_GBPS, page_cache: bool = False,
               speed: SpeedModel = BANDWIDTH_ONLY, header_bytes: float = 0.0) -> tuple[Step, ...]:
    """The steps of a llama.cpp load (see the module docstring). ``page_cache``: the second
    launch, the file already in the OS page cache. ``disk_gbps``: the drive's read rate (assumed
    3.5 GB/s unless known). ``header_bytes``: the GGUF header's size, when the file is known."""
    check_positive("disk_gbps", disk_gbps)
    disk_bps = disk_gbps * 1e9
    steps = [Step("read header", "drive", header_bytes, 0.0, 0.0 if page_cache else header_bytes / disk_bps, "disk",
                  "GGUF metadata and tensor table (names, shapes, types, offsets)"),
             Step("mmap the file", machine.ram.name, 0.0, 0.0, 0.0, "none",
                  "addressable, not read: pages arrive from the drive when first touched"
                  + ("; this launch finds them in the OS page cache" if page_cache else ""))]
    # a copy reads the file (drive, or the page cache at RAM speed) and crosses the link
    src_bps = machine.ram.bandwidth_bytes_per_s * speed.eta(machine.ram) if page_cache else disk_bps
    labels = device_labels(placement)
    for g, label in zip(placement.gpus, labels[1:]):
        if not g.weights_bytes:
            continue
        what = f"{g.n_blocks} blocks" + (" + output head" if g.has_output else "")
        if machine.unified:
            steps.append(Step(f"map {what} into {label}'s buffers", label, 0.0, 0.0, 0.0, "none",
                              "unified memory: the GPU reads the mapped pages in place, nothing is copied"))
            continue
        link_bps = machine.pcie_gbs * 1e9 * speed.pcie_eff
        rate = min(src_bps, link_bps)  # bounded by the slower of the source and the link
        bound = "link" if link_bps <= src_bps else "disk"
        steps.append(Step(f"copy {what} to {label}", "PCIe", g.weights_bytes, 0.0, g.weights_bytes / rate, bound,
                          ("read from the page cache" if page_cache else f"read from the drive at {disk_gbps:g} GB/s")
                          + f", copied over PCIe at {speed.pcie_eff:g} x {machine.pcie_gbs:g} GB/s"))
    hw = [machine.ram, *machine.gpus]
    for d, dev, label in zip(placement.devices, hw, labels):
        if d.kv_bytes:
            bw = dev.bandwidth_bytes_per_s * speed.eta(dev)
            steps.append(Step("allocate and clear the KV cache", label, d.kv_bytes, 0.0, d.kv_bytes / bw, "memory",
                              f"{placement.n_ctx} cells x {placement.kv_type} for {d.n_blocks} blocks, reserved up front and zeroed"))
        if d.compute_bytes:
            steps.append(Step("reserve compute buffers", label, d.compute_bytes, 0.0, 0.0, "none",
                              "activations of one micro-batch (allocated, not written)"))
    # the warm-up pass touches every weight: what no GPU copied is read from the mapping now
    embd = _token_embd_bytes(placement)
    tied_on_host = placement.model.tied_embeddings and placement.cpu.has_output
    host_w = placement.cpu.weights_bytes - (0.0 if tied_on_host else embd)  # a token reads one embedding row
    if machine.unified:
        host_w = sum(d.weights_bytes for d in placement.devices) - (0.0 if tied_on_host else embd)
    if host_w > 0:
        where = "the GPU's mapped weights" if machine.unified else "the CPU-resident layers"
        steps.append(Step(f"warm-up pass pages in {where}", "drive", host_w, 0.0, 0.0 if page_cache else host_w / disk_bps,
                          "none" if page_cache else "disk",
                          "already in the page cache: minor page faults only" if page_cache
                          else "lazy page-in of the mmap'd weights on first touch (llama-server's warm-up run; --no-warmup defers it to the first request)"))
    return tuple(steps)


# ---------------------------------------------------------------- decode


def decode_steps(placement: Placement, machine: Machine, context: int, batch: int = 1,
                 speed: SpeedModel = BANDWIDTH_ONLY) -> tuple[Step, ...]:
    """One decode step of ``batch`` sequences at ``context`` cached tokens, per device: reading the
    weights, reading the K/V cache, and the fixed per-block cost. Each device's time is
    ``decode_step_time``'s, split between weights and KV in proportion to their bytes (memory-bound)
    or their FLOPs (compute-bound)."""
    d = decode_step_time(placement, machine, context, batch, speed)
    steps = []
    for du, p, where in zip(placement.devices, d["per_device"], device_labels(placement)):
        if not p["s"]:
            continue
        w_flops = batch * du.flops_per_token  # 2 FLOPs per weight touched, every sequence
        a_flops = batch * du.attn_flops_per_token_ctx * context  # QK^T and AV over the cached tokens
        body = max(p["memory_s"], p["compute_s"])
        if p["bound"] == "compute":
            share = w_flops / (w_flops + a_flops) if w_flops + a_flops else 1.0
        else:
            share = p["weights_bytes"] / p["bytes"] if p["bytes"] else 1.0
        w_s = body * share
        steps.append(Step("read weights", where, p["weights_bytes"], w_flops, w_s, p["bound"],
                          f"{du.n_blocks} blocks" + (" + output head" if du.has_output else "") + ", read once for the batch"))
        if p["kv_bytes"] or a_flops:
            steps.append(Step("read KV cache", where, p["kv_bytes"], a_flops, body - w_s, p["bound"],
                              f"{batch} x {context} cached tokens, every sequence its own"))
        if p["overhead_s"]:
            steps.append(Step("per-block cost", where, 0.0, 0.0, p["overhead_s"], "overhead",
                              f"{du.n_blocks} blocks x kernel launches, graph and synchronisation"))
    return tuple(steps)


# ---------------------------------------------------------------- prefill


def prefill_steps(placement: Placement, machine: Machine, n_tokens: int, speed: SpeedModel = BANDWIDTH_ONLY,
                  context: int = 0) -> tuple[Step, ...]:
    """A prompt of ``n_tokens`` (after ``context`` cached ones) in micro-batches of ``speed.n_ubatch``,
    per micro-batch and device: the op-offload copy of CPU layers' weights (when a micro-batch has
    >= 32 tokens and a discrete GPU is present), the matmuls, the per-block cost. Each device's
    compute seconds are ``prefill_time``'s, shared among micro-batches by their FLOPs (later
    micro-batches attend to more tokens); a matmul step's bytes are the weights it reads once for
    its micro-batch (the speed model counts prefill as compute-bound: see perf.roofline for why)."""
    f = prefill_time(placement, machine, n_tokens, speed, context)
    n_ub = math.ceil(n_tokens / speed.n_ubatch)
    bounds = [(k * speed.n_ubatch, min(n_tokens, (k + 1) * speed.n_ubatch)) for k in range(n_ub)]
    head = 2.0 * placement.model.vocab_size * placement.model.d_model  # output-head FLOPs per token
    attn_on = speed.attention_flops
    steps = []
    rows = []
    for du, p in zip(placement.devices, f["per_device"]):
        if not p["s"]:
            rows.append(None)
            continue
        per_ub = []
        for k, (a, b) in enumerate(bounds):
            n = b - a
            fl = n * du.flops_per_token
            if attn_on:  # token i attends to context + i + 1/2 on average: the sum over the prompt is n^2/2, as prefill_time counts
                fl += du.attn_flops_per_token_ctx * (n * context + (b * b - a * a) / 2)
            if du.has_output and not speed.prefill_head_every_token:
                fl -= (n - (1 if k == n_ub - 1 else 0)) * head  # logits for the prompt's last token only
            per_ub.append(fl)
        rows.append(per_ub)
    labels = device_labels(placement)
    for k, (a, b) in enumerate(bounds):
        for i, (du, p, per_ub) in enumerate(zip(placement.devices, f["per_device"], rows)):
            if per_ub is None:
                continue
            own = labels[i]
            runs_on = own if p["where"] == du.name else labels[1]  # op offload runs a CPU layer on the first GPU
            tot = math.fsum(per_ub)
            if p["transfer_s"] and (speed.op_offload_transfers_per_ubatch or k == 0):
                moved = du.dense_read_bytes + du.expert_bytes
                t = p["transfer_s"] / n_ub if speed.op_offload_transfers_per_ubatch else p["transfer_s"]
                steps.append(Step(f"op offload: copy {own}'s layers to {runs_on}", "PCIe", moved, 0.0, t, "link",
                                  f"micro-batch of {b - a} tokens >= {OP_OFFLOAD_MIN_BATCH}: the CPU layers' matmuls run on the GPU", k))
            comp = p["compute_s"] * (per_ub[k] / tot if tot else 1.0 / n_ub)
            spec = placement.model
            read = du.dense_read_bytes + du.expert_bytes * expert_read_fraction(spec.n_experts, spec.n_experts_used, b - a)  # weights read once per micro-batch
            steps.append(Step("matmuls" if runs_on == own else f"matmuls of {own}'s layers", runs_on, read, per_ub[k], comp, "compute",
                              f"tokens {a}-{b - 1}: {du.n_blocks} blocks" + (" + output head" if du.has_output else ""), k))
            over = p["s"] - p["compute_s"] - p["transfer_s"]  # the per-block cost of every micro-batch
            if over > 0:
                steps.append(Step("per-block cost", runs_on, 0.0, 0.0, over / n_ub, "overhead",
                                  f"{du.n_blocks} blocks x kernel launches", k))
    return tuple(steps)


def check_phase(phase: str) -> str:
    if phase not in PHASES:
        from ..errors import UnknownNameError

        raise UnknownNameError("trace phase", phase, PHASES)
    return phase


def check_contexts(contexts, n_ctx: int) -> tuple[int, ...]:
    out = []
    for c in contexts:
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise InvalidValueError(f"contexts must be integers >= 0 tokens, got {c!r}")
        if c > n_ctx:
            raise InvalidValueError(f"context {c} exceeds the allocated cache of {n_ctx} tokens (-c); pass a larger context")
        out.append(c)
    return tuple(out)

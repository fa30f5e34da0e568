"""``trace(phase, model, machine, ...) -> TraceReport``: what the hardware does, step by step.

``load`` (header, mmap, copies of offloaded layers, KV and buffer allocation, page-in; the first
and the second launch), ``prefill`` (per micro-batch and device, op offload) and ``decode`` (one
step per device, weights vs KV, and the decode curve as the context grows, per KV type). Every
step comes from ``perf.trace`` on the placement ``configure`` resolves, so a prefill or decode
trace adds up to the speed model's own figure for the same configuration (``speed_model_s``).
A configuration that does not fit gets no prefill or decode steps (it would not run); its load
trace ends where the allocation fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError, check_positive
from ..models.spec import ModelSpec
from ..perf.speed import SpeedModel, check_kv_room, decode_step_time, prefill_time
from ..perf.trace import NVME_GBPS, Step, check_contexts, check_phase, decode_steps, device_labels, load_steps, prefill_steps, total_s
from .report import Figure, Report
from .setup import Setup, configure

DEFAULT_PROMPT_TOKENS = 512  # as `fit` (llama-bench's pp512)
DEFAULT_DECODE_CONTEXT_MAX = 4096  # decode at half the context, at most this many tokens (as `fit`)
CURVE_POINTS = (0, 1 / 8, 1 / 4, 1 / 2, 1)  # the decode curve's contexts, as shares of the allocated cache


@dataclass(frozen=True)
class CurvePoint:
    """Decode at one context length for one KV-cache type (the lesson's "decode slows as context grows")."""

    kv_type: str
    context_tokens: int
    tok_per_s: float
    step_s: float
    weights_bytes: float  # read per step
    kv_bytes: float  # cached K/V read per step
    cpu_s: float
    gpu_s: float
    n_gpu_layers: int  # the placement this KV type gets (--fit may offload more layers with a smaller cache)


@dataclass(frozen=True)
class TraceReport(Report):
    phase: str  # "load", "prefill" or "decode"
    model: str
    quant: str
    machine: str
    machine_id: str | None
    speed_model: str
    n_ctx: int
    kv_type: str
    n_gpu_layers: int
    fits: bool
    reason: str  # why it does not fit
    steps: tuple[Step, ...]  # in order; seconds add up to total_s
    total_s: float | None  # None: prefill/decode of a configuration that does not fit
    speed_model_s: float | None  # the speed model's figure for the same configuration (prefill_time / decode_step_time)
    by_bound_s: dict[str, float]  # seconds per bound (memory, compute, link, disk, ...)
    by_where_s: dict[str, float]  # seconds per device or link
    n_tokens: int | None  # prefill: prompt tokens
    context_tokens: int | None  # prefill: cached tokens before the prompt; decode: cached tokens per sequence
    batch: int | None  # decode: sequences
    tok_per_s: float | None
    second_launch: tuple[Step, ...]  # load: the same load with the file in the OS page cache
    second_launch_s: float | None
    curve: tuple[CurvePoint, ...]  # decode: tok/s against context, per KV type
    notes: tuple[str, ...]
    figures: tuple[Figure, ...]


def _sums(steps, key) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for st in steps:
        out.setdefault(getattr(st, key), []).append(st.s)
    return {k: math.fsum(v) for k, v in out.items()}


def _header_bytes(spec: ModelSpec) -> float:
    """A GGUF's header and tensor table: the file's bytes before its tensor data (0 when not from a file)."""
    x = spec.extra or {}
    if spec.tensors is None or not x.get("file_bytes"):
        return 0.0
    return float(max(0, x["file_bytes"] - sum(t.n_bytes for t in spec.tensors)))


def _base(setup: Setup, phase: str, steps, notes=(), figures=(), **kw) -> TraceReport:
    p = setup.placement
    qlabel = setup.scheme.label if setup.scheme is not None else f"the file's own tensors ({setup.spec.file_type or 'mixed'})"
    from .fit import _figures  # the same input figures, with their origins, as `fit` reports

    fields: dict[str, Any] = dict(phase=phase, model=setup.spec.name, quant=qlabel, machine=setup.machine.name, machine_id=setup.machine_id,
                  speed_model=setup.speed.name, n_ctx=p.n_ctx, kv_type=setup.kv_type, n_gpu_layers=p.n_gpu_layers, fits=p.fits,
                  reason=p.reason, steps=tuple(steps), total_s=total_s(steps) if steps else None, speed_model_s=None,
                  by_bound_s=_sums(steps, "bound"), by_where_s=_sums(steps, "where"), n_tokens=None, context_tokens=None, batch=None,
                  tok_per_s=None, second_launch=(), second_launch_s=None, curve=(), notes=tuple(p.notes) + tuple(notes),
                  figures=_figures(setup) + tuple(figures))
    fields.update(kw)
    return TraceReport(**fields)


def load_trace(setup: Setup, *, disk_gbps: float = NVME_GBPS) -> TraceReport:
    """The load of a resolved configuration: the first launch (weights from the drive) and the second (page cache)."""
    p, m = setup.placement, setup.machine
    hdr = _header_bytes(setup.spec)
    first = list(load_steps(p, m, disk_gbps=disk_gbps, page_cache=False, speed=setup.speed, header_bytes=hdr))
    notes = []
    # the page cache keeps the file only when RAM holds it beside what the host allocates
    host_alloc = sum(d.kv_bytes + d.compute_bytes for d in p.devices) if m.unified else p.cpu.kv_bytes + p.cpu.compute_bytes
    cached = p.weights_total + host_alloc <= m.ram.memory_gb * 1e9
    second = list(load_steps(p, m, disk_gbps=disk_gbps, page_cache=cached, speed=setup.speed, header_bytes=hdr))
    if not cached:
        notes.append(f"the {p.weights_total / 1e9:.1f} GB of weights do not stay in the page cache beside {host_alloc / 1e9:.1f} GB of "
                     f"host buffers in {m.ram.memory_gb:g} GB of RAM: a second launch reads the drive again")
    for d, label in zip(p.gpus, device_labels(p)[1:]):
        if d.total_bytes > d.capacity_bytes:  # the allocation itself fails: the load stops there
            fail = Step(f"allocation fails on {label}", label, d.total_bytes, 0.0, 0.0, "none",
                        f"needs {d.total_bytes / 1e9:.2f} GB of its {d.capacity_bytes / 1e9:.2f} GB: llama.cpp exits "
                        "(failed to allocate buffer); lower -ngl or -c, or let --fit choose")
            weights_too = d.weights_bytes > d.capacity_bytes  # the weight buffers fail before anything is copied
            first = _cut_at_allocation(first, label, weights_too) + [fail]
            second = _cut_at_allocation(second, label, weights_too) + [fail]
            break  # llama.cpp stops at the first allocation that fails
    host = p.cpu
    if not m.unified and host.total_bytes > host.capacity_bytes:
        notes.append(f"host RAM holds {host.capacity_bytes / 1e9:.1f} GB but the CPU side needs {host.total_bytes / 1e9:.1f} GB: "
                     "the mmap'd weights are evicted and re-read from the drive on every token")
    disk = Figure("drive read rate", disk_gbps, "GB/s", "assumed" if disk_gbps == NVME_GBPS else "measured",
                  "a PCIe 3/4 NVMe's sequential read (the lesson's 3-7 GB/s range)" if disk_gbps == NVME_GBPS else "given by the caller")
    return _base(setup, "load", first, notes, (disk,), second_launch=tuple(second), second_launch_s=total_s(second))


def _cut_at_allocation(steps: list[Step], device: str, weights: bool) -> list[Step]:
    """The steps before the allocation that fails on a device: its weight buffers (llama.cpp
    allocates them before reading any tensor data), else its KV cache or compute buffers."""
    for i, st in enumerate(steps):
        if weights and st.name.endswith(f" to {device}") or st.name.endswith(f" into {device}'s buffers"):
            return steps[:i]
        if not weights and st.where == device and st.name.startswith(("allocate", "reserve")):
            return steps[:i]
    return steps


def prefill_trace(setup: Setup, n_tokens: int = DEFAULT_PROMPT_TOKENS, context: int = 0) -> TraceReport:
    """A prompt of n_tokens (after ``context`` cached ones), per micro-batch and device."""
    check_positive("n_tokens", n_tokens)
    p = setup.placement
    check_kv_room(p, context + n_tokens, 1)
    if not p.fits:
        return _base(setup, "prefill", (), ("no prefill: this configuration does not fit, so it would not run",),
                     n_tokens=n_tokens, context_tokens=context)
    steps = prefill_steps(p, setup.machine, n_tokens, setup.speed, context)
    f = prefill_time(p, setup.machine, n_tokens, setup.speed, context)
    return _base(setup, "prefill", steps, n_tokens=n_tokens, context_tokens=context, speed_model_s=f["total_s"],
                 tok_per_s=n_tokens / total_s(steps))


def decode_trace(setup: Setup, context: int | None = None, batch: int = 1, *, contexts=None, kv_types=None,
                 configure_args: dict[str, Any] | None = None) -> TraceReport:
    """One decode step of ``batch`` sequences at ``context`` cached tokens each (default: half the
    cache, at most 4096), and the decode curve at ``contexts`` for each of ``kv_types`` (default:
    the configured type and q8_0, or f16 when q8_0 is configured). ``configure_args``: how the setup
    was made, to place the other KV types the same way (without it the curve has the configured type only)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidValueError(f"batch must be an integer >= 1 sequences, got {batch!r}")
    p = setup.placement
    ctx = context if context is not None else min(p.n_ctx // (2 * batch), DEFAULT_DECODE_CONTEXT_MAX)  # half a sequence's share
    check_kv_room(p, ctx, batch)
    if not p.fits:
        return _base(setup, "decode", (), ("no decode: this configuration does not fit, so it would not run",),
                     context_tokens=ctx, batch=batch)
    steps = decode_steps(p, setup.machine, ctx, batch, setup.speed)
    d = decode_step_time(p, setup.machine, ctx, batch, setup.speed)
    if kv_types is None:
        kv_types = (setup.kv_type, "f16" if setup.kv_type == "q8_0" else "q8_0") if configure_args is not None else (setup.kv_type,)
    curve, notes = _curve(setup, contexts, tuple(dict.fromkeys(kv_types)), batch, configure_args or {})
    return _base(setup, "decode", steps, notes, context_tokens=ctx, batch=batch, speed_model_s=d["total_s"],
                 tok_per_s=batch / total_s(steps), curve=curve)


def _curve(setup: Setup, contexts, kv_types, batch: int, args: dict) -> tuple[tuple[CurvePoint, ...], list[str]]:
    pts, notes = [], []
    for kv in kv_types:
        if kv == setup.kv_type:
            s = setup
        elif not args:
            raise InvalidValueError("kv_types other than the configured one need configure_args (how to place them)")
        else:
            try:
                s = configure(**{**args, "kv_type": kv})
            except InvalidValueError as exc:  # e.g. a quantized V cache with -fa off
                notes.append(f"no {kv} curve: {exc}")
                continue
        p = s.placement
        if not p.fits:
            notes.append(f"no {kv} curve: {p.reason}")
            continue
        cap = p.n_ctx // batch  # cells per sequence
        cs = check_contexts(contexts, cap) if contexts is not None else tuple(sorted({int(cap * f) for f in CURVE_POINTS}))
        for c in cs:
            d = decode_step_time(p, s.machine, c, batch, s.speed)
            pts.append(CurvePoint(kv, c, d["tok_per_s"], d["total_s"], sum(x["weights_bytes"] for x in d["per_device"]),
                                  sum(x["kv_bytes"] for x in d["per_device"]), d["cpu_s"], d["gpu_s"], p.n_gpu_layers))
    return tuple(pts), notes


def trace(phase: str, model: ModelSpec | str, machine: Any, *, quant: Any = None, n_ctx: int | None = None, kv_type: str = "f16",
          n_gpu_layers: int | None = None, n_cpu_moe: int = 0, speed: str | SpeedModel = "calibrated", order: str = "llama.cpp",
          flash_attn: str = "auto", bare: str = "preset", profile: bool = True, n_tokens: int = DEFAULT_PROMPT_TOKENS,
          context: int | None = None, batch: int = 1, contexts=None, kv_types=None, disk_gbps: float = NVME_GBPS) -> TraceReport:
    """The step-by-step trace of one phase (load, prefill or decode) of a configuration (the same
    arguments as ``fit``; see ``configure``). prefill: ``n_tokens`` after ``context`` cached ones
    (default 0); decode: ``batch`` sequences at ``context`` cached tokens (default half the cache,
    at most 4096) and the curve at ``contexts`` per ``kv_types``; load: ``disk_gbps``."""
    check_phase(phase)
    args: dict[str, Any] = dict(model=model, machine=machine, quant=quant, n_ctx=n_ctx, kv_type=kv_type, n_gpu_layers=n_gpu_layers,
                n_cpu_moe=n_cpu_moe, speed=speed, order=order, flash_attn=flash_attn, bare=bare, profile=profile)
    setup = configure(**args)
    if phase == "load":
        return load_trace(setup, disk_gbps=disk_gbps)
    if phase == "prefill":
        return prefill_trace(setup, n_tokens, context or 0)
    args["model"] = setup.spec  # the curve's other KV types are placed on the same model (a file is read once)
    return decode_trace(setup, context, batch, contexts=contexts, kv_types=kv_types, configure_args=args)

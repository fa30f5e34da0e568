"""``roofline(machine, model=None, ...) -> RooflineReport``: where decode and prefill sit.

Every device's roofs (peak FP16 compute, memory bandwidth) and ridge point; the weight matmuls of
decode at each batch and of a prefill micro-batch; attention with its KV reads at each context
(the case study's arithmetic intensity per context length, with prefill and decode each placed
by its own traffic); and, for a model, the whole decode step and prompt, the decode throughput at
each batch (``decode_step_time`` on the placement ``configure`` resolves) and the batch where it
stops growing. A batch x context that does not fit in the allocated cache is refused with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError
from ..hardware.resolve import resolve_machine
from ..perf.roofline import (Roof, RooflinePoint, decode_attention_point, model_decode_point, model_prefill_point,
                             prefill_attention_point, roof, saturation_batch, weight_matmul_point)
from ..perf.speed import check_kv_room, decode_step_time, ridge_batch
from ..quant.plan import effective_bpw
from .report import Report
from .setup import configure

DEFAULT_BATCHES = (1, 8, 32, 128)
DEFAULT_CONTEXTS = (512, 2048, 4096, 8000)  # the KV-cache case study's sample lengths
DEFAULT_BPW = 4.5  # Q4_K: the lesson's ridge example ("an RTX 4090 at 4.5 bpw: about 46 tokens")
DEFAULT_DECODE_CONTEXT = 2048


@dataclass(frozen=True)
class ThroughputPoint:
    """Decode throughput of ``batch`` sequences at ``context_tokens`` each (the speed model)."""

    batch: int
    context_tokens: int
    tok_per_s: float  # all sequences together
    per_sequence_tok_per_s: float
    step_s: float
    bound: str


@dataclass(frozen=True)
class RefusedPoint:
    batch: int
    context_tokens: int
    reason: str


@dataclass(frozen=True)
class RooflineReport(Report):
    machine: str
    machine_id: str | None
    device: str  # the device the points are placed on (the GPU that holds the most blocks, else the CPU)
    roofs: tuple[Roof, ...]  # every device of the machine
    ridge_flop_per_byte: float  # of `device`
    bits_per_weight: float
    ridge_batch: float  # batch where a weight matmul at bits_per_weight turns compute-bound on `device`
    model: str | None
    quant: str | None
    kv_type: str
    n_ctx: int | None  # the allocated cache (model given)
    speed_model: str | None
    decode_context_tokens: int
    points: tuple[RooflinePoint, ...]
    throughput: tuple[ThroughputPoint, ...]  # model given: decode tok/s at each batch
    refused: tuple[RefusedPoint, ...]  # batches whose cache does not fit in the allocated -c
    saturation_batch: int | None  # where doubling the batch adds less than 5 % tok/s
    saturation_note: str
    notes: tuple[str, ...]


def _check_list(name: str, xs, lo: int) -> tuple[int, ...]:
    xs = tuple(xs)
    if not xs:
        raise InvalidValueError(f"{name} must list at least one value")
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, int) or x < lo:
            raise InvalidValueError(f"{name} must be integers >= {lo}, got {x!r}")
    return xs


def roofline(machine: Any, model: Any = None, *, quant: Any = None, kv_type: str = "f16", batches=DEFAULT_BATCHES,
             contexts=DEFAULT_CONTEXTS, context: int = DEFAULT_DECODE_CONTEXT, n_ctx: int | None = None,
             n_gpu_layers: int | None = None, n_prompt: int | None = None, speed: str = "calibrated", order: str = "llama.cpp",
             flash_attn: str = "auto", bare: str = "preset", profile: bool = True) -> RooflineReport:
    """The roofline of ``machine``, with ``model``'s decode and prefill on it when given.

    ``batches``: decode batch sizes; ``contexts``: context lengths for the attention and prefill
    points; ``context``: cached tokens per sequence for the batched decode points; ``n_prompt``:
    the prompt whose micro-batch the prefill weight point shows (default the largest context).
    Without a model, the weight matmuls use ``quant`` as a GGML type's bits per weight (default 4.5, Q4_K)."""
    batches = _check_list("batches", batches, 1)
    contexts = _check_list("contexts", contexts, 1)
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise InvalidValueError(f"context must be an integer >= 0 tokens, got {context!r}")
    notes: list[str] = []
    setup = None
    if model is not None:
        setup = configure(model, machine, quant=quant, n_ctx=n_ctx, kv_type=kv_type, n_gpu_layers=n_gpu_layers, speed=speed,
                          order=order, flash_attn=flash_attn, bare=bare, profile=profile)
        m = setup.machine
        bpw = effective_bpw(setup.spec, setup.scheme)
        notes += list(setup.placement.notes)
    else:
        m = resolve_machine(machine, lesson_figures=speed == "lesson", profile=profile)
        bpw = _bpw_of(quant)
    roofs = tuple([*(roof(g, "gpu") for g in m.gpus), roof(m.ram, "cpu")])
    dev_idx = 0
    if setup is not None and m.gpus:
        blocks = [d.n_blocks + d.has_output for d in setup.placement.gpus]
        dev_idx = max(range(len(blocks)), key=lambda i: blocks[i]) if any(blocks) else len(m.gpus)
    r = roofs[dev_idx]
    dev = (m.gpus[dev_idx] if dev_idx < len(m.gpus) else m.ram)
    pts: list[RooflinePoint] = [weight_matmul_point(r, b, bpw) for b in batches]
    prompt = n_prompt or max(contexts)
    ub = min(prompt, setup.speed.n_ubatch if setup is not None else 512)
    pts.append(weight_matmul_point(r, ub, bpw, phase="prefill"))
    throughput, refused, sat, sat_note = (), (), None, ""
    if setup is not None:
        spec, p = setup.spec, setup.placement
        pts += [decode_attention_point(r, spec, c, kv_type) for c in contexts]
        pts += [prefill_attention_point(r, spec, c, kv_type) for c in contexts]
        pts += [model_decode_point(r, p, c) for c in contexts]
        pts += [model_decode_point(r, p, context, b) for b in batches if b > 1]
        pts += [model_prefill_point(r, p, c, setup.speed.n_ubatch) for c in contexts]
        throughput, refused = _throughput(setup, batches, context)
        if not p.fits:
            notes.append(f"this configuration does not fit ({p.reason}): no throughput, it would not run")
        else:
            sat = saturation_batch(p, m, context, setup.speed)
            sat_note = _saturation_note(setup, context, sat)
    return RooflineReport(
        machine=m.name, machine_id=machine if isinstance(machine, str) else None, device=r.device, roofs=roofs,
        ridge_flop_per_byte=r.ridge_flop_per_byte, bits_per_weight=bpw, ridge_batch=ridge_batch(dev, bpw),
        model=setup.spec.name if setup else None, quant=(setup.scheme.label if setup and setup.scheme else (setup and "file") or None),
        kv_type=kv_type, n_ctx=setup.placement.n_ctx if setup else None, speed_model=setup.speed.name if setup else None,
        decode_context_tokens=context, points=tuple(pts), throughput=throughput, refused=refused, saturation_batch=sat,
        saturation_note=sat_note, notes=tuple(notes))


def _bpw_of(quant) -> float:
    if quant is None:
        return DEFAULT_BPW
    from ..quant.presets import preset_aliases, presets
    from ..quant.types import ggml_type, ggml_types

    name = str(quant.split(":", 1)[1] if isinstance(quant, str) and quant.startswith("type:") else quant).upper()
    if name not in ggml_types() and name in {k.upper() for k in (*presets(), *preset_aliases())}:
        raise InvalidValueError(f"{quant!r} is a llama-quantize preset, a mix whose bits per weight depend on the model: "
                                f"pass --model, or a GGML type such as {name.split('_')[0] + '_K' if '_K' in name else 'Q4_K'}")
    return ggml_type(name).bits_per_weight


def _throughput(setup, batches, context) -> tuple[tuple[ThroughputPoint, ...], tuple[RefusedPoint, ...]]:
    p = setup.placement
    if not p.fits:
        return (), ()
    out, refused = [], []
    for b in batches:
        try:
            check_kv_room(p, context, b)
        except InvalidValueError as exc:
            refused.append(RefusedPoint(b, context, str(exc)))
            continue
        d = decode_step_time(p, setup.machine, context, b, setup.speed)
        out.append(ThroughputPoint(b, context, d["tok_per_s"], d["tok_per_s"] / b, d["total_s"], d["bound"]))
    return tuple(out), tuple(refused)


def _saturation_note(setup, context: int, sat: int | None) -> str:
    p = setup.placement
    if sat is None:
        return (f"decode throughput still grows at a batch of 65,536 at {context} tokens: the cached K/V, read per "
                "sequence, dominates each step")
    d = decode_step_time(p, setup.machine, context, sat, setup.speed)
    cells = sat * context
    room = (f"; the allocated cache (-c {p.n_ctx:,}) holds it" if cells <= p.n_ctx else
            f"; {sat} x {context:,} = {cells:,} tokens would need -c {cells:,} (allocated: {p.n_ctx:,})")
    why = {"compute": "past the ridge point, the matmuls are compute-bound",
           "memory": "the K/V reads, which grow with the batch, dominate the step",
           "cpu-kernels": "the CPU cores' dequantize-and-dot rate bounds it"}.get(d["bound"], d["bound"])
    return f"throughput stops growing near batch {sat} at {context} tokens ({d['tok_per_s']:.0f} tok/s): {why}{room}"

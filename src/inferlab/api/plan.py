"""``plan(source, quant) -> PlanReport``: the GGUF llama-quantize would write, before it exists.

Every tensor with its GGML type and bytes (from quant.plan, the one source of bytes), totals,
bits per weight and bytes by type, for one quantization, a list, or every preset ("all").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..errors import InferlabError, InvalidValueError
from ..models.resolve import resolve_model
from ..models.spec import ModelSpec
from .report import Report
from .setup import DEFAULT_PRESET, read_quant


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]
    type: str  # GGML type name
    n_bytes: int
    n_elements: int
    layer: int | None  # block index, None for global tensors


@dataclass(frozen=True)
class QuantPlan:
    quant: str  # the quantization asked for ("Q4_K_M", "type:Q4_K", or "file (...)")
    label: str
    total_bytes: int
    bits_per_weight: float
    n_params: int
    breakdown_bytes: dict[str, int]  # token_embd, output, layers... as quant.plan.weight_bytes splits them
    bytes_by_type: dict[str, int]  # largest first
    needs_imatrix: bool  # llama-quantize refuses to make this file without --imatrix
    tensors: tuple[PlannedTensor, ...]


@dataclass(frozen=True)
class FailedPlan:
    quant: str
    error: str


@dataclass(frozen=True)
class PlanReport(Report):
    model: str
    arch: str
    source: str
    file_type: str | None
    file_total_bytes: int | None  # the source file's own tensor bytes (a GGUF source)
    plans: tuple[QuantPlan, ...]
    failed: tuple[FailedPlan, ...] = ()


def quant_plan(spec: ModelSpec, q) -> QuantPlan:
    from ..quant.plan import effective_bpw, tensor_plan, weight_bytes
    from ..quant.presets import Preset
    from ..quant.rules import requires_imatrix

    entries = tensor_plan(spec, q)
    types: dict[str, int] = defaultdict(int)
    for e in entries:
        types[e.ggml_type] += e.n_bytes
    wb = weight_bytes(spec, q)
    needs_imatrix = isinstance(q, Preset) and requires_imatrix(entries, [e.ggml_type for e in entries], q.name)
    return QuantPlan(
        quant=str(q) if q is not None else f"file ({spec.file_type or 'mixed'})",
        label=q.label if q is not None else "the file's own tensors",
        total_bytes=wb["total"], bits_per_weight=round(effective_bpw(spec, q), 4), n_params=sum(e.n_elements for e in entries),
        breakdown_bytes=dict(wb), bytes_by_type=dict(sorted(types.items(), key=lambda kv: -kv[1])), needs_imatrix=needs_imatrix,
        tensors=tuple(PlannedTensor(e.name, tuple(e.shape), e.ggml_type, e.n_bytes, e.n_elements, e.layer) for e in entries))


def plan(source: ModelSpec | str, quant: Any = None) -> PlanReport:
    """The file llama-quantize would write from ``source`` at ``quant``: None (a GGUF's own
    tensors, else Q4_K_M), a preset or type name (a bare name is the preset, as files are
    named), a comma list, a list, or "all" (every preset, largest file first). With several
    quantizations one that cannot be made (e.g. needs what the model lacks) is listed in
    ``failed``; with one, its error is raised."""
    spec = resolve_model(source)
    everything = isinstance(quant, str) and quant.strip().lower() == "all"
    if quant is None:
        quants = [None] if spec.tensors is not None else [read_quant(DEFAULT_PRESET, spec)]
    elif everything:
        from ..quant.presets import presets

        quants = [read_quant(p.name, spec) for p in sorted(presets().values(), key=lambda p: p.ftype_id)]
    else:
        names = [x.strip() for x in quant.split(",")] if isinstance(quant, str) else \
            list(quant) if isinstance(quant, (list, tuple)) else [quant]  # one preset object, or read_quant's typed error
        quants = [read_quant(x.strip() if isinstance(x, str) else x, spec) for x in names if x != ""]
        if not quants:
            raise InvalidValueError(f"quant {quant!r} names no preset; e.g. Q4_K_M, 'Q4_K_M,Q8_0' or all")
    plans, failed = [], []
    for q in quants:
        try:
            plans.append(quant_plan(spec, q))
        except InferlabError as exc:
            if len(quants) == 1:
                raise
            failed.append(FailedPlan(str(q), str(exc)))
    if everything:
        plans.sort(key=lambda s: -s.total_bytes)  # a ladder, largest first
    own = None
    if spec.tensors is not None:
        own = plans[0] if quants == [None] else quant_plan(spec, None)
    return PlanReport(model=spec.name, arch=spec.arch, source=spec.source, file_type=spec.file_type,
                      file_total_bytes=own.total_bytes if own else None, plans=tuple(plans), failed=tuple(failed))

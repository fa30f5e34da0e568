"""The per-tensor plan: every tensor of a model with its GGML type and bytes, and the sums of it.

``tensor_plan(model, quant)`` is the one place bytes come from: weight_bytes, effective_bpw and
layer_bytes (what placement splits across devices) are sums over it. A model from the catalog or a
config has no file, so its tensors follow from the architecture (models.inventory) and their types
from llama-quantize's rules (quant.rules). A model read from a GGUF file carries the file's own
tensor table: ``quant=None`` returns that, naming a quant asks what the same model would be at it.

Plans are cached per (model, quant): ModelSpec, Preset and PureType are frozen and hashable.
A plan is first a type and a byte count per tensor (``_sizes``), from which layer_bytes (what
placement sweeps over) is summed; the PlanEntry records are made only when tensor_plan is asked.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from ..errors import InvalidValueError
from ..models.inventory import block_roles, global_tensors, tensor_inventory
from ..models.spec import ModelSpec
from .presets import Preset, PureType, resolve_quant
from .rules import Prepared, assign_types, layer_of, prepare_blocks, requires_imatrix
from .types import ggml_types

# Preset, PureType and resolve_quant are re-exported: callers name quants through this module
__all__ = ["LayerBytes", "PlanEntry", "Preset", "PureType", "effective_bpw", "layer_bytes", "plan_imatrix", "plan_memo",
           "resolve_quant", "tensor_plan", "weight_bytes"]


class PlanEntry(NamedTuple):
    """One tensor of the planned (or read) file (an immutable record: a sweep makes many thousands)."""

    name: str  # GGUF tensor name, e.g. "blk.3.attn_v.weight"
    shape: tuple[int, ...]  # GGUF ne[], row length first
    n_elements: int
    ggml_type: str  # type name, e.g. "Q6_K"
    n_bytes: int
    layer: int | None  # block index, None for token_embd, output, output_norm...
    is_expert: bool  # a stacked routed-expert tensor (only n_experts_used of n_experts read per token)


@dataclass(frozen=True)
class LayerBytes:
    """Bytes per block and of the global tensors, what placement moves between devices."""

    layers: tuple[int, ...]  # bytes of block i (all its tensors)
    layer_experts: tuple[int, ...]  # of which routed-expert tensors (what --n-cpu-moe keeps in RAM)
    token_embd: int  # stays in host memory in llama.cpp
    output: int  # output.weight (0 with tied embeddings)
    output_head: int  # bytes the output head reads: output.weight, or token_embd when tied
    other: int  # output_norm, rope_freqs, rope factors...

    @property
    def total(self) -> int:
        return sum(self.layers) + self.token_embd + self.output + self.other


def tensor_plan(model: ModelSpec, quant: str | Preset | PureType | None = None) -> tuple[PlanEntry, ...]:
    """Every tensor with its type and bytes.

    quant: a llama-quantize preset ("Q4_K_M", Preset(...)), a GGML type ("Q2_K" means every weight
    in Q2_K, PureType(...)), or None for a model read from a file (its own tensors).
    """
    _check_model(model)
    if quant is None:
        if model.tensors is None:
            raise InvalidValueError(
                f"{model.name!r} has no tensor table (it was not read from a file): name a quant, "
                "a llama-quantize preset such as 'Q4_K_M' or a GGML type such as 'Q8_0'"
            )
        return _file_plan(model)
    return _plan(model, resolve_quant(quant))


def weight_bytes(model: ModelSpec, quant: str | Preset | PureType | None = None) -> dict[str, int]:
    """Bytes of tensor data by part. "token_embd" + "output" + "layers" + "other" = "total";
    "experts" (routed-expert tensors) and "norms" (every *_norm tensor) are parts of those."""
    return dict(_summary(model, quant, "breakdown"))


def effective_bpw(model: ModelSpec, quant: str | Preset | PureType | None = None) -> float:
    """Bits per weight over the whole file: 8 * tensor bytes / weights."""
    return _summary(model, quant, "bpw")


def layer_bytes(model: ModelSpec, quant: str | Preset | PureType | None = None) -> LayerBytes:
    """Bytes of each block and of the global tensors (for placement)."""
    return _summary(model, quant, "layers")


# --- cached work --------------------------------------------------------------------------------

class _Skeleton(NamedTuple):
    """A model's tensors as the rules and the byte sums need them, one entry per tensor in the
    inventory's order, built from each block kind's roles rather than from every tensor's name."""

    prep: Prepared  # categories, quantizability, visiting order, block index, shape
    ncols: tuple[int, ...]  # row length (ne[0])
    rows: tuple[int, ...]  # rows: weights / row length
    starts: tuple[int, ...]  # index of block i's first tensor, for i = 0 … n_layers (the last: the first after the blocks)
    experts: tuple[tuple[int, ...], ...]  # per block, the indices of its routed-expert tensors
    outside: tuple[tuple[str, int], ...]  # (name, index) of the tensors outside the blocks


@lru_cache(maxsize=1024)
def _skeleton(model: ModelSpec) -> _Skeleton:
    head, tail = global_tensors(model)
    kinds: dict[int, int] = {}  # id of a block's role tuple (cached in models.inventory) -> kind
    roles, kind_of_block = [], []
    for i in range(model.n_layers):
        r = block_roles(model, i)
        if id(r) not in kinds:
            kinds[id(r)] = len(roles)
            roles.append(r)
        kind_of_block.append(kinds[id(r)])
    prep = prepare_blocks(head, roles, kind_of_block, tail)
    ncols = [s[0] for s in prep.shapes]
    rows = []
    for s in prep.shapes:
        n = 1
        for d in s[1:]:
            n *= d
        rows.append(n)  # weights / row length
    starts, experts = [len(head)], []
    kind_experts = [tuple(j for j, t in enumerate(r) if t.is_expert) for r in roles]
    for k in kind_of_block:
        experts.append(tuple(starts[-1] + j for j in kind_experts[k]))
        starts.append(starts[-1] + len(roles[k]))
    glob = [(t.name, j) for j, t in enumerate(head)] + [(t.name, starts[-1] + j) for j, t in enumerate(tail)]
    return _Skeleton(prep, tuple(ncols), tuple(rows), tuple(starts), tuple(experts), tuple(glob))


@lru_cache(maxsize=4096)
def _sizes(model: ModelSpec, quant: Preset | PureType) -> tuple[list[str], list[int]]:
    """The type and the bytes of every tensor, in the inventory's order."""
    sk = _skeleton(model)
    types = _types(model, quant, sk.prep)[0]
    table = ggml_types()
    block_size = {ty: table[ty].block_size for ty in set(types)}
    type_size = {ty: table[ty].type_size for ty in block_size}
    # bytes = whole blocks per row x bytes per block x rows (ggml_row_size * nrows)
    n_bytes = [ncols // block_size[ty] * type_size[ty] * rows for ty, ncols, rows in zip(types, sk.ncols, sk.rows)]
    return types, n_bytes


@lru_cache(maxsize=4096)
def _plan(model: ModelSpec, quant: Preset | PureType) -> tuple[PlanEntry, ...]:
    types, n_bytes = _sizes(model, quant)
    make = tuple.__new__  # PlanEntry(...) without the keyword-handling constructor
    return tuple(make(PlanEntry, (t.name, t.shape, t.n_elements, ty, b, t.layer, t.is_expert))
                 for t, ty, b in zip(tensor_inventory(model), types, n_bytes))


def plan_imatrix(model: ModelSpec, quant: str | Preset | PureType) -> bool:
    """Whether the plan of (model, quant) is of a file made with an importance matrix: the preset's
    imatrix when given, else only if llama-quantize refuses the preset on this model without one."""
    q = resolve_quant(quant)
    return isinstance(q, Preset) and _types(model, q, _skeleton(model).prep)[1]


@lru_cache(maxsize=4096)
def _types(model: ModelSpec, quant: Preset | PureType, prep: Prepared) -> tuple[list[str], bool]:
    """Every tensor's type and whether an imatrix was assumed."""
    imatrix = bool(quant.imatrix) if isinstance(quant, Preset) else False
    types = assign_types(prep, model, quant, imatrix=imatrix)
    if (isinstance(quant, Preset) and quant.imatrix is None and quant.name in _MAY_NEED_IMATRIX
            and requires_imatrix(tensor_inventory(model), types, quant.name)):
        # llama-quantize refuses this preset without an importance matrix: plan the file made with one
        return assign_types(prep, model, quant, imatrix=True), True
    return types, imatrix


# presets whose mix can contain a type llama-quantize refuses to make without an imatrix
_MAY_NEED_IMATRIX = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"})

_FILE_PLANS: OrderedDict[int, tuple[tuple, tuple[PlanEntry, ...], dict]] = OrderedDict()


def _file_plan(model: ModelSpec) -> tuple[PlanEntry, ...]:
    # keyed by the tensor table's identity (ModelSpec equality ignores tensors); the table is kept
    # alive in the cache, so its id cannot be reused while the entry exists
    tensors = model.tensors
    assert tensors is not None  # tensor_plan checked it
    key = id(tensors)
    hit = _FILE_PLANS.get(key)
    if hit is not None and hit[0] is tensors:
        return hit[1]
    plan = tuple(
        PlanEntry(t.name, tuple(t.shape), t.n_elements, t.ggml_type, t.n_bytes, layer_of(t.name), "_exps" in t.name)
        for t in tensors
    )
    _FILE_PLANS[key] = (tensors, plan, {})
    if len(_FILE_PLANS) > 64:
        _FILE_PLANS.popitem(last=False)
    return plan


_SUMMARIES = {"breakdown": lambda plan, m: _breakdown(plan), "bpw": lambda plan, m: _bpw(plan),
              "layers": lambda plan, m: _layer_bytes(plan, m.n_layers)}


def plan_memo(model: ModelSpec, quant: Preset | PureType | None) -> dict:
    """A dict that lives as long as the plan of (model, quant) is cached, for sums derived from
    it (the summaries here, placement's prefix sums), keyed by their owner. A file's own plan
    (quant None) is keyed by its tensor table, which ModelSpec equality ignores."""
    if quant is None:
        tensor_plan(model, None)  # makes sure the file's entry exists
        return _FILE_PLANS[id(model.tensors)][2]
    return _quant_memo(model, quant)


@lru_cache(maxsize=4096)
def _quant_memo(model: ModelSpec, quant: Preset | PureType) -> dict:
    return {}


def _check_model(model: object) -> None:
    if not isinstance(model, ModelSpec):
        raise InvalidValueError(f"model must be a ModelSpec (e.g. inferlab.models.catalog.MODELS['llama-3.1-8b'], or "
                                f"models.resolve.resolve_model(source)), got {type(model).__name__} {model!r:.60}")


def _summary(model: ModelSpec, quant, what: str):
    _check_model(model)
    q = resolve_quant(quant) if quant is not None else None
    memo = plan_memo(model, q)
    if what not in memo:
        if what == "layers" and q is not None:
            memo[what] = _planned_layer_bytes(model, q)  # placement's sums, without a PlanEntry per tensor
        else:
            memo[what] = _SUMMARIES[what](tensor_plan(model, q), model)
    return memo[what]


def _breakdown(plan: tuple[PlanEntry, ...]) -> tuple[tuple[str, int], ...]:
    parts = {"token_embd": 0, "output": 0, "layers": 0, "other": 0, "experts": 0, "norms": 0}
    for e in plan:
        if e.layer is not None:
            parts["layers"] += e.n_bytes
        elif e.name == "token_embd.weight":
            parts["token_embd"] += e.n_bytes
        elif e.name == "output.weight":
            parts["output"] += e.n_bytes
        else:
            parts["other"] += e.n_bytes
        if e.is_expert:
            parts["experts"] += e.n_bytes
        if e.name.endswith("norm.weight"):
            parts["norms"] += e.n_bytes
    parts["total"] = parts["token_embd"] + parts["output"] + parts["layers"] + parts["other"]
    return tuple(parts.items())


def _bpw(plan: tuple[PlanEntry, ...]) -> float:
    return 8 * sum(e.n_bytes for e in plan) / sum(e.n_elements for e in plan)  # bits over weights


def _layer_bytes(plan: tuple[PlanEntry, ...], n_layers: int) -> LayerBytes:
    layers, experts = [0] * n_layers, [0] * n_layers
    token_embd = output = other = 0
    for e in plan:
        if e.layer is not None and e.layer < n_layers:
            layers[e.layer] += e.n_bytes
            if e.is_expert:
                experts[e.layer] += e.n_bytes
        elif e.name == "token_embd.weight":
            token_embd += e.n_bytes
        elif e.name == "output.weight":
            output += e.n_bytes
        else:
            other += e.n_bytes  # output_norm, rope_freqs, and any block past n_layers (e.g. an MTP block)
    head = output if output else token_embd  # tied: llama.cpp reads token_embd as the output head
    return LayerBytes(tuple(layers), tuple(experts), token_embd, output, head, other)


def _planned_layer_bytes(model: ModelSpec, quant: Preset | PureType) -> LayerBytes:
    """_layer_bytes of a planned file, from the skeleton: the inventory's blocks are 0 … n_layers-1."""
    sk = _skeleton(model)
    n_bytes = _sizes(model, quant)[1]
    starts = sk.starts
    layers = tuple(sum(n_bytes[starts[i]:starts[i + 1]]) for i in range(model.n_layers))
    experts = tuple(sum([n_bytes[j] for j in ex]) for ex in sk.experts)
    token_embd = output = other = 0
    for name, j in sk.outside:
        if name == "token_embd.weight":
            token_embd += n_bytes[j]
        elif name == "output.weight":
            output += n_bytes[j]
        else:
            other += n_bytes[j]  # output_norm, rope_freqs...
    head = output if output else token_embd  # tied: llama.cpp reads token_embd as the output head
    return LayerBytes(layers, experts, token_embd, output, head, other)

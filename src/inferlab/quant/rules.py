"""llama.cpp's per-tensor type choice (``llama_tensor_get_type`` in src/llama-quant.cpp), ported.

Given a model's tensors (GGUF names and ne[] shapes), its hyperparameters and a quant (a
llama-quantize preset or one pure GGML type), this says which GGML type each tensor gets in the
file llama-quantize writes. The default follows llama.cpp master (the code read is commit
0c1e5709, the one llama-cpp-python 0.3.36 vendors, against which tests/quant checks every tensor).

The order of decisions, as in llama.cpp:
1. A tensor that may not be quantized keeps its source type: fewer than 2 dimensions (norms,
   biases, rope_freqs), a name not ending in "weight", "*_norm.weight", the MoE router
   "ffn_gate_inp.weight", and a few architecture-specific small tensors.
2. --token-embedding-type / --output-tensor-type (Preset.token_embd_type / output_type).
3. If the preset's base type is not a block-quantized type (F32, F16, BF16), every quantizable
   tensor gets it; with --pure (PureType) every quantizable tensor gets the base type.
4. Otherwise the preset's mix (``_mix``): output/tied token_embd, MXFP4_MOE, token_embd, the
   very-low-bit IQ1/IQ2 rules, attn_v (n_gqa >= 4, use_more_bits, 70B bump, 8 experts), attn_k,
   attn_q, ffn_down, attn_output, attn_qkv, ffn_gate/ffn_up.
5. The row-size fallback: when ne[0] is not a multiple of the chosen type's block, a 32-block type
   (``_fallback``), and F16 when even that does not divide it.

Version differences (``Preset.rules``; the default, None, is "master" except on a model with a
fused attn_qkv, whose published files follow "2025": Preset.rules_for):
- "master" (llama.cpp since late 2025): attn_qkv (Phi-3's fused QKV) and attn_kv_b are "attn_v-like"
  and take the attn_v rules; Q2_K/Q3_K/TQ*_0 fall back to Q4_0.
- "2025" (before): attn_qkv has its own rule (Q3_K_M/Q3_K_L/IQ3_M -> Q4_K, Q4_K_M -> Q5_K,
  Q5_K_M -> Q6_K on every layer); Q2_K/Q3_K fall back to IQ4_NL (same 18 bytes per 32 weights as
  Q4_0, so sizes agree). Published Phi-3.5-mini files made in 2024 follow this.
- "2023": "2025" plus the Q2_K rule llama.cpp removed in early 2024, ffn_gate and ffn_up in Q3_K
  (its source keeps the removed lines, commented "IK: let's remove this, else Q2_K is almost the
  same as Q3_K_S"). Only that rule is modelled; files such as llama-bench's Llama-2-7B Q2_K of 2023
  match it to 0.03%.
- Falcon's own branches are left out: inferlab has no Falcon architecture.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..errors import NotSupportedError
from ..models.spec import ModelSpec
from .presets import Preset, PureType
from .types import ggml_type

# tensor categories (llama-quant.cpp tensor_category)
TOKEN_EMBD, ATTN_Q, ATTN_V, ATTN_K, ATTN_QKV, ATTN_KV_B, ATTN_OUTPUT = "token_embd", "attn_q", "attn_v", "attn_k", "attn_qkv", "attn_kv_b", "attn_output"
FFN_UP, FFN_GATE, FFN_DOWN, OUTPUT, OTHER = "ffn_up", "ffn_gate", "ffn_down", "output", "other"

_VERY_LOW_BIT = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_OUTPUT_Q5K = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_ATTN_OUT_MOE8_Q5K = frozenset({"Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS"})
# types that cannot be made without an importance matrix (tensor_requires_imatrix)
IMATRIX_TYPES = frozenset({"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"})
# substrings of names llama.cpp never quantizes (tensor_allows_quantization), beyond norms and 1-D
_NEVER_QUANTIZED = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight", "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
    "a.rvq.codebook", "mm.a.code_embd",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
    "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
    "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
)
_NEVER_QUANTIZED_EXACT = frozenset({"position_embd.weight", "token_types.weight"})
_BLK = re.compile(r"blk\.(\d+)\.")


@lru_cache(maxsize=1 << 16)
def category(name: str) -> str:
    """llama-quant.cpp tensor_get_category: the broad role of a tensor, by substring of its name."""
    if name == "output.weight":
        return OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return TOKEN_EMBD
    for key, cat in (("attn_qkv.weight", ATTN_QKV), ("attn_kv_b.weight", ATTN_KV_B), ("attn_v.weight", ATTN_V),
                     ("attn_k.weight", ATTN_K), ("attn_q.weight", ATTN_Q), ("attn_output.weight", ATTN_OUTPUT),
                     ("ffn_up", FFN_UP), ("ffn_gate", FFN_GATE), ("ffn_down", FFN_DOWN)):
        if key in name:
            return cat
    return OTHER


def n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: trailing dimensions of size 1 do not count."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def allows_quantization(name: str, shape: Sequence[int], *, quantize_output: bool = True) -> bool:
    """llama-quant.cpp tensor_allows_quantization (for the architectures inferlab lays out)."""
    if n_dims(shape) < 2:
        return False
    if not quantize_output and name == "output.weight":
        return False
    return _name_allows_quantization(name)


@lru_cache(maxsize=1 << 16)
def _name_allows_quantization(name: str) -> bool:
    if not name.endswith("weight") or name in _NEVER_QUANTIZED_EXACT:
        return False
    return not any(s in name for s in _NEVER_QUANTIZED)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The first eighth, the last eighth and every third layer in between get more bits."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def layer_of(name: str) -> int | None:
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def is_70b_class(spec: ModelSpec) -> bool:
    """llama.cpp's LLM_TYPE_70B for the architectures we lay out (src/models/llama.cpp, qwen2.cpp)."""
    if spec.n_layers != 80:
        return False
    if spec.arch == "llama":
        return spec.n_experts != 8 and spec.n_heads != spec.n_kv_heads
    return spec.arch == "qwen2"


@lru_cache(maxsize=4096)
def fallback(target: str, ncols: int, rules: str = "master") -> str:
    """tensor_type_fallback: a type whose block divides the row length ncols (ne[0])."""
    block = ggml_type(target).block_size
    if ncols % block == 0:
        return target
    if target in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"):
        new = "IQ4_NL"
    elif target in ("Q2_K", "Q3_K"):
        new = "Q4_0" if rules == "master" else "IQ4_NL"
    elif target in ("TQ1_0", "TQ2_0"):
        new = "Q4_0"
    elif target == "Q4_K":
        new = "Q5_0"
    elif target == "Q5_K":
        new = "Q5_1"
    elif target == "Q6_K":
        new = "Q8_0"
    elif block <= 32:
        new = target  # already a 32-block type: only F16 is left
    else:
        raise NotSupportedError(f"llama.cpp defines no fallback type for {target} (row length {ncols} is not a multiple of {block})")
    return new if ncols % ggml_type(new).block_size == 0 else "F16"


@dataclass(frozen=True)
class Prepared:
    """What does not depend on the quant: categories, quantizability and llama-quantize's visiting order."""

    cats: tuple[str, ...]
    allowed: tuple[bool, ...]
    order: tuple[int, ...]  # indices sorted by (block index, name), as llama_model_loader's weights_map
    layers: tuple[int | None, ...]  # block index read from the name ("blk.N."), None for global tensors
    shapes: tuple[tuple[int, ...], ...]  # GGUF ne[]


def prepare(tensors: Sequence) -> Prepared:
    cats = tuple(category(t.name) for t in tensors)
    allowed = tuple(allows_quantization(t.name, t.shape) for t in tensors)
    order = tuple(sorted(range(len(tensors)), key=lambda i: (_sort_layer(tensors[i].name), tensors[i].name)))
    return Prepared(cats, allowed, order, tuple(layer_of(t.name) for t in tensors), tuple(t.shape for t in tensors))


def prepare_blocks(head: Sequence, roles: Sequence[Sequence], kind_of_block: Sequence[int], tail: Sequence) -> Prepared:
    """prepare() for tensors laid out as models.inventory writes them: the global tensors in head,
    then for each block i the tensors of roles[kind_of_block[i]] (objects with .role and .shape,
    named "blk.{i}." + role), then the global tensors in tail.

    The name tests (category, tensor_allows_quantization) never read the block number, so each
    role's answers come from its first block's name and hold for every block of that kind. The
    visiting order sorts by (block index, name): the global tensors (no block) by name first, then
    each block's tensors by role (their names differ only after the shared "blk.N." prefix).
    """
    first_block: dict[int, int] = {}
    for i, k in enumerate(kind_of_block):
        first_block.setdefault(k, i)
    kinds = {}
    for k, i in first_block.items():
        names = [f"blk.{i}.{t.role}" for t in roles[k]]
        kinds[k] = (tuple(category(n) for n in names), tuple(allows_quantization(n, t.shape) for n, t in zip(names, roles[k])),
                    sorted(range(len(names)), key=names.__getitem__), tuple(t.shape for t in roles[k]))
    glob = [*head, *tail]
    cats = [category(t.name) for t in head]
    allowed = [allows_quantization(t.name, t.shape) for t in head]
    shapes = [t.shape for t in head]
    layers: list[int | None] = [None] * len(head)
    block_order: list[int] = []
    for i, k in enumerate(kind_of_block):
        k_cats, k_allowed, k_order, k_shapes = kinds[k]
        start = len(cats)
        block_order.extend([start + j for j in k_order])
        cats.extend(k_cats)
        allowed.extend(k_allowed)
        shapes.extend(k_shapes)
        layers.extend([i] * len(k_cats))
    end = len(cats)
    cats.extend(category(t.name) for t in tail)
    allowed.extend(allows_quantization(t.name, t.shape) for t in tail)
    shapes.extend(t.shape for t in tail)
    layers.extend([None] * len(tail))
    positions = [*range(len(head)), *range(end, end + len(tail))]
    by_name = sorted(range(len(glob)), key=lambda j: glob[j].name)
    order = [positions[j] for j in by_name] + block_order
    return Prepared(tuple(cats), tuple(allowed), tuple(order), tuple(layers), tuple(shapes))


@dataclass(frozen=True)
class _Model:
    """What the rules read from the model, computed once per plan (llama-quantize's qs state)."""

    n_layer: int
    n_expert: int  # hparams.n_expert (0 for dense models)
    n_gqa: int
    is_70b: bool
    n_attention_wv: int  # attn_v-like tensors in the file
    tied: bool  # no output.weight: token_embd doubles as the output head


def plan_types(tensors: Sequence, spec: ModelSpec, quant: Preset | PureType, *, imatrix: bool = False,
               source_type: str = "F32", prepared: Prepared | None = None) -> list[str]:
    """The GGML type of each tensor (objects with .name and .shape), in the order given.

    llama-quantize visits tensors sorted by (block index, name) and some rules count the tensors
    already seen (Q3_K_M's "first two attn_v", dense ffn_down layers); this does the same.
    source_type: the type of tensors that are not quantized (converters write those in F32).
    prepared: prepare(tensors), when the caller keeps it.
    """
    return assign_types(prepared or prepare(tensors), spec, quant, imatrix=imatrix, source_type=source_type)


def assign_types(prep: Prepared, spec: ModelSpec, quant: Preset | PureType, *, imatrix: bool = False,
                 source_type: str = "F32") -> list[str]:
    """plan_types on prepared tensors (prepare or prepare_blocks): a type per tensor, in their order."""
    base = quant.base_type
    allowed = prep.allowed
    shapes = prep.shapes
    if not isinstance(quant, Preset) or (ggml_type(base).block_size == 1 and not (quant.output_type or quant.token_embd_type)):
        # --pure, or a float file type (F32/F16/BF16): no mix, only the row-size fallback
        if ggml_type(base).block_size == 1:
            return [base if a else source_type for a in allowed]
        return [fallback(base, shape[0]) if a else source_type for shape, a in zip(shapes, allowed)]
    cats = prep.cats
    rules = quant.rules_for(ATTN_QKV in cats or ATTN_KV_B in cats)
    v_like = (ATTN_V, ATTN_QKV, ATTN_KV_B) if rules == "master" else (ATTN_V,)
    model = _Model(
        n_layer=spec.n_layers, n_expert=spec.n_experts, n_gqa=spec.n_heads // spec.n_kv_heads,
        is_70b=is_70b_class(spec), n_attention_wv=cats.count(ATTN_V) + cats.count(ATTN_QKV) + cats.count(ATTN_KV_B),
        tied=OUTPUT not in cats,
    )
    quantized_base = ggml_type(base).block_size > 1
    token_embd_type, output_type, layers = quant.token_embd_type, quant.output_type, prep.layers
    seen = {ATTN_V: 0, FFN_DOWN: 0, FFN_GATE: 0, FFN_UP: 0}  # running counters (qs.i_*)
    out: list[str] = [source_type] * len(cats)
    for i in prep.order:
        if not allowed[i]:
            continue
        cat = cats[i]
        if token_embd_type and cat == TOKEN_EMBD:
            out[i] = token_embd_type
            continue
        if output_type and cat == OUTPUT:
            out[i] = output_type
            continue
        if not quantized_base:
            out[i] = base
            continue
        shape = shapes[i]
        attn_v_like = cat in v_like
        key = ATTN_V if attn_v_like else cat
        index = seen.get(key, 0)
        new = _mix(quant, base, layers[i], shape, cat, attn_v_like, index, model, imatrix, rules)
        if key in seen:
            seen[key] += 1
        out[i] = fallback(new, shape[0], rules)
    return out


def requires_imatrix(tensors: Sequence, types: Sequence[str], preset_name: str) -> bool:
    """tensor_requires_imatrix over a plan: llama-quantize refuses these without --imatrix."""
    for t, ty in zip(tensors, types):
        if category(t.name) in (TOKEN_EMBD, OUTPUT) or not allows_quantization(t.name, t.shape):
            continue
        if ty in IMATRIX_TYPES or (ty == "Q2_K" and preset_name == "Q2_K_S"):
            return True
    return False


@lru_cache(maxsize=1 << 16)
def _sort_layer(name: str) -> int:
    m = _BLK.match(name)
    return int(m.group(1)) if m else -1


def _mix(quant: Preset, new: str, layer: int | None, shape: tuple[int, ...], cat: str, attn_v_like: bool, index: int,
         model: _Model, imatrix: bool, rules: str) -> str:
    """llama_tensor_get_type_impl for one tensor. new: the preset's base type; layer: the block
    index in the tensor's name ("blk.N."); index: how many tensors of this category
    llama-quantize has typed before this one."""
    ftype = quant.name
    n_expert = max(1, model.n_expert)
    n_gqa = model.n_gqa
    n_layer = model.n_layer

    def layer_info() -> int:
        # MoE models: the block index from the name; dense: the running count (equal for our models)
        # (a tensor with an ffn role lives in a block: the name has one)
        return layer if n_expert > 1 and layer is not None else index

    if cat == OUTPUT or (model.tied and cat == TOKEN_EMBD):
        if quant.output_type:  # a tied token_embd takes --output-tensor-type too
            return quant.output_type
        if ftype == "MXFP4_MOE":
            return "Q8_0"
        if shape[0] % ggml_type(new).block_size != 0:
            return "Q8_0"
        if ftype in _OUTPUT_Q5K:
            return "Q5_K"
        return new if new == "Q8_0" else "Q6_K"
    if ftype == "MXFP4_MOE":
        # routed-expert tensors (3-D) in MXFP4, everything else Q8_0
        return "MXFP4" if len(shape) > 2 and shape[2] > 1 else "Q8_0"
    if cat == TOKEN_EMBD:
        if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "Q2_K"
        if ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "IQ3_S"
        if ftype in ("TQ1_0", "TQ2_0"):
            return "Q4_K"
        return new
    if ftype in _VERY_LOW_BIT:
        if attn_v_like:
            if n_gqa >= 4 or model.n_expert >= 4:
                return "Q4_K"
            return "IQ3_S" if ftype in ("IQ2_S", "IQ2_M") else "Q2_K"
        if model.n_expert == 8 and cat == ATTN_K:
            return "Q4_K"
        if cat == FFN_DOWN:
            # the running count over ffn_down tensors, whatever the model (n_ffn_down = n_layer)
            if index < n_layer // 8:
                return "IQ3_S" if ftype in ("IQ2_S", "IQ2_M") else "Q2_K"
            return new
        if cat == ATTN_OUTPUT:
            if model.n_expert == 8:
                return "Q5_K"
            if ftype in ("IQ1_S", "IQ1_M"):
                return "IQ2_XXS"
            if ftype in ("IQ2_S", "IQ2_M"):
                return "IQ3_S"
        return new
    if attn_v_like:
        if ftype == "Q2_K":
            new = "Q4_K" if n_gqa >= 4 else "Q3_K"
        elif ftype == "Q2_K_S" and n_gqa >= 4:
            new = "Q4_K"
        elif ftype == "IQ3_XXS":
            new = "Q4_K" if n_gqa >= 4 else ("IQ3_XXS" if imatrix else "IQ3_S")
        elif ftype in ("IQ3_XS", "IQ3_S") and n_gqa >= 4:
            new = "Q4_K"
        elif ftype == "IQ3_M":
            new = "Q4_K"
        elif ftype == "Q3_K_M":
            new = "Q5_K" if index < 2 else "Q4_K"
        elif ftype == "Q3_K_L":
            new = "Q5_K"
        elif ftype in ("IQ4_NL", "IQ4_XS") and n_gqa >= 4:
            new = "Q5_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(index, model.n_attention_wv):
            new = "Q6_K"
        elif ftype == "Q4_K_S" and index < 4:
            new = "Q5_K"
        if model.is_70b and new in ("Q3_K", "Q4_K"):
            # 70B: attn_v is 8x smaller than attn_q (8 query heads per KV head), so more bits cost little
            new = "Q5_K"
        if model.n_expert == 8:
            new = "Q8_0"  # 8-expert models: "bumping this to Q8_0 trades just ~128MB"
        return new
    if cat == ATTN_K:
        if model.n_expert == 8:
            return "Q8_0"
        if ftype == "IQ3_XS":
            return "IQ3_XXS"
        if ftype == "IQ3_XXS":
            return "IQ2_S"
        return new
    if cat == ATTN_Q:
        if ftype == "IQ3_XS":
            return "IQ3_XXS"
        if ftype == "IQ3_XXS":
            return "IQ2_S"
        return new
    if cat == FFN_DOWN:
        i = layer_info()
        if ftype == "Q2_K":
            return "Q3_K"
        if ftype == "Q2_K_S":
            return "Q4_K" if i < n_layer // 8 else new
        if ftype == "IQ3_XXS" and not imatrix:
            return "Q4_K" if i < n_layer // 8 else "Q3_K"
        if ftype == "Q3_K_M":
            return "Q5_K" if i < n_layer // 16 else "Q4_K"
        if ftype == "IQ3_M" and (i < n_layer // 8 or (model.n_expert == 8 and use_more_bits(i, n_layer))):
            return "Q4_K"
        if ftype == "Q3_K_L":
            return "Q5_K"
        if ftype == "Q4_K_M":
            return "Q6_K" if use_more_bits(i, n_layer) else new
        if i < n_layer // 8 and ftype in ("IQ4_NL", "IQ4_XS") and not imatrix:
            return "Q5_K"
        if ftype == "Q5_K_M" and use_more_bits(i, n_layer):
            return "Q6_K"
        if ftype == "Q4_K_S" and i < n_layer // 8:
            return "Q5_K"
        if ftype in ("Q4_0", "Q5_0") and imatrix and i < n_layer // 8:
            # "guard against craziness in the first few ffn_down layers", only with an imatrix
            return "Q4_1" if ftype == "Q4_0" else "Q5_1"
        return new
    if cat == ATTN_OUTPUT:
        if model.n_expert == 8:
            return "Q5_K" if ftype in _ATTN_OUT_MOE8_Q5K else new
        return {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}.get(ftype, new)
    if cat == ATTN_QKV:  # reached only with the "2025" rules
        if ftype in ("Q3_K_M", "Q3_K_L", "IQ3_M"):
            return "Q4_K"
        return {"Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}.get(ftype, new)
    if cat in (FFN_GATE, FFN_UP):
        if ftype == "Q2_K" and rules == "2023":
            return "Q3_K"  # removed early 2024: "else Q2_K is almost the same as Q3_K_S"
        i = layer_info()
        if ftype == "IQ3_XS" and n_layer // 8 <= i < 7 * n_layer // 8:
            return "IQ3_XXS"
        return new
    return new

"""What a `quant` argument means: a llama-quantize preset (a per-tensor mix) or one bare GGML type.

The same name can mean two different things. llama-quantize's preset ``Q2_K`` is a mix (attn_v in
Q4_K, ffn_down and attn_output in Q3_K, output in Q6_K: 3.18 GB for Llama 3.1 8B), while the seed's
``effective_bpw(m, "Q2_K")`` means every weight in the GGML type Q2_K (2.63 bpw, 2.64 GB). So a
quant is one of two explicit objects:

- ``Preset("Q2_K")``: what ``llama-quantize model.gguf out.gguf Q2_K`` writes (rules.py).
- ``PureType("Q2_K")``: every weight matrix in that one type (``llama-quantize --pure``): norms and
  other 1-D tensors F32, the MoE router as converted, and the row-size fallback applied.

``resolve_quant`` turns a string into one of them: a name of a GGML type means PureType (the seed's
semantics), any other name a preset (or a community variant such as bartowski's ``Q4_K_L``); the
prefixes ``"preset:"`` and ``"type:"`` force one reading; ``"i1-"`` (mradermacher's name for a
file made with an importance matrix, "Model.i1-IQ4_XS.gguf") means the preset with an imatrix.
Community names that no llama-quantize run reproduces (unsloth's "UD-" dynamic quants, an
unknown ``_L``/``_XL`` suffix) are refused with the names that are known. For F16, BF16, F32, Q8_0 and Q6_K both
readings give the same plan (the preset keeps output and token_embd in the base type and applies
no mix), so the seed's rows for those names hold either way; for Q4_0, Q5_0, IQ4_XS... they differ
(the preset puts the output head in Q6_K), which ``label`` says.

Data: data/quant_presets.json (from llama.cpp's tools/quantize/quantize.cpp and llama.h).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cached_property, cache, lru_cache
from importlib import resources

from ..errors import InvalidValueError, NotSupportedError, UnknownNameError
from .types import ggml_type, ggml_types

# llama.cpp versions whose rules differ in ways that change a file's bytes (see rules.py)
RULE_VERSIONS = ("master", "2025", "2023")
# Preset(rules=None): master's rules, except on models with a fused attn_qkv (Phi-3), whose
# published files were all made before master moved attn_qkv to the attn_v rules (late 2025):
# their sizes follow the "2025" rules (bartowski's Phi-3.5-mini, b3751: Q2_K, IQ2_M, Q5_K_M within
# 0.3 %; master's rules plan them +6 %, +7 %, -2 %). rules="master" asks for today's llama-quantize.
DEFAULT_FUSED_QKV_RULES = "2025"
# presets whose every quantizable tensor gets the base type (output and token_embd included):
# for these the preset and the bare type of the same name plan the same file, except in 8-expert
# MoE models (Mixtral), whose attn_k and attn_v llama-quantize bumps to Q8_0 (Q6_K here; the
# float presets skip its type rules)
UNIFORM_PRESETS = frozenset({"F32", "F16", "BF16", "Q8_0", "Q6_K"})
# The importance-matrix assumption. An imatrix changes the rules of these presets (rules.py: IQ3_XXS's
# attn_v and ffn_down, the first n_layer/8 ffn_down of IQ4_NL/IQ4_XS in Q5_K without one, Q4_0/Q5_0's
# first n_layer/8 ffn_down in Q4_1/Q5_1 with one), so a file's bytes depend on whether one was used.
# Preset(imatrix=None), what a bare name resolves to, plans what a plain `llama-quantize in out NAME`
# writes: no imatrix, unless llama-quantize refuses the preset on that model without one (IQ1/IQ2,
# IQ3_XXS, IQ3_XS, Q2_K_S; plan.plan_imatrix says which). Most published IQ4_XS files were made WITH
# one (bartowski's all, mradermacher's i1- repos): plan those as "i1-IQ4_XS" or
# Preset("IQ4_XS", imatrix=True), 0.4-1.3 % smaller on the catalog (0.76 % at Qwen2.5-7B, 1.00 % at
# Qwen2.5-32B, 1.2-1.3 % on MoE models: the share of ffn_down in the first eighth of the layers). No rule reads the model's
# size: a ">8B" error is this assumption (tests/quant/test_iq4xs_imatrix.py checks both with llama.cpp).
# The label of these presets names the assumption.
IMATRIX_RULE_PRESETS = frozenset({"IQ3_XXS", "IQ4_NL", "IQ4_XS", "Q4_0", "Q5_0"})


@dataclass(frozen=True)
class PresetInfo:
    """One llama-quantize preset as data."""

    name: str  # e.g. "Q4_K_M"
    ftype_id: int  # enum llama_ftype, what general.file_type records
    base_type: str  # the mix's default GGML type (llama_ftype_get_default_type)
    help: str  # llama-quantize's help line (sizes in GiB of tensor data for Llama-3-8B)
    source: str


@dataclass(frozen=True)
class VariantInfo:
    """A community file name that is a preset plus llama-quantize options (e.g. bartowski's Q4_K_L)."""

    name: str
    preset: str
    output_type: str | None
    token_embd_type: str | None
    imatrix: bool
    what: str
    source: str


@cache
def _data() -> dict:
    return json.loads(resources.files("inferlab.data").joinpath("quant_presets.json").read_text())


@cache
def presets() -> dict[str, PresetInfo]:
    """Every llama-quantize preset, by name."""
    return {
        p["name"]: PresetInfo(p["name"], p["ftype_id"], p["base_type"], p["llama_quantize_help"], p["source"])
        for p in _data()["presets"]
    }


@cache
def preset_aliases() -> dict[str, str]:
    """llama-quantize's aliases (Q4_K -> Q4_K_M); used only after an explicit "preset:" prefix."""
    return {a: p["name"] for p in _data()["presets"] for a in p["llama_quantize_aliases"]}


@cache
def variants() -> dict[str, VariantInfo]:
    return {
        v["name"]: VariantInfo(v["name"], v["preset"], v["output_type"], v["token_embd_type"], v["imatrix"], v["what"], v["source"])
        for v in _data()["variants"]
    }


def preset_info(name: str) -> PresetInfo:
    table = presets()
    p = table.get(name) or table.get(name.upper())
    if p is None:
        raise UnknownNameError("llama-quantize preset", name, table)
    return p


@dataclass(frozen=True)
class Preset:
    """A llama-quantize preset: the per-tensor mix llama_tensor_get_type chooses.

    imatrix: whether an importance matrix was used (it changes a few rules: IQ3_XXS, IQ4_NL/XS and
    Q4_0/Q5_0 ffn_down; see IMATRIX_RULE_PRESETS). None means "only if the preset cannot be made
    without one" (IQ1/IQ2/IQ3_XXS, IQ3_XS, Q2_K_S), which is what llama-quantize allows: a plain
    IQ4_XS is planned without one, an "i1-IQ4_XS" (or imatrix=True) with one; ``label`` says which.
    output_type / token_embd_type: --output-tensor-type / --token-embedding-type.
    rules: "master" (llama.cpp from late 2025 on), "2025" (before attn_qkv joined the attn_v rules) or
    "2023" (also Q2_K's old ffn_gate/ffn_up in Q3_K, removed in early 2024); see quant.rules.
    None (the default): the rules the published files of the model follow, which are master's
    except for a model with a fused attn_qkv (DEFAULT_FUSED_QKV_RULES); ``rules_for`` says which.
    """

    name: str
    imatrix: bool | None = None
    output_type: str | None = None
    token_embd_type: str | None = None
    rules: str | None = None
    display_name: str | None = None  # a variant's own name (bartowski's "Q4_K_L")

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", preset_info(self.name).name)
        for f in ("output_type", "token_embd_type"):
            v = getattr(self, f)
            if v is not None:
                object.__setattr__(self, f, ggml_type(v).name)
        if self.rules is not None and self.rules not in RULE_VERSIONS:
            raise UnknownNameError("llama.cpp rule version", self.rules, RULE_VERSIONS)

    @property
    def info(self) -> PresetInfo:
        return preset_info(self.name)

    @property
    def base_type(self) -> str:
        return self.info.base_type

    @cached_property
    def label(self) -> str:  # asked for on every placement: built once
        extra = []
        if self.imatrix:
            extra.append("imatrix")
        elif self.name in IMATRIX_RULE_PRESETS:  # its bytes depend on the assumption: say which one
            extra.append("imatrix only where llama-quantize requires one" if self.imatrix is None and self.name == "IQ3_XXS"
                         else "no imatrix")
        if self.output_type:
            extra.append(f"output {self.output_type}")
        if self.token_embd_type:
            extra.append(f"token_embd {self.token_embd_type}")
        if self.rules is not None and self.rules != "master":
            extra.append(f"{self.rules} rules")
        shown = self.display_name or self.name
        kind = f"every weight {self.base_type}" if self.name in UNIFORM_PRESETS and not extra else "a mix"
        return f"{shown} (llama-quantize preset, {', '.join([kind, *extra])})"

    def rules_for(self, has_fused_qkv: bool) -> str:
        """The rule version a plan uses: the one asked for, else master's (the "2025" rules for a
        model with a fused attn_qkv, as its published files were made)."""
        if self.rules is not None:
            return self.rules
        return DEFAULT_FUSED_QKV_RULES if has_fused_qkv else "master"

    def __str__(self) -> str:
        return self.display_name or self.name


@dataclass(frozen=True)
class PureType:
    """Every weight matrix in one GGML type (llama-quantize --pure): norms and 1-D tensors stay F32,
    the MoE router stays as converted, and a row length not divisible by the block size falls back
    as llama.cpp does (Q4_K -> Q5_0, Q6_K -> Q8_0, ...)."""

    type_name: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "type_name", ggml_type(self.type_name).name)

    @property
    def name(self) -> str:
        return self.type_name

    @property
    def base_type(self) -> str:
        return self.type_name

    @cached_property
    def label(self) -> str:
        return f"{self.type_name} (every weight {self.type_name})"

    def __str__(self) -> str:
        return self.type_name


Quant = Preset | PureType


def resolve_quant(q: str | Preset | PureType) -> Preset | PureType:
    """Turn a user's quant into a Preset or a PureType.

    "Q4_K_M" -> Preset; "Q2_K", "Q3_K", "F16" (GGML type names) -> PureType; "preset:Q2_K" -> Preset;
    "type:Q4_K" -> PureType; "Q4_K_L" (a community variant) -> Preset with its options.
    """
    if isinstance(q, (Preset, PureType)):
        return q
    if not isinstance(q, str):
        raise InvalidValueError(f"quant must be a preset or GGML type name (a string), a Preset or a PureType, got {q!r}")
    return _resolve_str(q.strip())


@lru_cache(maxsize=256)
def _resolve_str(q: str) -> Preset | PureType:
    low = q.lower()
    body = q[len("preset:"):].strip() if low.startswith("preset:") else q
    if body.lower().startswith("i1-"):  # mradermacher's imatrix files: "Model.i1-IQ4_XS.gguf"
        p = _resolve_str("preset:" + body[3:])
        assert isinstance(p, Preset)  # "preset:" always gives a Preset
        if p.imatrix is False:
            raise InvalidValueError(f"{q!r}: {p.display_name or p.name} is made without an importance matrix, so it has no i1- form")
        return dataclasses.replace(p, imatrix=True, display_name=body)
    _refuse_unreproducible(q)
    if low.startswith("preset:"):
        name = q[len("preset:"):].strip()
        alias = preset_aliases().get(name.upper())
        if alias:
            return Preset(alias)
        v = _variant(name)
        return v if v is not None else Preset(name)
    if low.startswith("type:"):
        return PureType(q[len("type:"):].strip())
    types = {t.upper(): t for t in ggml_types()}
    if q.upper() in types:
        return PureType(types[q.upper()])
    if q.upper() in presets():
        return Preset(q.upper())
    v = _variant(q)
    if v is not None:
        return v
    choices = set(presets()) | set(types.values()) | set(variants())
    raise UnknownNameError("quant preset or GGML type", q, choices)


def _refuse_unreproducible(q: str) -> None:
    """Community names that are not a llama-quantize preset plus options: say so, with the known names."""
    name = q.split(":", 1)[1].strip() if q.lower().startswith(("preset:", "type:")) else q
    up = name.upper()
    if up.startswith("UD-") or up.startswith("UD_"):
        raise NotSupportedError(
            f"{q!r} is an unsloth Dynamic quant: unsloth chooses each tensor's type from its own measurements, so no "
            f"llama-quantize rule predicts it; read the file itself (inferlab gguf-plan FILE) or name the preset it "
            f"starts from ({up[3:]!r} if that is a preset)")
    if (up.endswith("_L") or up.endswith("_XL")) and up not in presets() and up not in variants():
        raise UnknownNameError("community quant variant (a preset with Q8_0 token_embd and output)", name, variants())


def _variant(name: str) -> Preset | None:
    v = variants().get(name) or variants().get(name.upper())
    if v is None:
        return None
    return Preset(v.preset, imatrix=v.imatrix, output_type=v.output_type, token_embd_type=v.token_embd_type, display_name=v.name)

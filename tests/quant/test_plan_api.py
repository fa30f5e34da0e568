"""tensor_plan / weight_bytes / effective_bpw / layer_bytes / resolve_quant: invariants and errors."""

from __future__ import annotations

import pytest

from inferlab.errors import InvalidValueError, NotSupportedError, UnknownNameError
from inferlab.models.catalog import MODELS
from inferlab.models.inventory import tensor_inventory
from inferlab.models.spec import TensorInfo
from inferlab.quant.plan import effective_bpw, layer_bytes, tensor_plan, weight_bytes
from inferlab.quant.presets import Preset, PureType, presets, resolve_quant
from inferlab.quant.types import ggml_type

ISSUE_PRESETS = """F16 BF16 Q8_0 Q6_K Q5_K_M Q5_K_S Q5_0 Q5_1 Q4_K_M Q4_K_S Q4_0 Q4_1 Q3_K_S Q3_K_M Q3_K_L Q2_K
Q2_K_S IQ4_XS IQ4_NL IQ3_M IQ3_S IQ3_XS IQ3_XXS IQ2_M IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S TQ1_0 TQ2_0 MXFP4_MOE""".split()


def test_every_issue_preset_is_data_with_a_source():
    table = presets()
    for name in ISSUE_PRESETS:
        p = table[name]
        assert ggml_type(p.base_type).name == p.base_type
        assert p.source.startswith("https://github.com/ggml-org/llama.cpp/")
    ids = [p.ftype_id for p in table.values()]
    assert len(ids) == len(set(ids))  # llama_ftype ids are unique


def test_resolve_quant_readings():
    assert resolve_quant("Q2_K") == PureType("Q2_K")
    assert resolve_quant("q3_k") == PureType("Q3_K")
    assert resolve_quant("Q4_K_M") == Preset("Q4_K_M")
    assert resolve_quant("preset:Q2_K") == Preset("Q2_K")
    assert resolve_quant("preset:Q4_K") == Preset("Q4_K_M")  # llama-quantize's alias
    assert resolve_quant("type:Q8_0") == PureType("Q8_0")
    q = resolve_quant("Q4_K_L")
    assert isinstance(q, Preset) and q.output_type == "Q8_0" and q.token_embd_type == "Q8_0" and q.imatrix
    assert "every weight Q2_K" in resolve_quant("Q2_K").label
    assert "llama-quantize preset, a mix" in resolve_quant("preset:Q2_K").label
    p = Preset("Q4_K_M")
    assert resolve_quant(p) is p


@pytest.mark.parametrize("bad", ["Q4_K_X", "q9", "", "type:Q4_K_M", "preset:Q3_K_XXL"])
def test_unknown_quant_names_suggest(bad):
    with pytest.raises(UnknownNameError) as e:
        resolve_quant(bad)
    assert "valid:" in str(e.value)


def test_non_string_quant_is_invalid():
    with pytest.raises(InvalidValueError):
        tensor_plan(MODELS["llama-3.1-8b"], 4)


def test_unknown_rule_version():
    with pytest.raises(UnknownNameError):
        Preset("Q4_K_M", rules="2019")


@pytest.mark.parametrize("model_id", ["llama-3.1-8b", "mixtral-8x7b", "gemma-3-4b", "deepseek-v2-lite", "gpt-oss-20b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("quant", ["Q4_K_M", "Q2_K", "preset:Q2_K", "IQ2_M", "preset:IQ3_XS", "Q8_0", "F16", "MXFP4_MOE"])
def test_plan_invariants(model_id, quant):
    m = MODELS[model_id]
    plan = tensor_plan(m, quant)
    inv = tensor_inventory(m)
    assert [e.name for e in plan] == [t.name for t in inv]  # every tensor, once, in inventory order
    for e in plan:
        t = ggml_type(e.ggml_type)
        assert e.shape[0] % t.block_size == 0, e  # a row is whole blocks: the fallback did its job
        assert e.n_bytes == t.type_size * e.n_elements // t.block_size
        if len(e.shape) == 1:
            assert e.ggml_type == "F32"
    wb = weight_bytes(m, quant)
    assert wb["total"] == sum(e.n_bytes for e in plan)
    assert wb["total"] == wb["token_embd"] + wb["output"] + wb["layers"] + wb["other"]
    assert wb["experts"] <= wb["layers"] and wb["norms"] <= wb["total"]
    assert effective_bpw(m, quant) == pytest.approx(8 * wb["total"] / m.total_params())
    lb = layer_bytes(m, quant)
    assert len(lb.layers) == m.n_layers and lb.total == wb["total"]
    assert sum(lb.layer_experts) == wb["experts"]
    assert lb.output_head == (lb.output or lb.token_embd)


@pytest.mark.slow
def test_every_preset_plans_every_catalog_model():
    for m in MODELS.values():
        for name in ISSUE_PRESETS:
            assert weight_bytes(m, "preset:" + name)["total"] > 0


def test_bpw_ordering_of_presets():
    m = MODELS["llama-3.1-8b"]
    order = ["IQ1_S", "IQ2_XXS", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16"]
    bpw = [effective_bpw(m, "preset:" + p) for p in order]
    assert bpw == sorted(bpw)


def test_file_spec_uses_its_own_tensors():
    m = MODELS["llama-3.2-1b"]
    plan = tensor_plan(m, "Q4_K_M")
    # a spec "read from a file": the same hyperparameters with a tensor table that differs from the rules
    tensors = tuple(TensorInfo(e.name, e.shape, "Q8_0" if e.name == "token_embd.weight" else e.ggml_type,
                               ggml_type("Q8_0").tensor_bytes(e.shape) if e.name == "token_embd.weight" else e.n_bytes)
                    for e in plan)
    from dataclasses import replace
    f = replace(m, tensors=tensors, file_type="Q4_K_M")
    own = tensor_plan(f)
    assert [(e.name, e.ggml_type, e.n_bytes) for e in own] == [(t.name, t.ggml_type, t.n_bytes) for t in tensors]
    assert all(e.layer == (int(e.name.split(".")[1]) if e.name.startswith("blk.") else None) for e in own)
    assert weight_bytes(f)["total"] == sum(t.n_bytes for t in tensors)
    assert weight_bytes(f)["total"] > weight_bytes(f, "Q4_K_M")["total"]  # naming a quant re-plans from the rules
    assert layer_bytes(f).total == weight_bytes(f)["total"]
    with pytest.raises(InvalidValueError, match="name a quant"):
        tensor_plan(m)
    with pytest.raises(InvalidValueError):
        weight_bytes(m)


def test_i1_names_are_the_preset_made_with_an_imatrix():
    """mradermacher's "Model.i1-IQ4_XS.gguf": the preset with --imatrix. For IQ4_XS on Qwen2.5-7B
    the imatrix keeps the first 28 // 8 = 3 ffn_down (ne 18944 x 3584) in IQ4_XS instead of Q5_K:
    3 x 18944 * 3584 / 256 blocks x (176 - 136) bytes = 31,825,920 bytes less."""
    m = MODELS["qwen2.5-7b"]
    q = resolve_quant("i1-IQ4_XS")
    assert q == Preset("IQ4_XS", imatrix=True, display_name="i1-IQ4_XS") and str(q) == "i1-IQ4_XS"
    assert resolve_quant("preset:i1-IQ4_XS") == q
    assert weight_bytes(m, "preset:IQ4_XS")["total"] - weight_bytes(m, q)["total"] == 3 * 18944 * 3584 // 256 * 40
    with pytest.raises(InvalidValueError):
        resolve_quant("i1-Q4_0_4_4")  # a variant defined as made without one


@pytest.mark.parametrize("name", ["Q4_0_4_4", "Q4_0_4_8", "q4_0_8_8"])
def test_arm_repacked_names_are_static_q4_0(name):
    """The removed ARM ftypes (33-35) kept Q4_0's 18-byte block: the file of a static Q4_0."""
    m = MODELS["qwen2.5-7b"]
    q = resolve_quant(name)
    assert q.name == "Q4_0" and q.imatrix is False
    assert tensor_plan(m, q) == tensor_plan(m, Preset("Q4_0", imatrix=False))


def test_unreproducible_community_names_are_refused_with_the_known_ones():
    with pytest.raises(NotSupportedError, match="unsloth Dynamic"):
        resolve_quant("UD-Q4_K_XL")
    with pytest.raises(UnknownNameError) as e:
        resolve_quant("Q4_K_XL")  # unsloth's "Q4_K_XL" without UD-, or a typo: not a bartowski variant
    msg = str(e.value)
    assert "community quant variant" in msg and "Q4_K_L" in msg and "Q3_K_XL" in msg and "Q4_0_8_8" in msg
    assert "IQ2_M" not in msg  # the listing is the variants, not the 40 first of every name
    assert resolve_quant("Q3_K_L") == Preset("Q3_K_L")  # a preset whose name ends in _L is no variant

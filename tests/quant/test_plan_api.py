"""tensor_plan / weight_bytes / effective_bpw / layer_bytes / resolve_quant: invariants and errors."""

from __future__ import annotations

import pytest

from inferlab.errors import InvalidValueError, UnknownNameError
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

"""The per-role fast path of the plan against the per-tensor definitions it replaces.

A planned model's rules read each block role once (rules.prepare_blocks), its byte sums come from
a type and a byte count per tensor (plan._sizes) and placement's prefix sums from layer_bytes;
these must equal what the per-tensor path (rules.prepare over every name, sums over PlanEntry
records, placement's loop over a file's tensor table) gives.
"""

from __future__ import annotations

import dataclasses

import pytest

from inferlab.models.catalog import MODELS
from inferlab.models.inventory import block_roles, global_tensors, tensor_inventory
from inferlab.models.spec import ModelSpec, TensorInfo
from inferlab.perf.placement import _compute_prefix
from inferlab.quant import plan as plan_mod
from inferlab.quant.plan import layer_bytes, tensor_plan
from inferlab.quant.presets import Preset, PureType
from inferlab.quant.rules import plan_types, prepare

# a dense model, a MoE with leading dense blocks, MLA (DeepSeek), fused QKV (Phi-3), tied embeddings
MODEL_IDS = ["llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v2-lite", "phi-3.5-mini", "gemma-3-1b", "gpt-oss-20b"]
QUANTS = [Preset("Q4_K_M"), Preset("Q3_K_M"), Preset("IQ2_XS"), Preset("Q4_K_M", rules="2025"), PureType("Q4_K")]


def test_models_cover_the_block_kinds():
    assert len(MODEL_IDS) >= 5
    assert any(MODELS[k].n_dense_layers for k in MODEL_IDS)  # two block kinds in one model
    assert any(MODELS[k].tied_embeddings for k in MODEL_IDS)


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_inventory_is_globals_and_block_roles(model_id):
    m = MODELS[model_id]
    head, tail = global_tensors(m)
    blocks = [(f"blk.{i}.{t.role}", t.shape, i, t.is_expert) for i in range(m.n_layers) for t in block_roles(m, i)]
    assert [tuple(t) for t in tensor_inventory(m)] == [tuple(t) for t in head] + blocks + [tuple(t) for t in tail]


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_prepare_blocks_equals_prepare_on_every_name(model_id):
    m = MODELS[model_id]
    assert plan_mod._skeleton(m).prep == prepare(tensor_inventory(m))


@pytest.mark.parametrize("model_id", MODEL_IDS)
@pytest.mark.parametrize("quant", QUANTS, ids=str)
def test_sizes_equal_plan_types(model_id, quant):
    m = MODELS[model_id]
    tensors = tensor_inventory(m)
    imatrix = quant.name == "IQ2_XS"  # llama-quantize needs one there: the plan makes the file with it
    assert plan_mod._sizes(m, quant)[0] == plan_types(tensors, m, quant, imatrix=imatrix)
    assert [e.ggml_type for e in tensor_plan(m, quant)] == plan_mod._sizes(m, quant)[0]


@pytest.mark.parametrize("model_id", MODEL_IDS)
@pytest.mark.parametrize("quant", QUANTS, ids=str)
def test_layer_bytes_equal_sums_over_entries(model_id, quant):
    m = MODELS[model_id]
    assert layer_bytes(m, quant) == plan_mod._layer_bytes(tensor_plan(m, quant), m.n_layers)


def _as_file(m: ModelSpec, quant) -> ModelSpec:
    """The same model as if read from the file the plan describes (its own tensor table)."""
    table = tuple(TensorInfo(e.name, e.shape, e.ggml_type, e.n_bytes) for e in tensor_plan(m, quant))
    return dataclasses.replace(m, tensors=table)


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_planned_prefix_equals_the_files(model_id):
    m = MODELS[model_id]
    q = Preset("Q4_K_M")
    planned, from_file = _compute_prefix(m, q), _compute_prefix(_as_file(m, q), None)
    fields = [f.name for f in dataclasses.fields(planned) if f.name != "memo"]
    assert [getattr(planned, f) for f in fields] == [getattr(from_file, f) for f in fields]
    assert planned.block[-1] > 0 and planned.active_params[-1] > 0

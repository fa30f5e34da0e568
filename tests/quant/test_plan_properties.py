"""Properties of the plan over random dense and MoE shapes (hypothesis)."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from inferlab.models.spec import ModelSpec  # noqa: E402
from inferlab.quant.plan import tensor_plan, weight_bytes  # noqa: E402
from inferlab.quant.presets import Preset, PureType, presets  # noqa: E402
from inferlab.quant.rules import fallback  # noqa: E402
from inferlab.quant.types import ggml_type  # noqa: E402


@st.composite
def specs(draw):
    n_kv = draw(st.sampled_from([1, 2, 4, 8]))
    n_heads = n_kv * draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([16, 32, 64, 80, 128]))
    d_model = draw(st.integers(4, 64)) * 16  # multiples of 16: some rows fit no 32-block at all
    moe = draw(st.booleans())
    n_experts = draw(st.sampled_from([4, 8, 16])) if moe else 0
    return ModelSpec(
        name="random", arch=draw(st.sampled_from(["llama", "qwen2", "qwen3"])) if not moe else "llama",
        n_layers=draw(st.integers(1, 40)), d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        d_ff=0 if moe else draw(st.integers(1, 96)) * 32, vocab_size=draw(st.integers(300, 5000)),
        tied_embeddings=draw(st.booleans()), n_experts=n_experts, n_experts_used=2 if moe else 0,
        d_ff_expert=draw(st.integers(1, 32)) * 32 if moe else 0,
    )


@settings(max_examples=60, deadline=None)
@given(spec=specs(), preset=st.sampled_from(sorted(presets())), imatrix=st.sampled_from([None, True, False]))
def test_plan_properties(spec, preset, imatrix):
    plan = tensor_plan(spec, Preset(preset, imatrix=imatrix))
    for e in plan:
        t = ggml_type(e.ggml_type)
        assert e.shape[0] % t.block_size == 0  # rows are whole blocks (the fallbacks end in F16 at worst)
        if len(e.shape) == 1 or "norm" in e.name or "ffn_gate_inp" in e.name:
            assert e.ggml_type == "F32"
    assert weight_bytes(spec, Preset(preset, imatrix=imatrix))["total"] == sum(e.n_bytes for e in plan)


@settings(max_examples=30, deadline=None)
@given(spec=specs(), name=st.sampled_from(["F16", "BF16", "Q8_0", "Q6_K"]))
def test_uniform_presets_equal_their_bare_type(spec, name):
    preset, bare = tensor_plan(spec, Preset(name)), tensor_plan(spec, PureType(name))
    if spec.n_experts != 8 or name in ("F16", "BF16"):  # float presets skip llama_tensor_get_type
        assert preset == bare
        return
    # llama_tensor_get_type: "for the 8-expert model, bumping this to Q8_0 trades just ~128MB", for
    # attn_v and attn_k whatever the quantized preset (then the row-size fallback, as for any type);
    # every other tensor keeps the base type
    for p, b in zip(preset, bare, strict=True):
        bumped = p.name.endswith(("attn_k.weight", "attn_v.weight"))
        assert p.ggml_type == (fallback("Q8_0", p.shape[0]) if bumped else b.ggml_type), p.name

"""The per-tensor rules on catalog models: the documented llama.cpp behaviours, one by one.

Truth here is llama.cpp's llama-quant.cpp as summarised in ../shared/reference/quantization.md;
test_real_quantizer.py checks the same port against llama.cpp itself.
"""

from __future__ import annotations

from collections import Counter

import pytest

from inferlab.errors import NotSupportedError
from inferlab.models.catalog import MODELS
from inferlab.quant.plan import tensor_plan
from inferlab.quant.presets import Preset
from inferlab.quant.rules import fallback, is_70b_class, use_more_bits


def _types(model_id: str, quant, role: str) -> list[str]:
    """Types of one role (e.g. "attn_v.weight") in block order."""
    plan = tensor_plan(MODELS[model_id], quant)
    return [e.ggml_type for e in sorted((e for e in plan if e.name.endswith("." + role)), key=lambda e: e.layer)]


def _type_of(model_id: str, quant, name: str) -> str:
    return next(e.ggml_type for e in tensor_plan(MODELS[model_id], quant) if e.name == name)


def test_use_more_bits_layers():
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert [i for i in range(28) if use_more_bits(i, 28)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    assert sum(use_more_bits(i, 48) for i in range(48)) == 24
    assert sum(use_more_bits(i, 80) for i in range(80)) == 40


def test_q4_k_m_on_llama_3_1_8b():
    v = _types("llama-3.1-8b", "Q4_K_M", "attn_v.weight")
    down = _types("llama-3.1-8b", "Q4_K_M", "ffn_down.weight")
    expected = ["Q6_K" if use_more_bits(i, 32) else "Q4_K" for i in range(32)]
    assert v == expected and down == expected
    for role in ("attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"):
        assert set(_types("llama-3.1-8b", "Q4_K_M", role)) == {"Q4_K"}, role
    assert _type_of("llama-3.1-8b", "Q4_K_M", "output.weight") == "Q6_K"
    assert _type_of("llama-3.1-8b", "Q4_K_M", "token_embd.weight") == "Q4_K"  # untied: the base type
    assert {e.ggml_type for e in tensor_plan(MODELS["llama-3.1-8b"], "Q4_K_M") if len(e.shape) == 1} == {"F32"}


def test_q2_k_depends_on_gqa():
    assert set(_types("llama-3.1-8b", "preset:Q2_K", "attn_v.weight")) == {"Q4_K"}  # n_gqa = 4
    assert set(_types("llama-2-7b", "preset:Q2_K", "attn_v.weight")) == {"Q3_K"}  # n_gqa = 1
    for m in ("llama-3.1-8b", "llama-2-7b"):
        assert set(_types(m, "preset:Q2_K", "ffn_down.weight")) == {"Q3_K"}
        assert set(_types(m, "preset:Q2_K", "attn_output.weight")) == {"Q3_K"}
        assert set(_types(m, "preset:Q2_K", "attn_q.weight")) == {"Q2_K"}


def test_q3_k_m_counts_tensors():
    v = _types("llama-3.1-8b", "Q3_K_M", "attn_v.weight")
    assert v[:2] == ["Q5_K", "Q5_K"] and set(v[2:]) == {"Q4_K"}
    down = _types("llama-3.1-8b", "Q3_K_M", "ffn_down.weight")
    assert down[:2] == ["Q5_K", "Q5_K"] and set(down[2:]) == {"Q4_K"}  # i < 32/16


def test_q4_k_s_first_four_attn_v_and_first_eighth_ffn_down():
    v = _types("llama-3.1-8b", "Q4_K_S", "attn_v.weight")
    assert v[:4] == ["Q5_K"] * 4 and set(v[4:]) == {"Q4_K"}
    down = _types("llama-3.1-8b", "Q4_K_S", "ffn_down.weight")
    assert down[:4] == ["Q5_K"] * 4 and set(down[4:]) == {"Q4_K"}


def test_70b_class_bumps_attn_v():
    assert is_70b_class(MODELS["llama-3.1-70b"]) and is_70b_class(MODELS["qwen2.5-72b"])
    assert not is_70b_class(MODELS["llama-3.1-8b"]) and not is_70b_class(MODELS["mixtral-8x22b"])
    v = _types("llama-3.1-70b", "Q4_K_M", "attn_v.weight")
    assert v == ["Q6_K" if use_more_bits(i, 80) else "Q5_K" for i in range(80)]
    assert set(_types("qwen2.5-72b", "Q3_K_S", "attn_v.weight")) == {"Q5_K"}
    assert set(_types("qwen2.5-32b", "Q3_K_S", "attn_v.weight")) == {"Q3_K"}  # 64 layers: no bump


def test_eight_experts():
    assert set(_types("mixtral-8x7b", "Q4_K_M", "attn_v.weight")) == {"Q8_0"}
    assert set(_types("mixtral-8x7b", "Q4_K_M", "attn_k.weight")) == {"Q8_0"}
    assert set(_types("mixtral-8x7b", "Q4_K_M", "attn_output.weight")) == {"Q5_K"}
    down = _types("mixtral-8x7b", "Q4_K_M", "ffn_down_exps.weight")  # layer from the name
    assert down == ["Q6_K" if use_more_bits(i, 32) else "Q4_K" for i in range(32)]
    assert set(_types("mixtral-8x7b", "Q4_K_M", "ffn_gate_inp.weight")) == {"F32"}  # the router is never quantized


def test_tied_embeddings_follow_the_output_rule():
    # Llama 3.2 1B has no output.weight: token_embd is the output head and gets Q6_K
    assert _type_of("llama-3.2-1b", "Q4_K_M", "token_embd.weight") == "Q6_K"
    assert not any(e.name == "output.weight" for e in tensor_plan(MODELS["llama-3.2-1b"], "Q4_K_M"))
    assert _type_of("llama-3.2-1b", "preset:Q8_0", "token_embd.weight") == "Q8_0"


def test_row_size_fallbacks():
    assert fallback("Q4_K", 896) == "Q5_0"
    assert fallback("Q5_K", 896) == "Q5_1"
    assert fallback("Q6_K", 896) == "Q8_0"
    assert fallback("Q2_K", 896) == "Q4_0" and fallback("Q2_K", 896, rules="2025") == "IQ4_NL"
    assert fallback("IQ4_XS", 896) == "IQ4_NL"
    assert fallback("Q4_K", 100) == "F16" and fallback("Q8_0", 100) == "F16"
    assert fallback("Q4_K", 1024) == "Q4_K"
    with pytest.raises(NotSupportedError):
        fallback("Q8_K", 100)
    # Qwen2.5-0.5B: n_embd 896 is no multiple of 256, so Q4_K_M's q/k/v/gate/up fall back to Q5_0,
    # its use_more_bits attn_v to Q8_0; ffn_down rows are 4864 = 19 x 256 and keep the mix
    plan = tensor_plan(MODELS["qwen2.5-0.5b"], "Q4_K_M")
    by_role = Counter((e.name.split(".")[-2], e.ggml_type) for e in plan if e.layer is not None and len(e.shape) == 2)
    assert by_role[("attn_q", "Q5_0")] == 24 and by_role[("ffn_up", "Q5_0")] == 24
    assert by_role[("attn_v", "Q8_0")] + by_role[("attn_v", "Q5_0")] == 24 and by_role[("attn_v", "Q8_0")] > 0
    assert {t for (r, t) in by_role if r == "ffn_down"} == {"Q4_K", "Q6_K"}
    assert _type_of("qwen2.5-0.5b", "Q4_K_M", "token_embd.weight") == "Q8_0"  # tied, 896 % 256 != 0


def test_mxfp4_moe():
    plan = tensor_plan(MODELS["gpt-oss-20b"], "MXFP4_MOE")
    for e in plan:
        if e.is_expert and e.name.endswith("weight"):
            assert e.ggml_type == "MXFP4", e.name
        elif len(e.shape) >= 2 and e.name.endswith("weight") and "ffn_gate_inp" not in e.name:
            assert e.ggml_type == "Q8_0", e.name
        else:
            assert e.ggml_type == "F32", e.name


def test_fused_qkv_master_and_2025_rules():
    """Phi-3's attn_qkv: master treats it as attn_v; releases before late 2025 had its own rule,
    which the default (rules=None) follows for a fused-QKV model, as its published files do."""
    m = "phi-3.5-mini"
    master = Preset("Q4_K_M", rules="master")
    assert _types(m, master, "attn_qkv.weight") == ["Q6_K" if use_more_bits(i, 32) else "Q4_K" for i in range(32)]
    assert set(_types(m, Preset("Q4_K_M", rules="2025"), "attn_qkv.weight")) == {"Q5_K"}
    assert set(_types(m, Preset("Q5_K_M", rules="2025"), "attn_qkv.weight")) == {"Q6_K"}
    assert tensor_plan(MODELS[m], "Q4_K_M") == tensor_plan(MODELS[m], Preset("Q4_K_M", rules="2025"))
    # very-low-bit presets: master sends attn_qkv to attn_v's IQ3_S (no GQA), the old rules keep IQ2_S
    assert set(_types(m, Preset("IQ2_M", rules="master"), "attn_qkv.weight")) == {"IQ3_S"}
    assert set(_types(m, "preset:IQ2_M", "attn_qkv.weight")) == {"IQ2_S"}
    # a model without attn_qkv plans master's file by default
    assert tensor_plan(MODELS["llama-3.1-8b"], "Q4_K_M") == tensor_plan(MODELS["llama-3.1-8b"], master)
    assert Preset("Q4_K_M").rules_for(True) == "2025" and Preset("Q4_K_M").rules_for(False) == "master"


def test_imatrix_changes_only_the_documented_rules():
    m = "qwen2.5-7b"
    static, imat = Preset("IQ4_XS"), Preset("IQ4_XS", imatrix=True)
    assert _types(m, static, "ffn_down.weight")[:3] == ["Q5_K"] * 3  # first 28/8 = 3 layers, no imatrix
    assert set(_types(m, imat, "ffn_down.weight")) == {"IQ4_XS"}
    assert _types(m, Preset("Q4_0", imatrix=True), "ffn_down.weight")[:3] == ["Q4_1"] * 3
    assert set(_types(m, Preset("Q4_0"), "ffn_down.weight")) == {"Q4_0"}
    # IQ3_XXS cannot be made without an imatrix, so Preset("IQ3_XXS") plans the file made with one;
    # on a model without GQA the imatrix decides attn_v (IQ3_XXS with, IQ3_S without)
    auto, with_, without = Preset("IQ3_XXS"), Preset("IQ3_XXS", imatrix=True), Preset("IQ3_XXS", imatrix=False)
    assert tensor_plan(MODELS["llama-2-7b"], auto) == tensor_plan(MODELS["llama-2-7b"], with_)
    assert set(_types("llama-2-7b", auto, "attn_v.weight")) == {"IQ3_XXS"}
    assert set(_types("llama-2-7b", without, "attn_v.weight")) == {"IQ3_S"}


def test_output_type_reaches_a_tied_token_embd():
    """llama.cpp applies --output-tensor-type to token_embd when the embeddings are tied."""
    q = Preset("Q4_K_M", output_type="Q8_0")
    assert _type_of("llama-3.2-1b", q, "token_embd.weight") == "Q8_0"
    assert _type_of("llama-3.1-8b", q, "token_embd.weight") == "Q4_K"  # untied: only output.weight
    assert _type_of("llama-3.1-8b", q, "output.weight") == "Q8_0"


def test_2023_q2_k_mix():
    """Before early 2024 llama.cpp's Q2_K put ffn_gate and ffn_up in Q3_K as well."""
    old = Preset("Q2_K", rules="2023")
    for role in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "attn_output.weight", "attn_v.weight"):
        assert set(_types("llama-2-7b", old, role)) == {"Q3_K"}, role
    assert set(_types("llama-2-7b", "preset:Q2_K", "ffn_gate.weight")) == {"Q2_K"}
    assert set(_types("llama-2-7b", old, "attn_q.weight")) == {"Q2_K"}


def test_phi3_published_rules_against_master_by_hand():
    """Phi-3.5-mini's attn_qkv (ne 3072 x 9216, 32 layers) is the whole gap between the published
    files' rules and master's. Q2_K: master gives it attn_v's Q3_K (no GQA), the old rules the base
    Q2_K: 32 x 3072 * 9216 / 256 blocks x (110 - 84) bytes = 92,012,544 bytes, +6.5 % of the
    1.42 GB file (the +6 % the hidden published rows showed). Q5_K_M: master Q6_K on the 16
    use_more_bits layers and Q5_K on the other 16, the old rule Q6_K on all 32:
    16 x 110,592 blocks x (210 - 176) bytes = 60,162,048 bytes fewer under master."""
    from inferlab.quant.plan import weight_bytes

    m = MODELS["phi-3.5-mini"]
    blocks = 3072 * 9216 // 256
    q2 = weight_bytes(m, Preset("Q2_K", rules="master"))["total"] - weight_bytes(m, "preset:Q2_K")["total"]
    assert q2 == 32 * blocks * (110 - 84)
    q5 = weight_bytes(m, "Q5_K_M")["total"] - weight_bytes(m, Preset("Q5_K_M", rules="master"))["total"]
    assert q5 == 16 * blocks * (210 - 176)

"""Issue 16, section 4: IQ4_XS and the importance matrix, against llama.cpp's own quantizer.

Published IQ4_XS files of models above 8B came out 0.7-1.2 % smaller than planned. No rule of
llama_tensor_get_type reads the model's size for IQ4_XS; the one rule that moves its bytes reads
has_imatrix: without an imatrix the first n_layer/8 ffn_down are Q5_K, with one they stay IQ4_XS
(and the files on the hub were made with one). Bigger models have more layers, so the rule's
trigger here is the layer count: small thin models at 48 layers (Qwen2.5-14B's, n/8 = 6) and 64
layers (Qwen2.5-32B's, n/8 = 8, qwen2 with q/k/v biases), and Phi-3's fused attn_qkv and gate+up
at 8 layers, really quantized by llama_model_quantize (llama-cpp-python's llama.cpp, master's
rules, so the plans here use rules="master") without and with a neutral importance matrix
(quant.llama_check.uniform_imatrix: every column weighted 1). Every row is a multiple of 256,
so no row-size fallback masks a rule.

Expected by hand: a Q5_K block is 176 bytes per 256 weights, an IQ4_XS block 136, so each ffn_down
weight the imatrix keeps in IQ4_XS saves 40/256 byte:
  48 layers, ffn_down 512 x 256: 6 x 131,072 / 256 x 40 = 122,880 bytes
  64 layers, ffn_down 512 x 256: 8 x 131,072 / 256 x 40 = 163,840 bytes
  Phi-3, 8 layers, ffn_down 256 x 256: 1 x 65,536 / 256 x 40 = 10,240 bytes
The plan makes the choice explicit: a bare IQ4_XS is planned without an imatrix (what a plain
llama-quantize run writes; its label says "no imatrix"), "i1-IQ4_XS" or Preset(imatrix=True) with
one. Last, every community variant on every catalog model at its real shape against llama.cpp's
dry run (the presets are in test_real_quantizer.py): within 0.3 % of its bytes (in fact exact).
"""

from __future__ import annotations

import pytest

from inferlab.models.catalog import MODELS
from inferlab.models.spec import ModelSpec
from inferlab.quant.plan import plan_imatrix, tensor_plan, weight_bytes
from inferlab.quant.presets import Preset, resolve_quant, variants

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
from inferlab.quant.llama_check import (  # noqa: E402  (needs the two packages above)
    CHECKABLE_ARCHITECTURES, dry_run_types, llama_bytes, plan_differences, quantize_cases, write_skeleton,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]

_BASE = dict(d_model=256, n_heads=8, n_kv_heads=2, head_dim=32, d_ff=512, vocab_size=256, n_ctx_train=2048)
SHAPES = {
    "llama48": ModelSpec(name="llama48", arch="llama", n_layers=48, **_BASE),
    "qwen2-64": ModelSpec(name="qwen2-64", arch="qwen2", n_layers=64, attn_bias=True, **_BASE),
    # fused attn_qkv (256 x 768) and ffn_up holding gate and up (256 x 512); ffn_down 256 x 256
    "phi3": ModelSpec(name="phi3", arch="phi3", n_layers=8, **{**_BASE, "n_kv_heads": 8, "d_ff": 256}),
}
SAVED_BY_IMATRIX = {"llama48": 122_880, "qwen2-64": 163_840, "phi3": 10_240}  # worked out in the docstring


def _q(imatrix: bool) -> Preset:
    return Preset("IQ4_XS", imatrix=imatrix, rules="master")


CASES = {(m, im): (spec, _q(im), im) for m, spec in SHAPES.items() for im in (False, True)}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return quantize_cases(CASES, tmp_path_factory.mktemp("iq4xs"), n_workers=2)


@pytest.mark.parametrize("key", list(CASES), ids=[f"{m}-{'imatrix' if i else 'static'}" for m, i in CASES])
def test_plan_is_llama_quantize_byte_for_byte(real, key):
    spec, q, _ = CASES[key]
    got = real[key]
    assert not isinstance(got, Exception), got
    assert not plan_differences(spec, q, got)  # every tensor's type and bytes
    assert sum(b for _, b in got.values()) == sum(e.n_bytes for e in tensor_plan(spec, q))


@pytest.mark.parametrize("model", list(SHAPES))
def test_the_imatrix_saves_the_first_eighth_of_ffn_down(real, model):
    static, imat = real[(model, False)], real[(model, True)]
    saved = sum(b for _, b in static.values()) - sum(b for _, b in imat.values())
    assert saved == SAVED_BY_IMATRIX[model]  # the real files' difference, against the hand count
    changed = {n for n in static if static[n][0] != imat[n][0]}
    n8 = SHAPES[model].n_layers // 8
    assert changed == {f"blk.{i}.ffn_down.weight" for i in range(n8)}
    assert {static[n][0] for n in changed} == {"Q5_K"} and {imat[n][0] for n in changed} == {"IQ4_XS"}


def test_the_assumption_is_explicit():
    m = MODELS["qwen2.5-14b"]
    bare, i1 = resolve_quant("preset:IQ4_XS"), resolve_quant("i1-IQ4_XS")
    assert not plan_imatrix(m, bare) and "no imatrix" in bare.label
    assert plan_imatrix(m, i1) and "imatrix" in i1.label and "no imatrix" not in i1.label
    # Qwen2.5-14B: 48 layers, ffn_down 13824 x 5120: 6 x 13824 x 5120 / 256 x 40 = 66,355,200 bytes
    assert weight_bytes(m, bare)["total"] - weight_bytes(m, i1)["total"] == 66_355_200


CATALOG = [m for m, spec in MODELS.items() if spec.arch in CHECKABLE_ARCHITECTURES]


@pytest.mark.parametrize("model", CATALOG)
def test_every_variant_at_catalog_shapes_within_0_3_percent(tmp_path, model):
    spec = MODELS[model]
    src = write_skeleton(spec, tmp_path / "skeleton.gguf")
    worst = 0.0
    for v in variants().values():
        q = Preset(v.preset, imatrix=v.imatrix, output_type=v.output_type, token_embd_type=v.token_embd_type, rules="master")
        types = dry_run_types(src, q, imatrix=bool(v.imatrix))
        planned = sum(e.n_bytes for e in tensor_plan(spec, q))
        worst = max(worst, abs(planned / llama_bytes(spec, types) - 1))
        assert not plan_differences(spec, q, types), v.name
    assert worst <= 0.003

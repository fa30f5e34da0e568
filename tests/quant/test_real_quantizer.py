"""tensor_plan against llama.cpp itself: llama_model_quantize (llama-cpp-python, the llama.cpp it
vendors, whose rules are master's: plans here use Preset(..., rules="master")).

Two oracles, both llama.cpp's own llama_model_quantize:

1. Dry runs (params.dry_run, as `llama-quantize --dry-run`): llama.cpp picks every tensor's type
   with the code a real run uses (llama_tensor_get_type, then the row-size fallback) and logs it,
   without quantizing. On skeleton GGUFs (header and tensor table, the data a hole in a sparse
   file) it takes milliseconds, so every preset, with and without an importance matrix, runs on
   scaled models built to reach each rule (dense MHA and GQA, 16 layers for the n/16 rule, 8 and 16
   experts, Phi-3's fused QKV and gate/up, the 70B class at 80 thin layers, the row-size fallback)
   and on every catalog model at its real shape (Llama 3.1 405B included).
2. Real quantizations of small random models whose row lengths are all multiples of 256, so no
   rule is masked by the row-size fallback: every preset, the written file's type and bytes of
   every tensor; IQ1/IQ2/IQ3_XXS/IQ3_XS/Q2_K_S made with an importance matrix (a neutral one,
   every column weighted 1) as llama.cpp requires. Two worker processes (~1.5 min on 2 cores,
   most of it building the IQ1/IQ2 grids once per process).
"""

from __future__ import annotations

import pytest

from inferlab.errors import FileFormatError
from inferlab.models.catalog import MODELS
from inferlab.models.inventory import tensor_inventory
from inferlab.models.spec import ModelSpec
from inferlab.quant.plan import plan_imatrix, tensor_plan
from inferlab.quant.presets import Preset, presets, variants
from inferlab.quant.rules import allows_quantization

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
from inferlab.quant.llama_check import (  # noqa: E402  (needs the two packages above)
    CHECKABLE_ARCHITECTURES, dry_run_types, plan_differences, quantize_cases, write_skeleton,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ALL = sorted(presets())
# presets llama.cpp refuses without an importance matrix (on a model where a tensor gets an IQ1/IQ2/
# IQ3_XXS type, or Q2_K_S's Q2_K); and those whose rules read has_imatrix
NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}
IMATRIX_RULES = {"IQ3_XXS", "IQ4_NL", "IQ4_XS", "Q4_0", "Q5_0"}

_BASE = dict(arch="llama", d_model=256, n_heads=8, n_kv_heads=2, head_dim=32, d_ff=256, vocab_size=256, n_ctx_train=2048)
SCALED = {
    # n_gqa 4 (attn_v rules that read n_gqa), 8 layers (n/8 = 1, use_more_bits: 0, 3, 6, 7); every row 256 wide
    "gqa": ModelSpec(name="gqa", n_layers=8, **_BASE),
    # 16 layers: Q3_K_M's ffn_down i < n/16, Q4_K_S's first 4 attn_v, IQ3_XS's n/8 <= i < 7n/8 gate/up
    "gqa16": ModelSpec(name="gqa16", n_layers=16, **_BASE),
    # no GQA: IQ2 attn_v in Q2_K/IQ3_S, IQ3_XXS attn_v IQ3_S/IQ3_XXS by imatrix, Q2_K attn_v Q3_K
    "mha": ModelSpec(name="mha", n_layers=8, **{**_BASE, "n_heads": 4, "n_kv_heads": 4, "head_dim": 64}),
    # 8 experts (Mixtral): attn_v/attn_k Q8_0, attn_output Q5_K, IQ2 attn_k Q4_K, IQ3_M ffn_down,
    # the layer of ffn_down_exps read from its name
    "moe8": ModelSpec(name="moe8", n_layers=8, **{**_BASE, "d_ff": 0, "n_experts": 8, "n_experts_used": 2,
                                                 "d_ff_expert": 256}),
    # 8 experts without GQA: IQ2 attn_v Q4_K through n_expert >= 4
    "moe8-mha": ModelSpec(name="moe8-mha", n_layers=8, **{**_BASE, "n_heads": 4, "n_kv_heads": 4, "head_dim": 64,
                                                         "d_ff": 0, "n_experts": 8, "n_experts_used": 2, "d_ff_expert": 256}),
    # 16 experts (qwen3moe): n_expert >= 4 but not 8
    "moe16": ModelSpec(name="moe16", n_layers=8, **{**_BASE, "arch": "qwen3moe", "d_ff": 0, "qk_norm": True,
                                                   "n_experts": 16, "n_experts_used": 2, "d_ff_expert": 256}),
    # Phi-3: fused attn_qkv (256 x 768, attn_v-like in master) and ffn_up holding gate and up (256 x 512)
    "phi3": ModelSpec(name="phi3", n_layers=8, **{**_BASE, "arch": "phi3", "n_kv_heads": 8}),
    # the 70B class (LLM_TYPE_70B: llama, 80 layers, GQA): attn_v Q3_K/Q4_K -> Q5_K, at 80 thin layers
    "llama80": ModelSpec(name="llama80", n_layers=80, **{**_BASE, "n_kv_heads": 1}),
    # qwen2 at 80 layers is 70B class whatever its heads; tied embeddings, biases
    "qwen2-80": ModelSpec(name="qwen2-80", n_layers=80, **{**_BASE, "arch": "qwen2", "n_kv_heads": 8,
                                                          "tied_embeddings": True, "attn_bias": True}),
    # rows of 288 = 9 x 32 (residual stream) and 640 = 2.5 x 256 (ffn_down): the row-size fallbacks,
    # the output head's "ne[0] % block -> Q8_0"
    "fallback": ModelSpec(name="fallback", n_layers=8, **{**_BASE, "d_model": 288, "n_heads": 9, "n_kv_heads": 9,
                                                         "d_ff": 640}),
}
NO_FALLBACK = [k for k in SCALED if k != "fallback"]


def _master(name: str, imatrix: bool | None = None, **kw) -> Preset:
    return Preset(name, imatrix=imatrix, rules="master", **kw)


@pytest.fixture(scope="module")
def skeletons(tmp_path_factory):
    d = tmp_path_factory.mktemp("skeletons")
    return {k: write_skeleton(spec, d / f"{k}.gguf") for k, spec in SCALED.items()}


# --- 1. dry runs --------------------------------------------------------------------------------

@pytest.mark.parametrize("model", list(SCALED))
def test_every_preset_dry_run_on_scaled_models(skeletons, model):
    """Every preset x {no imatrix, imatrix}: each tensor's type is llama.cpp's."""
    spec, wrong = SCALED[model], {}
    for name in ALL:
        for imatrix in (False, True):
            q = _master(name, imatrix)
            diff = plan_differences(spec, q, dry_run_types(skeletons[model], q, imatrix=imatrix))
            if diff:
                wrong[(name, imatrix)] = dict(list(diff.items())[:3])
    assert not wrong, f"{len(wrong)} of {2 * len(ALL)} plans differ (planned, llama.cpp): {dict(list(wrong.items())[:4])}"


@pytest.mark.parametrize("model", list(SCALED)[:4] + ["phi3"])
def test_community_variants_dry_run(skeletons, model):
    """bartowski's _L/_XL (Q8_0 token_embd and output) and the ARM names, as llama.cpp makes them."""
    spec = SCALED[model]
    for v in variants().values():
        q = _master(v.preset, v.imatrix, output_type=v.output_type, token_embd_type=v.token_embd_type)
        assert not plan_differences(spec, q, dry_run_types(skeletons[model], q, imatrix=v.imatrix)), v.name


CATALOG = [m for m, spec in MODELS.items() if spec.arch in CHECKABLE_ARCHITECTURES]


@pytest.mark.parametrize("model", CATALOG)
def test_catalog_models_dry_run_at_their_real_shape(tmp_path, model):
    """Every catalog model at its real shape (the skeleton's data is a hole: 405B takes a few kB):
    every preset as the plan resolves its imatrix, and with one where the rules read it."""
    spec = MODELS[model]
    src = write_skeleton(spec, tmp_path / "skeleton.gguf")
    wrong = []
    for name in ALL:
        for imatrix in {plan_imatrix(spec, _master(name)), *((True,) if name in IMATRIX_RULES else ())}:
            q = _master(name, imatrix)
            if plan_differences(spec, q, dry_run_types(src, q, imatrix=imatrix)):
                wrong.append((name, imatrix))
    assert not wrong


def test_catalog_checks_cover_every_architecture():
    assert {MODELS[m].arch for m in CATALOG} == {s.arch for s in MODELS.values()}
    assert len(CATALOG) == len(MODELS)


def test_the_scaled_models_reach_the_rules():
    """What llama_tensor_get_type's source says each shape triggers (read in llama-quant.cpp), so the
    comparisons above test the rules themselves: worked out here by hand, not from the plan code."""
    def t(model, preset, name, imatrix=None):
        return {e.name: e.ggml_type for e in tensor_plan(SCALED[model], _master(preset, imatrix))}[name]

    # IQ2/IQ1 ffn_down: the first n_ffn_down/8 = 1 in Q2_K (IQ3_S for IQ2_S/IQ2_M), the rest the base type
    assert [t("gqa", "IQ2_XXS", f"blk.{i}.ffn_down.weight") for i in (0, 1)] == ["Q2_K", "IQ2_XXS"]
    assert [t("gqa", "IQ2_M", f"blk.{i}.ffn_down.weight") for i in (0, 1)] == ["IQ3_S", "IQ2_S"]
    assert t("gqa", "IQ1_S", "blk.0.attn_output.weight") == "IQ2_XXS"  # IQ1 attn_output
    assert t("gqa", "IQ2_XS", "blk.3.attn_v.weight") == "Q4_K"  # n_gqa >= 4
    assert t("mha", "IQ2_XS", "blk.3.attn_v.weight") == "Q2_K" and t("mha", "IQ2_S", "blk.3.attn_v.weight") == "IQ3_S"
    assert t("moe8-mha", "IQ2_XS", "blk.3.attn_v.weight") == "Q4_K"  # n_expert >= 4
    assert t("moe8", "IQ2_XS", "blk.3.attn_k.weight") == "Q4_K" and t("moe8", "IQ2_XS", "blk.3.attn_output.weight") == "Q5_K"
    assert t("moe16", "IQ2_XS", "blk.3.attn_k.weight") == "IQ2_XS"  # only exactly 8 experts
    # IQ3_XXS: attn_q/k IQ2_S; without GQA attn_v IQ3_XXS with an imatrix, IQ3_S without
    assert t("gqa", "IQ3_XXS", "blk.2.attn_q.weight", True) == "IQ2_S"
    assert t("mha", "IQ3_XXS", "blk.2.attn_v.weight", True) == "IQ3_XXS" and t("mha", "IQ3_XXS", "blk.2.attn_v.weight", False) == "IQ3_S"
    # IQ3_XS: attn_q/k IQ3_XXS, gate/up IQ3_XXS for n/8 <= i < 7n/8 (16 layers: 2..13)
    assert [t("gqa16", "IQ3_XS", f"blk.{i}.ffn_up.weight") for i in (1, 2, 13, 14)] == ["IQ3_S", "IQ3_XXS", "IQ3_XXS", "IQ3_S"]
    # Q3_K_M: ffn_down Q5_K for i < 16/16 = 1, attn_v Q5_K for the first 2
    assert [t("gqa16", "Q3_K_M", f"blk.{i}.ffn_down.weight") for i in (0, 1)] == ["Q5_K", "Q4_K"]
    assert [t("gqa16", "Q3_K_M", f"blk.{i}.attn_v.weight") for i in (1, 2)] == ["Q5_K", "Q4_K"]
    # 70B class: Q3_K_M's Q4_K attn_v -> Q5_K (llama, 80 layers, GQA; qwen2 at 80 layers without GQA too)
    assert t("llama80", "Q3_K_M", "blk.40.attn_v.weight") == "Q5_K" and t("gqa16", "Q3_K_M", "blk.8.attn_v.weight") == "Q4_K"
    assert t("qwen2-80", "Q3_K_S", "blk.40.attn_v.weight") == "Q5_K"
    # Phi-3 under master: attn_qkv takes Q4_K_M's attn_v rule (Q6_K on use_more_bits layers 0, 3, 6, 7)
    assert [t("phi3", "Q4_K_M", f"blk.{i}.attn_qkv.weight") for i in (0, 1, 3)] == ["Q6_K", "Q4_K", "Q6_K"]
    assert t("phi3", "Q4_K_M", "blk.1.ffn_up.weight") == "Q4_K"  # the fused gate+up is an ffn_up
    # IQ4_XS / Q4_0 ffn_down by imatrix: Q5_K / Q4_0 without, IQ4_XS / Q4_1 with, on the first n/8
    assert [t("gqa", "IQ4_XS", "blk.0.ffn_down.weight", im) for im in (False, True)] == ["Q5_K", "IQ4_XS"]
    assert [t("gqa", "Q4_0", "blk.0.ffn_down.weight", im) for im in (False, True)] == ["Q4_0", "Q4_1"]


@pytest.mark.parametrize("model", NO_FALLBACK)
def test_no_rule_is_masked_by_the_fallback(model):
    """Every quantizable tensor's row (ne[0]) is whole 256-blocks: the fallback never changes a type."""
    for t in tensor_inventory(SCALED[model]):
        if allows_quantization(t.name, t.shape):
            assert t.shape[0] % 256 == 0, (model, t.name, t.shape)


# --- 2. real quantizations ----------------------------------------------------------------------

def _cases() -> dict:
    cases = {}
    for name in ALL:  # every preset on the GQA model; both ways where an imatrix changes a rule
        ims = [True] if name in NEEDS_IMATRIX else [False, True] if name in IMATRIX_RULES else [False]
        if name == "IQ3_XXS":
            ims = [False, True]  # without: llama.cpp refuses (checked below)
        for im in ims:
            cases[("gqa", name, im)] = (SCALED["gqa"], _master(name, im), im)
    more = {
        "mha": [("Q2_K", False), ("IQ2_S", True), ("IQ3_XXS", True), ("IQ3_S", False), ("IQ4_NL", False)],
        "moe8": [("Q4_K_M", False), ("IQ2_XS", True), ("IQ3_M", False), ("MXFP4_MOE", False)],
        "phi3": [("Q4_K_M", False), ("Q5_K_M", False), ("Q2_K", False), ("IQ2_M", True), ("Q3_K_L", False)],
        "fallback": [("Q4_K_M", False), ("Q2_K", False), ("IQ4_XS", False), ("IQ2_XXS", True)],
        # IQ4_XS at 80 layers (no llama.cpp rule of IQ4_XS reads the model's size; the 70B class
        # changes only attn_v in Q3_K/Q4_K, which IQ4_XS puts in Q5_K at n_gqa 8 anyway): ~12 s
        "llama80": [("IQ4_XS", False)],
    }
    for model, rows in more.items():
        for name, im in rows:
            cases[(model, name, im)] = (SCALED[model], _master(name, im), im)
    for v in ("Q4_K_L", "Q2_K_L"):  # bartowski's: Q8_0 token_embd and output
        info = variants()[v]
        cases[("gqa", v, True)] = (SCALED["gqa"], _master(info.preset, True, output_type="Q8_0", token_embd_type="Q8_0"), True)
    return cases


CASES = _cases()
# presets that build the same IQ grid go to the same worker (each grid is built once per process)
_WORKER_1 = {"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}


def _spread(key, q) -> int:
    return 1 if q.name in _WORKER_1 or key[0] in ("moe8", "llama80") else 0


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return quantize_cases(CASES, tmp_path_factory.mktemp("real"), n_workers=2, spread=_spread)


@pytest.mark.parametrize("key", list(CASES), ids=[f"{m}-{p}-{'imatrix' if i else 'static'}" for m, p, i in CASES])
def test_plan_matches_llama_quantize(real, key):
    spec, q, _ = CASES[key]
    got = real[key]
    if key == ("gqa", "IQ3_XXS", False):
        # the plan says this file needs an imatrix (attn_q/k IQ2_S, the rest IQ3_XXS), and llama.cpp refuses it
        assert plan_imatrix(spec, _master("IQ3_XXS")) and isinstance(got, FileFormatError)
        return
    assert not isinstance(got, Exception), got
    wrong = plan_differences(spec, q, got)
    assert not wrong, f"{len(wrong)} tensors differ (planned, llama.cpp): {dict(list(wrong.items())[:6])}"
    assert sum(b for _, b in got.values()) == sum(e.n_bytes for e in tensor_plan(spec, q))


def test_every_preset_is_really_quantized():
    """Every preset has a real quantization here, in the default run (compared, not refused)."""
    compared = {p for (m, p, i) in CASES if (m, p, i) != ("gqa", "IQ3_XXS", False) and p in presets()}
    assert compared == set(ALL)


def test_ftype_ids_match_llama_h():
    for p in presets().values():
        const = "LLAMA_FTYPE_ALL_F32" if p.name == "F32" else f"LLAMA_FTYPE_MOSTLY_{p.name}"
        assert getattr(llama_cpp, const) == p.ftype_id, p.name


def test_written_model_runs_in_llama_cpp(tmp_path):
    from inferlab.models.gguf_writer import write_gguf

    spec = ModelSpec(name="tiny GQA", arch="llama", n_layers=4, d_model=256, n_heads=8, n_kv_heads=2,
                     head_dim=32, d_ff=640, vocab_size=320, n_ctx_train=2048)
    llm = llama_cpp.Llama(model_path=str(write_gguf(spec, tmp_path / "m.gguf")), n_ctx=64, n_threads=2, verbose=False)
    try:
        tokens = llm.tokenize(b"hello world")
        assert tokens and max(tokens) < spec.vocab_size
        llm.eval(tokens)
        assert llm.n_vocab() == spec.vocab_size
        assert len(llm.scores[len(tokens) - 1]) == spec.vocab_size
    finally:
        llm.close()


def test_fused_phi3_layout_loads_in_llama_cpp(tmp_path):
    """The fused tensors as models.inventory lays them out (attn_qkv 256 x (256 + 2 x 256), ffn_up
    holding gate and up, 256 x 2 x 256, the longrope factors) pass llama.cpp's phi3 loader, which
    checks every tensor's shape, and the model evaluates."""
    spec = ModelSpec(name="phi3 loadable", arch="phi3", n_layers=4, d_model=256, n_heads=8, n_kv_heads=8, head_dim=32,
                     d_ff=256, vocab_size=320, n_ctx_train=2048, rope_factors=True)
    shapes = {t.name: t.shape for t in tensor_inventory(spec)}
    assert shapes["blk.0.attn_qkv.weight"] == (256, 768) and shapes["blk.0.ffn_up.weight"] == (256, 512)
    src = write_skeleton(spec, tmp_path / "phi3.gguf", data="random", tokenizer=True)
    llm = llama_cpp.Llama(model_path=str(src), n_ctx=64, n_threads=2, verbose=False)
    try:
        tokens = llm.tokenize(b"hello world")
        llm.eval(tokens)
        assert len(llm.scores[len(tokens) - 1]) == spec.vocab_size
    finally:
        llm.close()

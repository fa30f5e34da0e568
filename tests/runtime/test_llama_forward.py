"""The fast torch forward against a plain numpy recomputation of the llama-family math, on tiny
GGUFs written with the gguf package (llama with adjacent-pair RoPE, qwen2 with NeoX RoPE and
q/k/v biases, a Q8_0 file, an untied output head)."""

import numpy as np
import pytest
import torch

from inferlab.errors import FileFormatError, InvalidValueError, NotSupportedError
from inferlab.runtime.llama import LlamaModel

from .conftest import write_tiny_gguf


def reference_logits(w, tokens, *, n_layers, n_heads, n_kv_heads, arch, eps=1e-5, theta=10000.0, window=None):
    """Position by position, head by head, in float64: no fusion, no cache, no torch."""
    x = w["token_embd.weight"][tokens].astype(np.float64)
    T, d = x.shape
    hd = d // n_heads
    group = n_heads // n_kv_heads

    def rms(v, g):
        return v / np.sqrt((v**2).mean(-1, keepdims=True) + eps) * g

    def rope(v, pos):  # v: (hd,)
        out = v.copy()
        for i in range(hd // 2):
            ang = pos * theta ** (-2 * i / hd)
            a, b = (2 * i, 2 * i + 1) if arch == "llama" else (i, i + hd // 2)
            out[a] = v[a] * np.cos(ang) - v[b] * np.sin(ang)
            out[b] = v[a] * np.sin(ang) + v[b] * np.cos(ang)
        return out

    for l in range(n_layers):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        q, k, v = h @ w[p + "attn_q.weight"].T, h @ w[p + "attn_k.weight"].T, h @ w[p + "attn_v.weight"].T
        if p + "attn_q.bias" in w:
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        att = np.zeros((T, n_heads * hd))
        for head in range(n_heads):
            kvh = head // group
            qs = np.stack([rope(q[t, head * hd:(head + 1) * hd], t) for t in range(T)])
            ks = np.stack([rope(k[t, kvh * hd:(kvh + 1) * hd], t) for t in range(T)])
            vs = v[:, kvh * hd:(kvh + 1) * hd]
            for t in range(T):
                lo = 0 if window is None else max(0, t - window + 1)
                s = ks[lo:t + 1] @ qs[t] / np.sqrt(hd)
                pr = np.exp(s - s.max())
                pr /= pr.sum()
                att[t, head * hd:(head + 1) * hd] = pr @ vs[lo:t + 1]
        x = x + att @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    head_w = w.get("output.weight", w["token_embd.weight"])
    return rms(x, w["output_norm.weight"]) @ head_w.T


CASES = {
    "llama-f32": dict(arch="llama"),
    "llama-q8_0": dict(arch="llama", qtype="Q8_0", d_model=64, n_heads=4, n_kv_heads=1, ffn=64),
    "qwen2-bias": dict(arch="qwen2", bias=True),
    "mistral-untied": dict(arch="mistral", tied=False, n_kv_heads=4),
}


@pytest.fixture(params=sorted(CASES))
def tiny(request, tmp_path):
    kw = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn=48, vocab=64) | CASES[request.param]
    path = tmp_path / f"{request.param}.gguf"
    weights = write_tiny_gguf(path, **kw)
    return LlamaModel.from_gguf(path), weights, kw


def test_forward_matches_numpy_reference(tiny):
    model, weights, kw = tiny
    tokens = [3, 17, 5, 60, 2, 2, 41, 9, 33, 12]
    ref = reference_logits(weights, tokens, n_layers=kw["n_layers"], n_heads=kw["n_heads"], n_kv_heads=kw["n_kv_heads"],
                           arch="qwen2" if kw["arch"] == "qwen2" else "llama")
    with torch.inference_mode():
        got = model.step(torch.tensor([tokens]), None, all_logits=True)[0].double().numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cache", ["contiguous", "paged:4", "int8", "window:4"])
def test_cached_decode_matches_full_forward(tiny, cache):
    """Prefill 3 tokens then decode one at a time: each step's logits equal the recomputed
    reference at that position (window: sliding-window attention; int8: within quantization error)."""
    model, weights, kw = tiny
    tokens = [3, 17, 5, 60, 2, 2, 41, 9, 33, 12]
    window = int(cache.split(":")[1]) if cache.startswith("window") else None
    ref = reference_logits(weights, tokens, n_layers=kw["n_layers"], n_heads=kw["n_heads"], n_kv_heads=kw["n_kv_heads"],
                           arch="qwen2" if kw["arch"] == "qwen2" else "llama", window=window)
    kv = model.new_cache(cache, capacity=16)
    got = []
    with torch.inference_mode():
        got.append(model.step(torch.tensor([tokens[:3]]), kv, all_logits=True)[0])
        for t in tokens[3:]:
            got.append(model.step(torch.tensor([[t]]), kv)[0])
    got = torch.cat(got).double().numpy()
    if cache == "int8":  # the error is real, and small next to the logits' scale
        assert 1e-6 < np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_window_prefill_longer_than_window(tiny):
    model, weights, kw = tiny
    tokens = [3, 17, 5, 60, 2, 2, 41, 9, 33, 12]
    ref = reference_logits(weights, tokens, n_layers=kw["n_layers"], n_heads=kw["n_heads"], n_kv_heads=kw["n_kv_heads"],
                           arch="qwen2" if kw["arch"] == "qwen2" else "llama", window=3)
    kv = model.new_cache("window:3", capacity=16)
    with torch.inference_mode():
        first = model.step(torch.tensor([tokens[:7]]), kv, all_logits=True)[0]
        rest = model.step(torch.tensor([tokens[7:]]), kv, all_logits=True)[0]
    np.testing.assert_allclose(torch.cat([first, rest]).double().numpy(), ref, rtol=1e-4, atol=1e-4)
    assert kv.nbytes < model.new_cache("contiguous", capacity=16).nbytes


def test_config_read_from_file(tiny):
    model, _, kw = tiny
    c = model.config
    assert (c.architecture, c.n_layers, c.n_heads, c.n_kv_heads) == (kw["arch"], kw["n_layers"], kw["n_heads"], kw["n_kv_heads"])
    assert c.tied_embeddings == kw.get("tied", True)
    assert c.attention_bias == kw.get("bias", False)
    assert c.rope_style == ("neox" if kw["arch"] == "qwen2" else "norm")


def test_int8_weights_close_to_fp32(tmp_path):
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path)
    fp32, int8 = LlamaModel.from_gguf(path), LlamaModel.from_gguf(path, dtype="int8")
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        a, b = fp32.step(tokens, None, all_logits=True), int8.step(tokens, None, all_logits=True)
    assert int8.weight_bytes < 0.4 * fp32.weight_bytes
    assert 0 < (a - b).abs().max() < 0.1 * a.abs().max()


# ── bad input ─────────────────────────────────────────────────────────────────────────────────
def test_unsupported_architecture_names_the_supported(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_tiny_gguf(path, arch="gpt2")
    with pytest.raises(NotSupportedError, match=r"'gpt2'.*supported: llama, mistral, qwen2"):
        LlamaModel.from_gguf(path)


def test_unsupported_tensor_type_is_named(tmp_path):
    path = tmp_path / "i32.gguf"
    write_tiny_gguf(path, tensor_type_override=True)
    with pytest.raises(NotSupportedError, match=r"blk\.0\.attn_q\.weight.*I32.*supported: F32, F16"):
        LlamaModel.from_gguf(path)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(FileFormatError, match="junk.gguf"):
        LlamaModel.from_gguf(path)
    with pytest.raises(InvalidValueError, match="does not exist"):
        LlamaModel.from_gguf(tmp_path / "missing.gguf")


def test_context_beyond_the_model(tmp_path):
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, n_ctx=16)
    with pytest.raises(InvalidValueError, match="exceeds the model's trained context of 16"):
        LlamaModel.from_gguf(path, n_ctx=32)
    model = LlamaModel.from_gguf(path)
    with pytest.raises(InvalidValueError, match="17 tokens exceeds the model's context of 16"):
        model.step(torch.zeros((1, 17), dtype=torch.long))

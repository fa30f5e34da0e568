"""Write a random-weight GGUF for a ModelSpec.

``write_gguf`` lays a model out exactly as convert_hf_to_gguf.py would (the tensor inventory of
models.inventory, 2-D weights in ``dtype``, norms, biases and the MoE router in F32) with the
metadata llama.cpp needs to load it, quantize it and run it, and a small SentencePiece-style
("llama") tokenizer: <unk>, <s>, </s>, the 256 byte tokens and filler pieces up to vocab_size.
The weights are random (seeded), so the file says nothing about a real model's quality, only
about its layout and bytes.

Quantizing such a file with llama.cpp itself is ``quant.llama_quantize.quantize_gguf``.

Architectures written: llama (and mistral/mixtral, which are "llama" in GGUF), qwen2, qwen3,
qwen2moe, qwen3moe. Needs the packages gguf and numpy (``pip install 'inferlab[files]'``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MissingDependencyError, NotSupportedError, check_positive
from .inventory import tensor_inventory
from .spec import ModelSpec

WRITABLE_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe")
WRITABLE_DTYPES = ("F32", "F16", "BF16", "Q8_0")
# token types of llama.cpp's vocab (enum llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6
_N_SPECIAL = 3 + 256  # <unk> <s> </s> and one token per byte


def _import_gguf():
    try:
        import gguf
        import numpy as np
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(exc.name or "gguf", "writing GGUF files", extra="files") from None
    return gguf, np


def write_gguf(spec: ModelSpec, path: str | os.PathLike, dtype: str = "F16", seed: int = 0, *,
               rms_eps: float = 1e-5, rope_theta: float = 10000.0, weight_std: float = 0.02) -> Path:
    """Write ``spec`` as a GGUF file with random weights; returns the path.

    dtype: the type of the 2-D (and 3-D expert) weights, one of F32, F16, BF16, Q8_0; 1-D tensors
    (norms, biases) and the MoE router are F32, as convert_hf_to_gguf writes them.
    """
    gguf, np = _import_gguf()
    if spec.arch not in WRITABLE_ARCHITECTURES:
        raise NotSupportedError(f"writing a GGUF for architecture {spec.arch!r} is not supported; supported: {', '.join(WRITABLE_ARCHITECTURES)}")
    dtype = dtype.upper() if isinstance(dtype, str) else dtype
    if dtype not in WRITABLE_DTYPES:
        raise NotSupportedError(f"dtype {dtype!r} cannot be written; choose one of {', '.join(WRITABLE_DTYPES)}")
    if spec.vocab_size < _N_SPECIAL + 1:
        raise NotSupportedError(f"vocab_size {spec.vocab_size} is too small for the test tokenizer (needs > {_N_SPECIAL})")
    check_positive("weight_std", weight_std)
    path = Path(path)
    qtype = gguf.GGMLQuantizationType[dtype]
    rng = np.random.default_rng(seed)

    w = gguf.GGUFWriter(str(path), spec.arch)
    _write_metadata(w, spec, gguf, dtype, rms_eps, rope_theta)
    write_tokenizer(w, spec.vocab_size)
    for t in tensor_inventory(spec):
        np_shape = tuple(reversed(t.shape))  # numpy is row-major: ne[0] is the last axis
        if len(t.shape) == 1 or not t.name.endswith("weight") or "ffn_gate_inp" in t.name:
            # norms start at 1 (as trained models roughly are), biases and the router are small
            base = 1.0 if t.name.endswith("norm.weight") else 0.0
            data = (base + weight_std * rng.standard_normal(np_shape, dtype=np.float32)).astype(np.float32)
            w.add_tensor(t.name, data)
            continue
        data = (weight_std * rng.standard_normal(np_shape, dtype=np.float32)).astype(np.float32)
        if dtype == "F32":
            w.add_tensor(t.name, data)
        elif dtype == "F16":
            w.add_tensor(t.name, data.astype(np.float16))
        else:  # BF16, Q8_0: gguf-py's reference quantizers
            w.add_tensor(t.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _write_metadata(w, spec: ModelSpec, gguf, dtype: str, rms_eps: float, rope_theta: float) -> None:
    ftype = {"F32": 0, "F16": 1, "Q8_0": 7, "BF16": 32}[dtype]  # enum llama_ftype
    w.add_name(spec.name)
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(spec.n_layers)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.d_model)
    # llama-arch MoE (Mixtral) reads its expert size from feed_forward_length
    w.add_feed_forward_length(spec.d_ff_expert if spec.arch == "llama" and spec.is_moe else spec.d_ff)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_rope_freq_base(rope_theta)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim_v)
    w.add_vocab_size(spec.vocab_size)
    if spec.is_moe:
        w.add_expert_count(spec.n_experts)
        w.add_expert_used_count(spec.n_experts_used)
        if spec.arch in ("qwen2moe", "qwen3moe"):
            w.add_expert_feed_forward_length(spec.d_ff_expert)
        if spec.d_ff_shared:
            w.add_expert_shared_feed_forward_length(spec.d_ff_shared)


def write_tokenizer(w, vocab_size: int) -> None:
    """A SentencePiece-style vocab llama.cpp can load: specials, byte fallback, filler pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces: list[str] = []
    k = 0
    while len(tokens) + len(pieces) < vocab_size:  # "▁a", "▁b", ..., "a", ..., "▁aa", ...
        n, word = k, ""
        while True:
            word = letters[n % 26] + word
            n = n // 26 - 1
            if n < 0:
                break
        pieces.append(("▁" if k % 2 == 0 else "") + word)
        k += 1
    pieces = list(dict.fromkeys(pieces))
    i = 0
    while len(tokens) + len(pieces) < vocab_size:  # dedup left gaps: fill with numbered pieces
        pieces.append(f"▁t{i}")
        i += 1
    tokens += pieces[: vocab_size - len(tokens)]
    types += [_NORMAL] * (vocab_size - len(types))
    scores = [0.0] * _N_SPECIAL + [-float(i) for i in range(vocab_size - _N_SPECIAL)]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

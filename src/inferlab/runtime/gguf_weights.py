"""Read a llama-family GGUF into torch: the architecture hyperparameters and the dequantized
weights.

Quantized tensors are dequantized with the `gguf` package's quants module (the reference
implementation that ships with llama.cpp); F32 tensors are used straight from the memory map.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

from ..errors import FileFormatError, InvalidValueError, NotSupportedError

# architecture -> how llama.cpp rotates query/key pairs. convert_hf_to_gguf.py permutes the
# llama/mistral Q and K rows so that llama.cpp's "norm" rope (adjacent pairs 2i, 2i+1) applies;
# qwen2 keeps Hugging Face's layout and llama.cpp uses "neox" rope (pairs i, i + d/2).
# Source: llama.cpp src/llama-model.cpp, llama_model_rope_type().
ROPE_STYLE_BY_ARCH = {"llama": "norm", "mistral": "norm", "qwen2": "neox"}
SUPPORTED_ARCHITECTURES = tuple(ROPE_STYLE_BY_ARCH)


@dataclass(frozen=True)
class LlamaConfig:
    """Hyperparameters of a llama-family decoder, as written in a GGUF header."""

    architecture: str
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    n_ctx_train: int  # context length the model was trained for, tokens
    rope_theta: float
    rope_scale: float  # linear position scaling (1.0 = none)
    rms_eps: float
    attention_bias: bool  # qwen2 has biases on q, k, v
    tied_embeddings: bool  # no output.weight: the token embedding doubles as the LM head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def rope_style(self) -> str:
        return ROPE_STYLE_BY_ARCH[self.architecture]

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        # K and V, every layer, every KV head, head_dim elements each
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes


def supported_tensor_types() -> tuple[str, ...]:
    import gguf.quants as quants

    traits = getattr(quants, "_type_traits", {})
    return ("F32", "F16", *sorted(t.name for t in traits))


def _field(reader, key: str, default=None, *, required: bool = True):
    field = reader.fields.get(key)
    if field is None:
        if required and default is None:
            raise FileFormatError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def read_config(reader, path: str = "") -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ROPE_STYLE_BY_ARCH:
        raise NotSupportedError(
            f"{os.path.basename(path) or 'GGUF'}: architecture {arch!r} is not supported by the runtime; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    names = {t.name for t in reader.tensors}
    n_heads = int(_field(reader, f"{arch}.attention.head_count"))
    d_model = int(_field(reader, f"{arch}.embedding_length"))
    head_dim = d_model // n_heads
    rope_dim = int(_field(reader, f"{arch}.rope.dimension_count", head_dim, required=False))
    key_length = int(_field(reader, f"{arch}.attention.key_length", head_dim, required=False))
    if rope_dim != head_dim or key_length != head_dim:
        raise NotSupportedError(
            f"partial rotary ({rope_dim} of {head_dim} dims) or a head size {key_length} other than "
            f"embedding_length/head_count ({head_dim}) is not supported by the runtime"
        )
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none", required=False)
    if scaling not in ("none", "linear"):
        raise NotSupportedError(f"rope scaling {scaling!r} is not supported; supported: none, linear")
    factor = float(_field(reader, f"{arch}.rope.scaling.factor", 1.0, required=False)) if scaling == "linear" else 1.0
    tok = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, f"{arch}.vocab_size", len(tok.data) if tok else None))
    return LlamaConfig(
        architecture=arch,
        name=str(_field(reader, "general.name", "", required=False)),
        n_layers=int(_field(reader, f"{arch}.block_count")),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads, required=False)),
        ffn_dim=int(_field(reader, f"{arch}.feed_forward_length")),
        vocab_size=vocab,
        n_ctx_train=int(_field(reader, f"{arch}.context_length")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0, required=False)),
        rope_scale=factor,
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        attention_bias="blk.0.attn_q.bias" in names,
        tied_embeddings="output.weight" not in names,
    )


def open_gguf(path: str | os.PathLike):
    """A memory-mapped gguf.GGUFReader, with file errors turned into FileFormatError."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - gguf is in the runtime extra
        from ..errors import MissingDependencyError

        raise MissingDependencyError("gguf", "loading GGUF weights", "runtime") from exc
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidValueError(f"model file {path!r} does not exist")
    try:
        return GGUFReader(path, "r")
    except Exception as exc:  # the reader raises ValueError/struct errors on garbage
        raise FileFormatError(f"{path!r} is not a readable GGUF file: {exc}") from exc


def tensor_to_torch(tensor, dtype):
    """Dequantize one GGUF tensor into a torch tensor with llama.cpp's row-major (out, in) shape."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = tensor.tensor_type
    if qtype == GGMLQuantizationType.F32:
        with warnings.catch_warnings():  # a read-only memory map: torch warns, we never write it
            warnings.simplefilter("ignore")
            t = torch.from_numpy(np.asarray(tensor.data))
        return t if dtype == torch.float32 else t.to(dtype)
    if qtype.name not in supported_tensor_types():
        raise NotSupportedError(
            f"tensor {tensor.name!r} has type {qtype.name}, which the runtime cannot dequantize; "
            f"supported: {', '.join(supported_tensor_types())}"
        )
    try:
        array = dequantize(tensor.data, qtype)
    except NotImplementedError as exc:
        raise NotSupportedError(f"tensor {tensor.name!r}: gguf cannot dequantize {qtype.name}: {exc}") from exc
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).to(dtype)


def load_state(reader, config: LlamaConfig, dtype) -> dict:
    """All tensors by GGUF name, dequantized to `dtype` (norms stay fp32)."""
    import torch

    state = {}
    for t in reader.tensors:
        keep_fp32 = t.name.endswith("norm.weight") or t.name.endswith(".bias")
        state[t.name] = tensor_to_torch(t, torch.float32 if keep_fp32 else dtype)
    required = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{part}.weight"
        for i in range(config.n_layers)
        for part in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
    ]
    missing = [name for name in required if name not in state]
    if missing:
        raise FileFormatError(f"GGUF lacks tensors the {config.architecture} forward needs: {', '.join(missing[:5])}")
    return state

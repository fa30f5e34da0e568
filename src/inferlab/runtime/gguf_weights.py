"""Read a llama-family GGUF into torch: the architecture hyperparameters and the dequantized
weights.

The file is opened with inferlab's own header parser (models/gguf_reader.py: metadata, the
tokenizer's arrays kept whole, the tensor table) and one read-only memory map of it; each tensor's
data is a numpy view of that map, shaped as the gguf package's reader would shape it. Quantized
tensors are dequantized with the `gguf` package's quants module (the reference implementation that
ships with llama.cpp); F32 tensors are used straight from the memory map.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

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


# metadata arrays the runtime reads whole (the header parser keeps only short arrays otherwise)
KEPT_METADATA = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
    "tokenizer.chat_template",
)


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUFFile. ``data`` is a read-only numpy view of the file, shaped as the gguf
    package's ReaderTensor.data: F32/F16 as floats of shape reversed(shape), other types as uint8
    rows of bytes, which ``gguf.quants.dequantize(data, tensor_type)`` turns into floats."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGML order: row length first
    data: Any  # numpy.ndarray


class GGUFFile:
    """A GGUF opened for the runtime (what open_gguf returns): ``metadata`` from inferlab's header
    parser (values as it gives them; arrays as GGUFArray, the KEPT_METADATA ones whole),
    ``get(key)`` with arrays as lists, and ``tensors`` whose data views one read-only memory map of
    the file (kept open as long as any view is alive)."""

    def __init__(self, path: str, header, tensors: tuple[GGUFTensor, ...]):
        self.path, self.header, self.tensors = path, header, tensors
        self.metadata = header.metadata

    def get(self, key: str, default=None):
        """A metadata value (arrays as lists), or default when the key is absent."""
        from ..models.gguf_reader import GGUFArray

        v = self.metadata.get(key, default)
        if isinstance(v, GGUFArray):
            if v.values is None:
                raise NotSupportedError(
                    f"{self.path}: metadata {key!r} is an array of {v.count} values, which the runtime does not read "
                    f"(it keeps short arrays and {', '.join(KEPT_METADATA)})"
                )
            return list(v.values)
        return v


def _field(reader, key: str, default: Any = None, *, required: bool = True, kind: type | None = None) -> Any:
    """A metadata value, or default; ``kind``: int or float, checked (a bool or a string is not a number)."""
    v = reader.get(key)
    if v is None:
        if required and default is None:
            raise FileFormatError(f"{reader.path}: GGUF metadata lacks {key!r}")
        return default
    if kind is not None:
        number = isinstance(v, int) if kind is int else isinstance(v, (int, float))
        if isinstance(v, bool) or not number:
            raise FileFormatError(f"{reader.path}: GGUF metadata {key!r} must be one {kind.__name__}, got {v!r}"[:300])
    return v


def read_config(reader: GGUFFile, path: str = "") -> LlamaConfig:
    path = path or reader.path
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or arch not in ROPE_STYLE_BY_ARCH:
        raise NotSupportedError(
            f"{os.path.basename(path) or 'GGUF'}: architecture {arch!r} is not supported by the runtime; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    names = {t.name for t in reader.tensors}
    n_heads = int(_field(reader, f"{arch}.attention.head_count", kind=int))
    d_model = int(_field(reader, f"{arch}.embedding_length", kind=int))
    if n_heads <= 0 or d_model <= 0:
        raise FileFormatError(f"{path or 'GGUF'}: {arch}.attention.head_count ({n_heads}) and embedding_length ({d_model}) must be positive")
    head_dim = d_model // n_heads
    rope_dim = int(_field(reader, f"{arch}.rope.dimension_count", head_dim, required=False, kind=int))
    key_length = int(_field(reader, f"{arch}.attention.key_length", head_dim, required=False, kind=int))
    if rope_dim != head_dim or key_length != head_dim:
        raise NotSupportedError(
            f"partial rotary ({rope_dim} of {head_dim} dims) or a head size {key_length} other than "
            f"embedding_length/head_count ({head_dim}) is not supported by the runtime"
        )
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none", required=False)
    if scaling not in ("none", "linear"):
        raise NotSupportedError(f"rope scaling {scaling!r} is not supported; supported: none, linear")
    factor = float(_field(reader, f"{arch}.rope.scaling.factor", 1.0, required=False, kind=float)) if scaling == "linear" else 1.0
    tokens = reader.metadata.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, f"{arch}.vocab_size", getattr(tokens, "count", None), kind=int))
    return LlamaConfig(
        architecture=arch,
        name=str(_field(reader, "general.name", "", required=False)),
        n_layers=int(_field(reader, f"{arch}.block_count", kind=int)),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads, required=False, kind=int)),
        ffn_dim=int(_field(reader, f"{arch}.feed_forward_length", kind=int)),
        vocab_size=vocab,
        n_ctx_train=int(_field(reader, f"{arch}.context_length", kind=int)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0, required=False, kind=float)),
        rope_scale=factor,
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", kind=float)),
        attention_bias="blk.0.attn_q.bias" in names,
        tied_embeddings="output.weight" not in names,
    )


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """A GGUFFile: the header parsed by inferlab's bounded reader (FileFormatError on a bad file),
    the tensor data as views of one read-only memory map."""
    try:
        import numpy as np
        from gguf import GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape
    except ImportError as exc:  # pragma: no cover - gguf is in the runtime extra
        from ..errors import MissingDependencyError

        raise MissingDependencyError("gguf", "loading GGUF weights", "runtime") from exc
    from ..models.gguf_reader import read_gguf_header

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidValueError(f"model file {path!r} does not exist")
    header = read_gguf_header(path, keep=KEPT_METADATA)
    if header.byte_order != "little":
        raise NotSupportedError(f"{path}: a {header.byte_order}-endian GGUF; the runtime reads little-endian files")
    n_split = header.metadata.get("split.count")
    if isinstance(n_split, int) and n_split > 1:
        raise NotSupportedError(f"{path}: one part of a {n_split}-part split GGUF; the runtime reads single-file models")
    mm = np.memmap(path, dtype=np.uint8, mode="r") if header.tensors else np.zeros(0, dtype=np.uint8)
    tensors = []
    for info, offset in zip(header.tensors, header.tensor_offsets):
        qtype = GGMLQuantizationType.__members__.get(info.ggml_type)
        if qtype is None:
            raise NotSupportedError(
                f"{path}: tensor {info.name!r} has type {info.ggml_type}, which the gguf package does not know; "
                f"supported: {', '.join(supported_tensor_types())}"
            )
        dims = tuple(reversed(info.shape))  # numpy order: the row length last
        start = header.data_offset + offset
        raw = mm[start : start + info.n_bytes]
        if qtype == GGMLQuantizationType.F32:
            data = raw.view(np.float32).reshape(dims)
        elif qtype == GGMLQuantizationType.F16:
            data = raw.view(np.float16).reshape(dims)
        else:
            byte_shape = quant_shape_to_byte_shape(dims, qtype)
            if math.prod(byte_shape) != info.n_bytes:  # the type tables of inferlab and gguf disagree
                raise NotSupportedError(
                    f"{path}: tensor {info.name!r} of type {info.ggml_type} takes {info.n_bytes} bytes by inferlab's "
                    f"type table but {math.prod(byte_shape)} by the gguf package's; the runtime cannot read it"
                )
            data = raw.reshape(byte_shape)
        tensors.append(GGUFTensor(info.name, qtype, info.shape, data))
    return GGUFFile(path, header, tuple(tensors))


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


def load_state(reader: GGUFFile, config: LlamaConfig, dtype) -> dict:
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

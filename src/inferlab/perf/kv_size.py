"""KV-cache sizes: bytes per token and per context, for every cache type the engines offer.

llama.cpp stores K and V in GGML types (-ctk/-ctv: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl,
q5_0, q5_1) at their true block sizes (q8_0 is 34 bytes per 32 values = 8.5 bits); vLLM and
SGLang offer fp8 (e4m3/e5m2, one byte per value).
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import InvalidValueError, UnknownNameError, check_positive
from ..models.spec import ModelSpec
from ..quant.types import ggml_type

LLAMA_CPP_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
SERVING_KV_TYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")
KV_TYPES = LLAMA_CPP_KV_TYPES + SERVING_KV_TYPES
KV_PAD_TOKENS = 256  # llama.cpp pads the cache length to a multiple of 256


@lru_cache(maxsize=64)
def kv_bytes_per_value(kv_type: str) -> float:
    """Bytes one cached K or V element takes (block overhead included)."""
    k = kv_type.lower() if isinstance(kv_type, str) else kv_type
    if k in SERVING_KV_TYPES:
        return 1.0
    if k not in LLAMA_CPP_KV_TYPES:
        raise UnknownNameError("KV cache type", kv_type, KV_TYPES)
    t = ggml_type(k.upper())
    return t.type_size / t.block_size  # bytes of a block over the values it holds


def _check_args(model, kv_type, **counts) -> None:
    """Typed errors naming the argument before the caches (lru_cache needs hashable arguments)."""
    if not isinstance(model, ModelSpec):
        raise InvalidValueError(f"model must be a ModelSpec (resolve a name with models.resolve.resolve_model), "
                                f"got {type(model).__name__} {model!r:.60}")
    if not isinstance(kv_type, str):
        raise InvalidValueError(f"kv_type must be a KV cache type name (f16, q8_0...), got {type(kv_type).__name__} {kv_type!r:.60}")
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidValueError(f"{name} must be an integer >= 1, got {v!r:.60}")


def kv_bytes_per_token(model: ModelSpec, kv_type: str = "f16") -> float:
    """Bytes one token adds to the cache of every layer (sliding-window layers included, as if
    the context were shorter than the window). MLA caches the compressed latent, not K and V."""
    _check_args(model, kv_type)
    return _per_token(model, kv_type)


@lru_cache(maxsize=4096)
def _per_token(model: ModelSpec, kv_type: str) -> float:
    b = kv_bytes_per_value(kv_type)
    return sum(model.kv_elements_per_token(i) for i in range(model.n_layers)) * b


def swa_cache_tokens(model: ModelSpec, n_ctx: int, n_seq: int = 1, n_ubatch: int = 512) -> int:
    """Cells a sliding-window layer keeps: llama.cpp's min(n_ctx, pad(n_swa*n_seq + n_ubatch, 256))."""
    w = model.sliding_window or n_ctx
    need = w * n_seq + n_ubatch
    return min(n_ctx, -(-need // KV_PAD_TOKENS) * KV_PAD_TOKENS)


def layer_kv_bytes(model: ModelSpec, n_ctx: int, kv_type: str = "f16", n_seq: int = 1, n_ubatch: int = 512) -> tuple[float, ...]:
    """Bytes of each layer's cache for a context of n_ctx tokens (windowed layers hold the window)."""
    _check_args(model, kv_type, n_ctx=n_ctx, n_seq=n_seq, n_ubatch=n_ubatch)
    return _layer_kv(model, n_ctx, kv_type, n_seq, n_ubatch)


@lru_cache(maxsize=4096)
def _layer_kv(model: ModelSpec, n_ctx: int, kv_type: str, n_seq: int, n_ubatch: int) -> tuple[float, ...]:
    check_positive("n_ctx", n_ctx)
    b = kv_bytes_per_value(kv_type)
    swa_tokens = swa_cache_tokens(model, n_ctx, n_seq, n_ubatch) if model.swa_layers else n_ctx
    return tuple(
        model.kv_elements_per_token(i) * b * (swa_tokens if model.layer_is_swa(i) else n_ctx)  # values/token x bytes/value x cells
        for i in range(model.n_layers)
    )


def kv_cache_bytes(model: ModelSpec, n_ctx: int, kv_type: str = "f16", n_seq: int = 1) -> float:
    """Total cache bytes for n_ctx tokens (llama.cpp allocates this up front for -c n_ctx)."""
    return sum(layer_kv_bytes(model, n_ctx, kv_type, n_seq))


def kv_read_bytes(model: ModelSpec, context: int, kv_type: str = "f16") -> tuple[float, ...]:
    """Bytes of cache one decode step reads per layer at a given context (a window caps it)."""
    _check_args(model, kv_type)
    if isinstance(context, bool) or not isinstance(context, int):
        raise InvalidValueError(f"context must be an integer number of tokens, got {context!r:.60}")
    if context <= 0:
        return (0.0,) * model.n_layers
    b = kv_bytes_per_value(kv_type)
    w = model.sliding_window or context
    return tuple(model.kv_elements_per_token(i) * b * (min(context, w) if model.layer_is_swa(i) else context) for i in range(model.n_layers))


def kv_cache_bytes_per_batch(model: ModelSpec, seq_len: int, batch_size: int = 1, dtype_bytes: float = 2) -> float:
    """The KV-cache case study's reading, ``kv_cache_bytes(config, seq_len, batch_size, dtype_bytes)``:
    2 (K and V) x layers x KV heads x head size x seq_len x batch_size x dtype_bytes, bytes.

    ``batch_size`` sequences of ``seq_len`` tokens each, every element ``dtype_bytes`` bytes (2 for
    f16, 1 for int8/fp8; no block scales, unlike llama.cpp's q8_0 at 34/32 bytes). Sliding-window
    layers hold at most their window; MLA caches the latent. For llama.cpp's own allocation of a
    context shared by several sequences, see :func:`kv_cache_bytes` (its third argument is a KV type).
    """
    for name, v in (("seq_len", seq_len), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            from ..errors import InvalidValueError

            raise InvalidValueError(f"{name} must be an integer >= 0, got {v!r}")
    check_positive("dtype_bytes", dtype_bytes)
    w = model.sliding_window or seq_len
    per_seq = sum(model.kv_elements_per_token(i) * (min(seq_len, w) if model.layer_is_swa(i) else seq_len) for i in range(model.n_layers))
    return float(per_seq * batch_size * dtype_bytes)  # elements of one sequence x sequences x bytes per element

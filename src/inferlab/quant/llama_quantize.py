"""Quantize a GGUF with llama.cpp itself: ``llama_model_quantize`` through llama-cpp-python.

The real quantizer is the oracle the rules in ``quant.rules`` are checked against: tests write a
random-weight GGUF (``models.gguf_writer.write_gguf``), quantize it here at a preset, and compare
every tensor's type and bytes with ``quant.plan.tensor_plan``. Needs llama-cpp-python (the
``engine`` extra), gguf and numpy (``files``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import FileFormatError, InvalidValueError, MissingDependencyError, NotSupportedError, check_positive
from ..models.gguf_writer import _import_gguf
from ..models.ggml_types import ggml_type
from .presets import Preset, resolve_quant
from .rules import allows_quantization


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, preset, n_threads: int = 2, *,
                  pure: bool = False, imatrix: dict | None = None) -> Path:
    """Quantize ``src`` to ``dst`` with llama.cpp's llama_model_quantize (llama-cpp-python).

    preset: a llama-quantize preset name or a quant.presets.Preset (its output_type and
    token_embd_type are passed on).
    pure: llama-quantize --pure (every quantizable tensor in the preset's base type).
    imatrix: importance-matrix data, tensor name -> one float per column (ne[0] x experts), as
    llama-imatrix writes it; ``uniform_imatrix(src)`` makes a neutral one. Presets that cannot be
    made without an imatrix (IQ1/IQ2/IQ3_XXS, IQ3_XS, Q2_K_S), and Preset(..., imatrix=True), need it.
    """
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependencyError("llama-cpp-python", "quantizing with llama.cpp", extra="engine") from None
    import ctypes

    # a bare name means the preset here ("Q6_K" is llama-quantize's Q6_K); "type:"/"preset:" are kept
    q = resolve_quant(preset if not isinstance(preset, str) or ":" in preset else "preset:" + preset)
    if not isinstance(q, Preset):
        raise NotSupportedError(f"quantize_gguf needs a llama-quantize preset, got {q.label}")
    if q.imatrix and imatrix is None:
        raise InvalidValueError(f"{q.label} is made with an importance matrix: pass imatrix= (uniform_imatrix(src) makes one)")
    check_positive("n_threads", n_threads)
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileFormatError(f"{src}: no such GGUF file")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = q.info.ftype_id
    params.nthread = int(n_threads)
    params.pure = bool(pure)
    if q.output_type:
        params.output_tensor_type = ggml_type(q.output_type).type_id
    if q.token_embd_type:
        params.token_embedding_type = ggml_type(q.token_embd_type).type_id
    keep = None
    if imatrix is not None and q.imatrix is not False:
        keep = _imatrix_array(imatrix)  # kept alive until llama.cpp returns
        # the field is a typed pointer in recent llama-cpp-python, a void pointer in older ones: cast to whichever it is
        params.imatrix = ctypes.cast(  # pyright: ignore[reportAttributeAccessIssue]  (the stub types only the typed pointer)
            keep[0], type(params.imatrix) if hasattr(type(params.imatrix), "contents") else ctypes.c_void_p)
    # byref() is a valid pointer argument; llama-cpp-python's annotation (CtypesPointerOrRef) does not admit ctypes' _CArgObject
    from ..fileio import interruptible

    rc = interruptible(llama_cpp.llama_model_quantize, str(src).encode(), str(dst).encode(), ctypes.byref(params))  # Ctrl-C stays live
    del keep
    if rc != 0:
        raise FileFormatError(f"llama.cpp could not quantize {src} to {q.label} (llama_model_quantize returned {rc}; its log says why)")
    return dst


def uniform_imatrix(path: str | os.PathLike) -> dict:
    """A neutral importance matrix (every column weighted 1) for each quantizable tensor of a GGUF."""
    gguf, np = _import_gguf()
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in t.shape)  # gguf-py lists ne[] order
        if allows_quantization(t.name, shape):
            cols = shape[0]  # ne[0]: one weight per column
            experts = shape[2] if len(shape) > 2 else 1
            out[t.name] = np.ones(cols * experts, dtype=np.float32)
    return out


def _imatrix_array(imatrix: dict):
    """A NULL-terminated C array of struct llama_model_imatrix_data {name, data, size}."""
    import ctypes

    class ImatrixData(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.POINTER(ctypes.c_float)), ("size", ctypes.c_size_t)]

    _, np = _import_gguf()
    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in imatrix.items()}
    entries = (ImatrixData * (len(arrays) + 1))()
    names = []
    for e, (k, a) in zip(entries, arrays.items()):
        names.append(k.encode())
        e.name = names[-1]
        e.data = a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        e.size = a.size
    return entries, arrays, names

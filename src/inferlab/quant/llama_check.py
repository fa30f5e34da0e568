"""Ask llama.cpp itself which type each tensor gets: ``llama_model_quantize`` (llama-cpp-python),
on a GGUF laid out from a ModelSpec, and compare with ``tensor_plan``.

Two ways, both through the same call llama-quantize makes:

- ``llama_types(spec, quant)``: llama.cpp's own dry run (``--dry-run``, params.dry_run) on a
  *skeleton* GGUF: the header, the metadata llama.cpp reads to load hparams and the tensor table of
  models.inventory, followed by a data region that is a hole in a sparse file (no bytes on disk,
  so a 405B model's skeleton takes a few kB). The dry run computes every tensor's target type
  with the same code as a real run (llama_tensor_get_type, then the row-size fallback) and logs
  it; it does not read tensor data. Milliseconds per model and preset, at the model's real shape.
- ``quantize(src, dst, quant)`` on a file with data (``write_skeleton(..., data="random")``):
  the real quantizers, whose output file's tensor table gives types and bytes.

An importance matrix changes a few rules (has_imatrix); a dry run with ``imatrix=True`` passes a
one-entry matrix, which sets has_imatrix and is never read. llama.cpp's log is taken with
llama_log_set for the duration of a call and handed back to llama-cpp-python's logger after.

Needs gguf, numpy and llama-cpp-python (``pip install 'inferlab[engine,files]'``); they are
imported inside the functions.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ..errors import FileFormatError, MissingDependencyError, NotSupportedError
from ..models.inventory import tensor_inventory
from ..models.spec import ModelSpec
from .presets import Preset, resolve_quant
from .types import ggml_type

# architectures whose hparams this module writes (what llama.cpp's load_hparams requires)
CHECKABLE_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma2", "gemma3", "phi3",
                           "gpt-oss", "deepseek2")
_ALIGN = 32  # GGUF_DEFAULT_ALIGNMENT
# "[  12/ 291]   blk.0.attn_v.weight  - [ 4096,  1024,     1,     1], type =    f16, size =    8.000 MiB -> 2.750 MiB (q6_K)"
_LINE = re.compile(r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\S+), size =\s*[\d.]+ MiB(?: ->\s*[\d.]+ MiB \((\S+)\))?")


def _imports():
    try:
        import gguf
        import llama_cpp
        import numpy as np
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(exc.name or "llama-cpp-python", "checking plans with llama.cpp", extra="engine") from None
    return gguf, np, llama_cpp


def _is_f32(name: str, shape: tuple[int, ...]) -> bool:
    """What convert_hf_to_gguf keeps in F32: 1-D tensors, biases, the MoE router."""
    return len(shape) == 1 or not name.endswith("weight") or "ffn_gate_inp" in name


def write_skeleton(spec: ModelSpec, path: str | os.PathLike, *, data: str = "none", seed: int = 0,
                   tokenizer: bool = False) -> Path:
    """Write ``spec`` as an F16 GGUF (F32 norms, biases, router) that llama_model_quantize loads.

    data "none": the data region is a hole (a sparse file; enough for a dry run, which never reads
    it); "random": seeded normal weights (std 0.02), for a real quantization of a small model.
    tokenizer: add models.gguf_writer's small SentencePiece-style vocab (vocab_size > 259), so that
    llama.cpp can load the file as a model (llama_model_load checks every tensor's shape).
    """
    gguf, np, _ = _imports()
    if spec.arch not in CHECKABLE_ARCHITECTURES:
        raise NotSupportedError(f"no llama.cpp metadata is written for architecture {spec.arch!r}; "
                                f"supported: {', '.join(CHECKABLE_ARCHITECTURES)}")
    if data not in ("none", "random"):
        raise NotSupportedError(f"data {data!r}: choose 'none' or 'random'")
    path = Path(path)
    w = gguf.GGUFWriter(str(path), spec.arch)
    _write_hparams(w, spec)
    if tokenizer:
        from ..models.gguf_writer import write_tokenizer

        write_tokenizer(w, spec.vocab_size)
    tensors = tensor_inventory(spec)
    sizes = []
    for t in tensors:
        f32 = _is_f32(t.name, t.shape)
        n = t.n_elements * (4 if f32 else 2)
        w.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32 if f32 else np.float16), n)
        sizes.append(n)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    start = -(-f.tell() // _ALIGN) * _ALIGN  # tensor data starts aligned; each tensor is padded to the alignment
    if data == "random":
        rng = np.random.default_rng(seed)
        f.seek(start)
        for t, n in zip(tensors, sizes):
            np_shape = tuple(reversed(t.shape))
            if _is_f32(t.name, t.shape):
                base = 1.0 if t.name.endswith("norm.weight") else 0.0
                a = (base + 0.02 * rng.standard_normal(np_shape, dtype=np.float32)).astype(np.float32)
            else:
                a = (0.02 * rng.standard_normal(np_shape, dtype=np.float32)).astype(np.float16)
            f.write(a.tobytes())
            f.write(b"\0" * (-n % _ALIGN))
    f.truncate(start + sum(-(-n // _ALIGN) * _ALIGN for n in sizes))
    w.close()
    return path


def _write_hparams(w, m: ModelSpec) -> None:
    """The keys llama.cpp's load_hparams reads for m.arch (src/models/<arch>.cpp)."""
    w.add_file_type(1)  # mostly F16
    w.add_block_count(m.n_layers)
    w.add_context_length(m.n_ctx_train)
    w.add_embedding_length(m.d_model)
    # llama-arch MoE (Mixtral) reads its expert size from feed_forward_length
    w.add_feed_forward_length(m.d_ff_expert if m.arch == "llama" and m.is_moe else m.d_ff)
    w.add_head_count(m.n_heads)
    w.add_head_count_kv(m.n_kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(m.vocab_size)
    if m.is_mla:
        w.add_key_length(m.kv_lora_rank + m.qk_rope_head_dim)  # as convert_hf_to_gguf writes MLA
        w.add_value_length(m.kv_lora_rank)
        w.add_key_length_mla(m.qk_nope_head_dim + m.qk_rope_head_dim)
        w.add_value_length_mla(m.head_dim_v)
        w.add_kv_lora_rank(m.kv_lora_rank)
        if m.q_lora_rank:
            w.add_q_lora_rank(m.q_lora_rank)
        w.add_rope_dimension_count(m.qk_rope_head_dim)
    else:
        w.add_key_length(m.head_dim)
        w.add_value_length(m.head_dim_v)
        w.add_rope_dimension_count(m.head_dim)
    if m.sliding_window:
        w.add_sliding_window(m.sliding_window)
    if m.is_moe:
        w.add_expert_count(m.n_experts)
        w.add_expert_used_count(m.n_experts_used)
        if m.arch != "llama":
            w.add_expert_feed_forward_length(m.d_ff_expert)
        if m.d_ff_shared:
            w.add_expert_shared_feed_forward_length(m.d_ff_shared)
        if m.arch == "deepseek2":
            w.add_expert_shared_count(m.n_shared_experts)
            w.add_leading_dense_block_count(m.n_dense_layers)


def _preset(quant) -> Preset:
    q = resolve_quant(quant if not isinstance(quant, str) or ":" in quant else "preset:" + quant)
    if not isinstance(q, Preset):
        raise NotSupportedError(f"llama_model_quantize takes a llama-quantize preset, got {q.label}")
    return q


def _params(llama_cpp, q: Preset, n_threads: int):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = q.info.ftype_id
    p.nthread = int(n_threads)
    if q.output_type:
        p.output_tensor_type = ggml_type(q.output_type).type_id
    if q.token_embd_type:
        p.token_embedding_type = ggml_type(q.token_embd_type).type_id
    return p


class _Log:
    """llama.cpp's log text while a call runs (llama_log_set), then llama-cpp-python's logger again."""

    def __init__(self, llama_cpp):
        import ctypes

        self.llama_cpp, self.parts = llama_cpp, []

        @llama_cpp.llama_log_callback
        def cb(level, text, user_data):
            self.parts.append(text.decode("utf-8", "replace"))

        self.cb, self.null = cb, ctypes.c_void_p(0)

    def __enter__(self):
        self.llama_cpp.llama_log_set(self.cb, self.null)
        return self

    def __exit__(self, *exc):
        try:
            from llama_cpp import _logger
            self.llama_cpp.llama_log_set(_logger.llama_log_callback, self.null)
        except ImportError:  # pragma: no cover - older llama-cpp-python
            self.llama_cpp.llama_log_set(None, self.null)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _imatrix_entries(ctypes, imatrix: Mapping[str, object]):
    """A NULL-terminated C array of struct llama_model_imatrix_data {name, data, size}."""
    import numpy as np

    class Entry(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.POINTER(ctypes.c_float)), ("size", ctypes.c_size_t)]

    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in imatrix.items()}
    entries = (Entry * (len(arrays) + 1))()  # pyright: ignore[reportOperatorIssue]  (ctypes array type)
    names = []
    for e, (k, a) in zip(entries, arrays.items()):
        names.append(k.encode())
        e.name, e.data, e.size = names[-1], a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), a.size
    return entries, (arrays, names)


def dry_run_types(src: str | os.PathLike, quant, *, imatrix: bool = False) -> dict[str, str]:
    """The type llama.cpp's quantizer picks for each tensor of the GGUF ``src`` (a dry run)."""
    return dry_run(src, quant, imatrix=imatrix)[0]


def dry_run(src: str | os.PathLike, quant, *, imatrix: bool = False) -> tuple[dict[str, str], float]:
    """A dry run: each tensor's type, and the tensor bytes llama.cpp reports ("quant size = X MiB",
    rounded to 0.01 MiB)."""
    import ctypes

    _, _, llama_cpp = _imports()
    q = _preset(quant)
    p = _params(llama_cpp, q, 1)
    p.dry_run = True
    keep = None
    if imatrix:  # has_imatrix: the entries are never read in a dry run
        keep = _imatrix_entries(ctypes, {"(none)": [1.0]})
        p.imatrix = ctypes.cast(keep[0], type(p.imatrix))
    with tempfile.TemporaryDirectory() as d, _Log(llama_cpp) as log:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), os.path.join(d, "unused.gguf").encode(), ctypes.byref(p))
    del keep
    if rc != 0:
        raise FileFormatError(f"llama.cpp's dry run of {q.label} on {src} failed: {log.text.strip().splitlines()[-1:]}")
    size = re.search(r"quant size\s*=\s*([\d.]+) MiB", log.text)
    types = {m.group(1): (m.group(3) or m.group(2)).upper() for m in _LINE.finditer(log.text)}
    return types, float(size.group(1)) * 2**20 if size else float("nan")


def llama_bytes(spec: ModelSpec, types: Mapping[str, str]) -> int:
    """Tensor bytes of spec with llama.cpp's types, by gguf-py's block table (GGML_QUANT_SIZES,
    ggml's own block sizes; independent of inferlab's data/ggml_types.json)."""
    gguf, _, _ = _imports()
    total = 0
    for t in tensor_inventory(spec):
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[types[t.name]]]
        total += t.n_elements // block * size  # whole blocks: ne[0] is a multiple of the block
    return total


def llama_types(spec: ModelSpec, quant, *, imatrix: bool | None = None, workdir: str | os.PathLike | None = None) -> dict[str, str]:
    """llama.cpp's type for each tensor of ``spec`` at ``quant`` (a dry run on a skeleton GGUF).

    imatrix: None follows the preset (Preset.imatrix, or what the plan resolved it to)."""
    q = _preset(quant)
    if imatrix is None:
        imatrix = bool(q.imatrix) if q.imatrix is not None else _plan_uses_imatrix(spec, q)
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        src = write_skeleton(spec, Path(d) / "skeleton.gguf")
        return dry_run_types(src, q, imatrix=imatrix)


def _plan_uses_imatrix(spec: ModelSpec, q: Preset) -> bool:
    from .plan import plan_imatrix

    return plan_imatrix(spec, q)


def quantize(src: str | os.PathLike, dst: str | os.PathLike, quant, *, imatrix: Mapping[str, object] | None = None,
             n_threads: int = 2) -> dict[str, tuple[str, int]]:
    """Quantize ``src`` with llama.cpp; returns each tensor's (type, bytes) as the written file has them.

    imatrix: tensor name -> one weight per column (ne[0] x experts), as llama-imatrix stores it;
    ``uniform_imatrix(src)`` makes a neutral one.
    """
    import ctypes

    gguf, _, llama_cpp = _imports()
    q = _preset(quant)
    p = _params(llama_cpp, q, n_threads)
    keep = None
    if imatrix is not None:
        keep = _imatrix_entries(ctypes, imatrix)
        p.imatrix = ctypes.cast(keep[0], type(p.imatrix))
    with _Log(llama_cpp) as log:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    del keep
    if rc != 0:
        raise FileFormatError(f"llama.cpp could not quantize {src} to {q.label}: {log.text.strip().splitlines()[-1:]}")
    return {t.name: (t.tensor_type.name, int(t.n_bytes)) for t in gguf.GGUFReader(str(dst)).tensors}


def uniform_imatrix(spec: ModelSpec) -> dict[str, object]:
    """A neutral importance matrix (every column weighted 1) for each quantizable tensor of spec."""
    _, np, _ = _imports()
    from .rules import allows_quantization

    return {t.name: np.ones(t.shape[0] * (t.shape[2] if len(t.shape) > 2 else 1), dtype=np.float32)
            for t in tensor_inventory(spec) if allows_quantization(t.name, t.shape)}


def plan_differences(spec: ModelSpec, quant, llama: Mapping[str, str | tuple[str, int]]) -> dict[str, tuple]:
    """Tensors whose planned type (or (type, bytes)) differs from llama.cpp's, name -> (planned, llama.cpp);
    a tensor on one side only shows None on the other."""
    from .plan import tensor_plan

    q = _preset(quant)
    with_bytes = any(isinstance(v, tuple) for v in llama.values())
    planned = {e.name: ((e.ggml_type, e.n_bytes) if with_bytes else e.ggml_type) for e in tensor_plan(spec, q)}
    return {n: (planned.get(n), llama.get(n)) for n in sorted(set(planned) | set(llama)) if planned.get(n) != llama.get(n)}


# --- many real quantizations, in parallel ---------------------------------------------------------

def _run_cases(cases: list, workdir: str) -> list:
    """One worker: quantize each (key, spec, preset, imatrix) case; source files written once per spec."""
    sources: dict[ModelSpec, Path] = {}
    out = []
    for key, spec, q, imatrix in cases:
        if spec not in sources:
            sources[spec] = write_skeleton(spec, Path(workdir) / f"src-{os.getpid()}-{len(sources)}.gguf", data="random",
                                           seed=len(sources))
        dst = Path(workdir) / f"q-{os.getpid()}.gguf"
        t0 = time.perf_counter()
        try:
            r = quantize(sources[spec], dst, q, imatrix=uniform_imatrix(spec) if imatrix else None, n_threads=1)
        except FileFormatError as exc:
            r = exc
        finally:
            dst.unlink(missing_ok=True)
        out.append((key, r, time.perf_counter() - t0))
    for p in sources.values():
        p.unlink(missing_ok=True)
    return out


def quantize_cases(cases: Mapping[object, tuple], workdir: str | os.PathLike, *, n_workers: int = 2,
                   spread=None, seconds: dict | None = None) -> dict[object, dict[str, tuple[str, int]] | FileFormatError]:
    """Real quantizations of small models, key -> (spec, quant, imatrix: bool), in ``n_workers``
    processes (each quantizes with one thread: IQ1/IQ2/IQ3 grids are built once per process, single
    threaded, so whole processes share the cores better). Returns key -> the written file's
    {tensor: (type, bytes)}, or the FileFormatError llama.cpp's refusal raised.

    spread(key, quant) -> worker index: which worker takes a case (default: round robin); give the
    presets that build the same grid to the same worker. seconds: filled with key -> (worker,
    wall seconds of that quantization, a grid's first build included).
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    groups: list[list] = [[] for _ in range(max(1, n_workers))]
    for i, (key, (spec, quant, imatrix)) in enumerate(cases.items()):
        q = _preset(quant)
        w = (spread(key, q) if spread else i) % len(groups)
        groups[w].append((key, spec, q, bool(imatrix)))
    if len(groups) == 1:
        parts = [_run_cases(groups[0], str(workdir))]
    else:
        with ProcessPoolExecutor(len(groups), mp_context=mp.get_context("spawn")) as pool:
            parts = list(pool.map(_run_cases, groups, [str(workdir)] * len(groups)))
    if seconds is not None:
        seconds.update({k: (w, t) for w, part in enumerate(parts) for k, _, t in part})
    return {k: v for part in parts for k, v, _ in part}

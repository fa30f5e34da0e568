"""ModelSpec from a GGUF file's header: its metadata and tensor table, never its tensor data.

A bounded parser (standard library only): every count and string length is checked against
the bytes left in the file before anything is allocated or looped over, so a malformed or
hostile file raises FileFormatError with the offset and the reason, in time and memory bounded
by the header's size. The format is llama.cpp's docs/gguf.md (versions 2 and 3); the checks
follow ggml/src/gguf.cpp (gguf_init_from_file_impl).

``keep``: metadata keys whose arrays and strings are kept whole whatever their length (the torch
runtime asks for the tokenizer's tokens, merges and token types; strings are decoded strictly, in
one pass over the memory map).

Split models (``name-00001-of-00003.gguf``) are read whole from any part; vision-projector
tensors (``v.*``, ``mm.*``, or a ``*mmproj*.gguf`` file beside the model) are reported in
``spec.extra`` and kept out of ``spec.tensors``.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FileFormatError, NotSupportedError
from .ggml_types import file_type_names, ggml_types_by_id
from .spec import ARCHITECTURES, ModelSpec, TensorInfo

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # version 1 (32-bit counts) is rejected by llama.cpp too
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # tensor names, including the terminating NUL in llama.cpp

# enum gguf_type -> struct format of one value (strings and arrays are handled apart)
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_VALUE_TYPE_NAMES = "UINT8 INT8 UINT16 INT16 UINT32 INT32 FLOAT32 BOOL STRING ARRAY UINT64 INT64 FLOAT64".split()

# retained metadata: strings longer than this keep only their length; arrays longer than this
# keep only their count (the token list, merges and scores are counted, not copied)
_MAX_KEPT_STRING = 1 << 20
_MAX_KEPT_ARRAY = 4096
# ggml.h types that are not weight formats (no entry in quant/data/ggml_types.json): a file that
# uses one is valid but not something inferlab reads
_GGML_OTHER_TYPES = {24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}

_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_VISION_PREFIXES = ("v.", "mm.", "vision.", "mm_", "resampler.")


@dataclass(frozen=True)
class GGUFArray:
    """A metadata array: its element type and count; the values when short (else None)."""

    value_type: str
    count: int
    values: tuple | None


@dataclass(frozen=True)
class GGUFHeader:
    """One GGUF file's header: metadata, tensor table, and where the tensor data would start."""

    path: str
    version: int
    byte_order: str  # "little" or "big"
    metadata: dict[str, Any]  # str -> int | float | bool | str | GGUFArray; long strings -> int length only
    tensors: tuple[TensorInfo, ...]
    tensor_offsets: tuple[int, ...]  # relative to data_offset
    alignment: int
    data_offset: int  # first byte of tensor data
    file_bytes: int

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)


class _Cursor:
    """Reads little- or big-endian values from a buffer, checking every length against the end."""

    def __init__(self, buf, size: int, path: str, order: str = "<"):
        self.buf, self.size, self.path, self.order, self.pos = buf, size, path, order, 0

    def fail(self, what: str) -> FileFormatError:
        return FileFormatError(f"{self.path}: {what} (at byte {self.pos} of {self.size})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise self.fail(f"truncated or corrupt GGUF: {what} needs {n} bytes but only {self.size - self.pos} remain")

    def scalar(self, fmt: str, what: str):
        st = struct.Struct(self.order + fmt)
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def u32(self, what: str) -> int:
        return self.scalar("I", what)

    def u64(self, what: str) -> int:
        return self.scalar("Q", what)

    def raw_string(self, what: str) -> bytes:
        n = self.u64(f"length of {what}")
        self.need(n, f"{what} of {n} bytes")
        b = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return b

    def text(self, what: str) -> str:
        b = self.raw_string(what)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8: {b[:40]!r}") from None


def _type_name(t: int) -> str:
    return _VALUE_TYPE_NAMES[t] if 0 <= t < len(_VALUE_TYPE_NAMES) else str(t)


def _read_value(c: _Cursor, vtype: int, key: str, whole: bool = False) -> Any:
    """One metadata value; ``whole``: keep it whatever its length (long strings and arrays)."""
    if vtype in _SCALAR_FORMATS:
        return c.scalar(_SCALAR_FORMATS[vtype], f"value of {key!r}")
    if vtype == _STRING:
        n = c.u64(f"length of the string {key!r}")
        c.need(n, f"string {key!r} of {n} bytes")
        if n > _MAX_KEPT_STRING and not whole:
            c.pos += n
            return n  # too long to keep: its length
        b = bytes(c.buf[c.pos : c.pos + n])
        c.pos += n
        return b.decode("utf-8", errors="replace")
    if vtype == _ARRAY:
        etype = c.u32(f"element type of the array {key!r}")
        count = c.u64(f"length of the array {key!r}")
        if etype in _SCALAR_FORMATS:
            st = struct.Struct(c.order + _SCALAR_FORMATS[etype])
            if count > (c.size - c.pos) // st.size:
                raise c.fail(f"array {key!r} claims {count} {_type_name(etype)} values, more than the file holds")
            values = None
            if count <= _MAX_KEPT_ARRAY or whole:
                values = tuple(v for (v,) in st.iter_unpack(c.buf[c.pos : c.pos + count * st.size]))
            c.pos += count * st.size
            return GGUFArray(_type_name(etype), count, values)
        if etype == _STRING:
            if count > (c.size - c.pos) // 8:  # every string has at least its 8-byte length
                raise c.fail(f"array {key!r} claims {count} strings, more than the file holds")
            if whole:
                return GGUFArray("STRING", count, _read_strings(c, count, key))
            if count <= 64:
                values = tuple(_read_value(c, _STRING, f"{key}[{i}]") for i in range(count))
                return GGUFArray("STRING", count, values)
            _skip_strings(c, count, key)
            return GGUFArray("STRING", count, None)
        raise c.fail(f"array {key!r} has element type {_type_name(etype)}; valid: scalars and strings (no nested arrays)")
    raise c.fail(f"metadata {key!r} has unknown value type {vtype}; valid: 0-12")


def _skip_strings(c: _Cursor, count: int, key: str) -> None:
    """Step over count length-prefixed strings (a vocabulary: ~10^5 of them) without copying them."""
    unpack = struct.Struct(c.order + "Q").unpack_from
    buf, pos, end = c.buf, c.pos, c.size
    for i in range(count):
        if pos + 8 > end:
            c.pos = pos
            raise c.fail(f"truncated or corrupt GGUF: length of {key}[{i}] needs 8 bytes but only {end - pos} remain")
        start, pos = pos, pos + 8 + unpack(buf, pos)[0]
        if pos > end:
            c.pos = start
            raise c.fail(f"truncated or corrupt GGUF: string {key}[{i}] runs past the end of the file")
    c.pos = pos


def _read_strings(c: _Cursor, count: int, key: str) -> tuple[str, ...]:
    """count length-prefixed UTF-8 strings, each checked against the end of the file (a
    vocabulary: ~10^5 of them in one pass; strict decoding, as the gguf package's reader)."""
    unpack = struct.Struct(c.order + "Q").unpack_from
    buf, pos, end = c.buf, c.pos, c.size
    out: list[str] = []
    append = out.append
    for i in range(count):
        if pos + 8 > end:
            c.pos = pos
            raise c.fail(f"truncated or corrupt GGUF: length of {key}[{i}] needs 8 bytes but only {end - pos} remain")
        start = pos + 8
        pos = start + unpack(buf, pos)[0]
        if pos > end:
            c.pos = start - 8
            raise c.fail(f"truncated or corrupt GGUF: string {key}[{i}] runs past the end of the file")
        try:
            append(str(buf[start:pos], "utf-8"))
        except UnicodeDecodeError:
            c.pos = start
            raise c.fail(f"{key}[{i}] is not valid UTF-8: {bytes(buf[start:min(pos, start + 40)])!r}") from None
    c.pos = pos
    return tuple(out)


def read_gguf_header(path: str | os.PathLike, *, keep: Collection[str] = ()) -> GGUFHeader:
    """Parse a GGUF file's header (metadata and tensor table). Raises FileFormatError on a bad file.

    ``keep``: metadata keys kept whole whatever their length (default: arrays longer than
    _MAX_KEPT_ARRAY keep only their count, strings longer than _MAX_KEPT_STRING their length).
    """
    p = str(path)
    if os.path.exists(p) and not os.path.isfile(p):  # a FIFO or a device would block or never end
        raise FileFormatError(f"{p}: not a regular file (a GGUF model is a file)")
    try:
        size = os.path.getsize(p)
        f = open(p, "rb")
    except FileNotFoundError:
        raise FileFormatError(f"{p}: no such GGUF file") from None
    except OSError as exc:
        raise FileFormatError(f"{p}: cannot open GGUF file: {exc.strerror or exc}") from None
    with f:
        if size < 24:  # magic, version, two counts
            raise FileFormatError(f"{p}: not a GGUF file: {size} bytes is shorter than the 24-byte GGUF preamble")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(mm, size, p, frozenset(keep))


def _parse(buf, size: int, path: str, keep: frozenset[str] = frozenset()) -> GGUFHeader:
    c = _Cursor(buf, size, path)
    magic = bytes(buf[0:4])
    if magic != GGUF_MAGIC:
        raise FileFormatError(f"{path}: not a GGUF file: magic {magic!r} instead of {GGUF_MAGIC!r}")
    c.pos = 4
    version = c.u32("version")
    if version not in GGUF_VERSIONS:
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        if swapped in GGUF_VERSIONS:  # a big-endian file (s390x conversions)
            c.order, version = ">", swapped
        elif version == 1:
            raise FileFormatError(f"{path}: GGUF version 1 is obsolete; inferlab (like llama.cpp) reads versions 2 and 3")
        else:
            raise FileFormatError(f"{path}: unknown GGUF version {version}; inferlab reads versions 2 and 3")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("metadata count")
    # a key-value pair takes at least 8 + 4 + 1 bytes, a tensor entry 8 + 1 + 4 + 8 + 4 + 8
    if n_kv > (size - c.pos) // 13:
        raise c.fail(f"metadata count {n_kv} is more than a {size}-byte file can hold")
    if n_tensors > (size - c.pos) // 33:
        raise c.fail(f"tensor count {n_tensors} is more than a {size}-byte file can hold")

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.text(f"key of metadata entry {i}")
        if key in metadata:
            raise c.fail(f"duplicate metadata key {key!r}")
        vtype = c.u32(f"value type of {key!r}")
        metadata[key] = _read_value(c, vtype, key, key in keep)

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise c.fail(f"general.alignment must be a positive power of two, got {alignment!r}")

    types = ggml_types_by_id()
    tensors: list[TensorInfo] = []
    offsets: list[int] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = c.text(f"name of tensor {i}")
        if len(name.encode()) >= GGML_MAX_NAME:
            raise c.fail(f"tensor name {name[:80]!r} is {len(name.encode())} bytes; GGML allows at most {GGML_MAX_NAME - 1}")
        if name in names:
            raise c.fail(f"duplicate tensor name {name!r}")
        names.add(name)
        n_dims = c.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise c.fail(f"tensor {name!r} has {n_dims} dimensions; valid: 1 to {GGML_MAX_DIMS}")
        shape = tuple(c.scalar("q", f"dimension {d} of {name!r}") for d in range(n_dims))
        n_elements = 1
        for d in shape:
            if d <= 0:
                raise c.fail(f"tensor {name!r} has dimension {d} in shape {list(shape)}; dimensions must be positive")
            n_elements *= d
        if n_elements >= 1 << 63:
            raise c.fail(f"tensor {name!r} with shape {list(shape)} has more elements than int64 can count")
        type_id = c.u32(f"type of {name!r}")
        gt = types.get(type_id)
        if gt is None and type_id in _GGML_OTHER_TYPES:
            read = ", ".join(t.name for t in sorted(types.values(), key=lambda t: t.type_id or 0) if t.type_id is not None)
            raise NotSupportedError(
                f"{path}: tensor {name!r} has ggml type {_GGML_OTHER_TYPES[type_id]} (id {type_id}), which inferlab "
                f"does not read; supported: {read}"
            )
        if gt is None:
            known = ", ".join(f"{t.name}={t.type_id}" for t in sorted(types.values(), key=lambda t: t.type_id or 0) if t.type_id is not None)
            raise c.fail(f"tensor {name!r} has unknown ggml type id {type_id}; known: {known}")
        if shape[0] % gt.block_size:
            raise c.fail(f"tensor {name!r}: row length {shape[0]} is not a multiple of the {gt.name} block size {gt.block_size}")
        offset = c.u64(f"data offset of {name!r}")
        if offset % alignment:
            raise c.fail(f"tensor {name!r}: data offset {offset} is not a multiple of the alignment {alignment}")
        tensors.append(TensorInfo(name, shape, gt.name, gt.tensor_bytes(shape)))
        offsets.append(offset)

    data_offset = -(-c.pos // alignment) * alignment  # the tensor data starts at the next aligned byte
    data_bytes = size - data_offset
    for t, off in zip(tensors, offsets):
        if off + t.n_bytes > data_bytes:
            raise FileFormatError(
                f"{path}: tensor {t.name!r} ({t.n_bytes} bytes at data offset {off}) ends past the end of the file "
                f"({max(data_bytes, 0)} bytes of tensor data); the file is truncated or corrupt"
            )
    order = "big" if c.order == ">" else "little"
    return GGUFHeader(path, version, order, metadata, tuple(tensors), tuple(offsets), alignment, data_offset, size)


# --- split files and projectors ----------------------------------------------------------------
def split_parts(path: str | os.PathLike) -> list[Path]:
    """All parts of a split GGUF given any one of them (a plain file: itself)."""
    p = Path(path)
    m = _SPLIT_RE.match(p.name)
    if not m:
        return [p]
    count = int(m["count"])
    if count < 1:
        raise FileFormatError(f"{p}: split file name says 0 parts")
    parts = [p.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [q.name for q in parts if not q.is_file()]
    if missing:
        raise FileFormatError(f"{p}: split model of {count} parts is missing {', '.join(missing)} in {p.parent}")
    return parts


def _is_vision(name: str) -> bool:
    return name.startswith(_VISION_PREFIXES)


def _projector_summary(h: GGUFHeader) -> dict[str, Any]:
    md = h.metadata
    return {
        "path": h.path,
        "n_tensors": len(h.tensors),
        "n_bytes": h.tensor_bytes,
        "file_bytes": h.file_bytes,
        "projector_type": md.get("clip.projector_type"),
        "types": dict(Counter(t.ggml_type for t in h.tensors)),
    }


def _sibling_mmproj(path: Path) -> Path | None:
    found = sorted(q for q in path.parent.glob("*.gguf") if "mmproj" in q.name.lower() and q != path)
    return found[0] if len(found) == 1 else None


# --- the model ---------------------------------------------------------------------------------
MAX_DECLARED_LAYERS = 4096  # a header without blk.* tensors (a vocab-only file) may not declare more blocks


def model_from_gguf(path: str | os.PathLike, *, mmproj: str | os.PathLike | None = None) -> ModelSpec:
    """ModelSpec of a GGUF model, with the file's real tensor table (all parts of a split model).

    The architecture comes from the metadata (``<arch>.block_count``, ``embedding_length``...);
    the optional parts (biases, norms, tied output, MoE layout) from the tensors present.
    ``mmproj``: a vision projector file to report with it (default: the only ``*mmproj*.gguf``
    beside the model, if there is exactly one).
    """
    parts = split_parts(path)
    headers = [read_gguf_header(q) for q in parts]
    first = headers[0]
    md = first.metadata
    arch = md.get("general.architecture")
    if arch == "clip":
        raise NotSupportedError(
            f"{first.path} is a vision projector (mmproj, general.architecture 'clip'), not a language model; "
            "pass the model's own GGUF (its projector is reported beside it)"
        )
    if not isinstance(arch, str):
        raise FileFormatError(f"{first.path}: GGUF metadata has no general.architecture string")
    if arch not in ARCHITECTURES:
        raise NotSupportedError(f"{first.path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    n_split = md.get("split.count")
    if isinstance(n_split, int) and n_split != len(parts):
        raise FileFormatError(f"{first.path}: metadata split.count is {n_split} but {len(parts)} part file(s) were found")

    all_tensors = [t for h in headers for t in h.tensors]
    seen: set[str] = set()
    for t in all_tensors:
        if t.name in seen:
            raise FileFormatError(f"{path}: tensor {t.name!r} appears in more than one split part")
        seen.add(t.name)
    lm = tuple(t for t in all_tensors if not _is_vision(t.name))
    vision = tuple(t for t in all_tensors if _is_vision(t.name))

    label = md.get("general.name") if isinstance(md.get("general.name"), str) else None
    label = label or Path(parts[0]).name.removesuffix(".gguf")
    kw = _hparams(arch, md, {t.name: t for t in lm}, label, str(first.path))

    ftype = md.get("general.file_type")
    tokens = md.get("tokenizer.ggml.tokens")
    template = md.get("tokenizer.chat_template")
    extra: dict[str, Any] = {
        "gguf_version": first.version,
        "general_name": md.get("general.name"),
        "file_type_id": ftype,
        "n_ctx_train": kw["n_ctx_train"],
        "chat_template": template is not None,
        "chat_template_chars": len(template) if isinstance(template, str) else template if isinstance(template, int) else 0,
        "tokenizer_model": md.get("tokenizer.ggml.model"),
        "n_vocab_tokens": tokens.count if isinstance(tokens, GGUFArray) else None,
        "quantization_version": md.get("general.quantization_version"),
        "imatrix": {k.removeprefix("quantize.imatrix."): v for k, v in md.items() if k.startswith("quantize.imatrix.")} or None,
        "split_files": [str(q) for q in parts],
        "file_bytes": sum(h.file_bytes for h in headers),
        "tensor_bytes": sum(t.n_bytes for t in lm),
        "tensor_types": dict(Counter(t.ggml_type for t in lm)),
        "metadata": {k: v for k, v in md.items() if not isinstance(v, GGUFArray) or v.values is not None},
    }
    if vision:
        extra["vision_tensors"] = vision
        extra["vision_bytes"] = sum(t.n_bytes for t in vision)
    if mmproj is not None:
        extra["mmproj"] = _projector_summary(read_gguf_header(mmproj))
    elif (found := _sibling_mmproj(Path(parts[0]))) is not None:
        try:  # a projector found beside the model is only reported: a bad one must not hide the model
            extra["mmproj"] = _projector_summary(read_gguf_header(found))
        except FileFormatError as exc:
            extra["mmproj_error"] = str(exc)
    try:
        return ModelSpec(**kw, tensors=lm, file_type=_preset_of_ftype(ftype), extra=extra)
    except ConfigError as exc:
        raise ConfigError(f"{first.path}: the GGUF metadata describes an impossible model: {exc}") from None


def _preset_of_ftype(ftype: Any) -> str | None:
    """general.file_type (enum llama_ftype) -> the llama-quantize preset name (models.ggml_types.file_type_names)."""
    if isinstance(ftype, bool) or not isinstance(ftype, int):
        return None
    return file_type_names().get(ftype) if isinstance(ftype, int) else None


def _hparams(arch: str, md: dict[str, Any], tensors: dict[str, TensorInfo], label: str, path: str) -> dict[str, Any]:
    """ModelSpec keyword arguments from ``<arch>.*`` metadata and the tensor table."""

    def get(key: str, default: Any = None) -> Any:
        v = md.get(f"{arch}.{key}", default)
        if isinstance(v, GGUFArray):  # per-layer values (head counts, FFN sizes): must agree to fit a ModelSpec
            vals = {x for x in (v.values or ()) if x}
            if len(vals) > 1:
                raise NotSupportedError(f"{path}: per-layer {arch}.{key} values differ ({sorted(vals)}); inferlab needs one value")
            v = vals.pop() if vals else default
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise FileFormatError(f"{path}: metadata {arch}.{key} must be a non-negative integer, got {v!r}")
        return v

    def req(key: str) -> int:
        v = get(key)
        if not v:
            raise FileFormatError(f"{path}: GGUF metadata lacks {arch}.{key}, needed for a {arch} model")
        return v

    def shape(name: str, dim: int) -> int | None:
        t = tensors.get(name)
        return t.shape[dim] if t is not None and len(t.shape) > dim else None

    def has(suffix: str) -> bool:
        return any(n.endswith(suffix) for n in tensors)

    n_layers, d_model, n_heads = req("block_count"), req("embedding_length"), req("attention.head_count")
    blocks = {int(n.split(".", 2)[1]) for n in tensors if n.startswith("blk.") and n.split(".", 2)[1].isdigit()}
    if blocks and (max(blocks) + 1 != n_layers or len(blocks) != n_layers):
        raise FileFormatError(f"{path}: {arch}.block_count says {n_layers} blocks but the tensor table holds "
                              f"{len(blocks)} (blk.{min(blocks)} .. blk.{max(blocks)})")
    if not blocks and n_layers > MAX_DECLARED_LAYERS:
        raise FileFormatError(f"{path}: {arch}.block_count {n_layers} is beyond any published model (at most {MAX_DECLARED_LAYERS})")
    n_kv = get("attention.head_count_kv") or n_heads
    head_dim = get("attention.key_length") or d_model // n_heads
    v_head_dim = get("attention.value_length")
    vocab = shape("token_embd.weight", 1) or get("vocab_size")
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = vocab or (tokens.count if isinstance(tokens, GGUFArray) else None)
    if not vocab:
        raise FileFormatError(f"{path}: no token_embd.weight tensor and no vocabulary size in the metadata")
    kw: dict[str, Any] = dict(
        name=label,
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        v_head_dim=v_head_dim if v_head_dim and v_head_dim != head_dim else None,
        d_ff=get("feed_forward_length", 0) or 0,
        vocab_size=vocab,
        n_ctx_train=get("context_length") or 4096,
        tied_embeddings="output.weight" not in tensors,
        attn_bias=has(".attn_q.bias"),
        attn_out_bias=has(".attn_output.bias"),
        qk_norm=has(".attn_q_norm.weight"),
        post_norms=has(".post_ffw_norm.weight"),
        rope_freqs="rope_freqs.weight" in tensors,
        rope_factors="rope_factors_long.weight" in tensors,
        attn_sinks=has(".attn_sinks.weight"),
        source=f"GGUF header of {path}",
    )
    # --- mixture of experts ---
    n_experts = get("expert_count", 0)
    if n_experts:
        d_ff_expert = get("expert_feed_forward_length") or shape("blk.%d.ffn_gate_exps.weight" % (n_layers - 1), 1)
        d_ff_expert = d_ff_expert or get("feed_forward_length")  # mixtral files carry only feed_forward_length
        d_ff_shared = get("expert_shared_feed_forward_length") or shape(f"blk.{n_layers - 1}.ffn_gate_shexp.weight", 1) or 0
        n_dense = get("leading_dense_block_count", 0)
        kw.update(
            n_experts=n_experts,
            n_experts_used=req("expert_used_count"),
            d_ff_expert=d_ff_expert or 0,
            n_dense_layers=n_dense,
            d_ff=kw["d_ff"] if n_dense else 0,  # the dense FFN size only matters for leading dense layers
            d_ff_shared=d_ff_shared,
            n_shared_experts=get("expert_shared_count") or (1 if d_ff_shared else 0),
            shared_expert_gate=has(".ffn_gate_inp_shexp.weight"),
            expert_bias=has(".ffn_gate_inp.bias"),
            router_bias=has(".exp_probs_b.bias"),
        )
    # --- multi-head latent attention ---
    if arch == "deepseek2":
        # since 2025 convert writes the absorbed (MQA) layout in key_length/value_length and the
        # per-head sizes in key_length_mla/value_length_mla
        qk_head = get("attention.key_length_mla") or head_dim
        v_head = get("attention.value_length_mla") or v_head_dim or qk_head
        rope = req("rope.dimension_count")
        kw.update(
            head_dim=qk_head,
            v_head_dim=v_head if v_head != qk_head else None,
            n_kv_heads=n_heads,  # MLA expands the latent into every head
            q_lora_rank=get("attention.q_lora_rank", 0),
            kv_lora_rank=req("attention.kv_lora_rank"),
            qk_rope_head_dim=rope,
            qk_nope_head_dim=qk_head - rope,
        )
        if kw.get("n_shared_experts") and not get("expert_shared_feed_forward_length"):
            kw["d_ff_shared"] = kw["n_shared_experts"] * kw["d_ff_expert"]  # shared experts are fused into one FFN
    # --- sliding-window attention ---
    window = get("attention.sliding_window")
    if window and arch in ("gemma2", "gemma3", "gpt-oss"):
        pattern = md.get(f"{arch}.attention.sliding_window_pattern")
        if isinstance(pattern, GGUFArray) and pattern.values and len(pattern.values) == n_layers:
            swa = tuple(bool(x) for x in pattern.values)
        else:
            # llama.cpp's set_swa_pattern(period): layer i is windowed unless i % period == period - 1
            period = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0 else (6 if arch == "gemma3" else 2)
            swa = tuple(i % period < period - 1 for i in range(n_layers))
        kw.update(sliding_window=window, swa_layers=swa)
    return kw

"""Hugging Face checkpoints: ``config.json`` and the headers of ``*.safetensors`` files.

A safetensors file starts with an 8-byte little-endian header length and a JSON header giving
each tensor's dtype, shape and byte range; only that header is read (standard library only), so
the exact bytes of a checkpoint (bf16, or pre-quantized: AWQ, GPTQ, FP8, compressed-tensors,
MXFP4) come without touching its data. Sharded checkpoints are found through
``model.safetensors.index.json``. Format: https://huggingface.co/docs/safetensors (the header
rules, such as the 100 MB header cap, follow safetensors/src/tensor.rs).
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FileFormatError
from .hf_config import model_from_hf_config
from .spec import ModelSpec

# safetensors Dtype -> bits per element; source: safetensors/src/tensor.rs (enum Dtype, bitsize)
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "I64": 64, "U64": 64, "F64": 64,
}
SAFETENSORS_MAX_HEADER_BYTES = 100_000_000  # safetensors refuses larger headers (MAX_HEADER_SIZE)
CONFIG_MAX_BYTES = 16 * 2**20  # a config.json is a few KB; refuse to parse anything huge
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class SafetensorsTensor:
    name: str  # the checkpoint's own name, e.g. "model.layers.0.self_attn.q_proj.weight"
    dtype: str  # safetensors dtype, e.g. "BF16", "I32" (packed int4), "F8_E4M3"
    shape: tuple[int, ...]  # PyTorch order (outermost first)
    n_bytes: int
    file: str  # the file holding it (its name)


@dataclass(frozen=True)
class SafetensorsCheckpoint:
    """The tensors of a (possibly sharded) checkpoint, from headers only."""

    files: tuple[str, ...]
    tensors: tuple[SafetensorsTensor, ...] = field(repr=False)
    metadata: dict = field(default_factory=dict, repr=False)
    missing_files: tuple[str, ...] = ()  # shards named by the index but absent (a partial download)
    index_total_bytes: int | None = None  # the index's metadata.total_size, when given

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data: the headers' sum, or the index's total when shards are missing."""
        if self.missing_files and self.index_total_bytes:
            return self.index_total_bytes
        return sum(t.n_bytes for t in self.tensors)

    @property
    def bytes_by_dtype(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for t in self.tensors:
            out[t.dtype] += t.n_bytes
        return dict(out)

    @property
    def complete(self) -> bool:
        return not self.missing_files


# --- one file ------------------------------------------------------------------------------------
def read_safetensors_header(path: str | os.PathLike) -> tuple[tuple[SafetensorsTensor, ...], dict[str, str]]:
    """The tensors and __metadata__ of one .safetensors file; FileFormatError if malformed."""
    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():
        raise FileFormatError(f"{p}: not a regular file (a safetensors checkpoint is a file)")
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            if size < 8:
                raise FileFormatError(f"{p}: not a safetensors file: {size} bytes is shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise FileFormatError(f"{p}: safetensors header length {n} is larger than the rest of the {size}-byte file")
            if n > SAFETENSORS_MAX_HEADER_BYTES:
                raise FileFormatError(f"{p}: safetensors header of {n} bytes exceeds the format's {SAFETENSORS_MAX_HEADER_BYTES}-byte limit")
            raw = f.read(n)
    except FileNotFoundError:
        raise FileFormatError(f"{p}: no such safetensors file") from None
    except IsADirectoryError:
        raise FileFormatError(f"{p}: is a directory, not a safetensors file") from None
    except OSError as exc:
        raise FileFormatError(f"{p}: cannot read safetensors file: {exc.strerror or exc}") from None
    if not raw.lstrip(b" ").startswith(b"{"):
        raise FileFormatError(f"{p}: safetensors header does not start with a JSON object: {raw[:20]!r}")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FileFormatError(f"{p}: safetensors header is not valid JSON: {exc}") from None
    except RecursionError:
        raise FileFormatError(f"{p}: safetensors header is nested too deeply (JSON inside JSON thousands deep)") from None
    if not isinstance(header, dict):
        raise FileFormatError(f"{p}: safetensors header must be a JSON object, got {type(header).__name__}")
    data_bytes = size - 8 - n
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise FileFormatError(f"{p}: safetensors __metadata__ must be an object of strings, got {type(metadata).__name__}")
    tensors = [_tensor(p, name, entry, data_bytes) for name, entry in header.items()]
    tensors.sort(key=lambda t: _begin(header[t.name]))
    return tuple(tensors), {str(k): v for k, v in metadata.items()}


def _begin(entry: dict) -> int:
    return entry["data_offsets"][0]


def _tensor(p: Path, name: str, entry: Any, data_bytes: int) -> SafetensorsTensor:
    if not isinstance(entry, dict):
        raise FileFormatError(f"{p}: tensor {name!r}: header entry must be an object, got {type(entry).__name__}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPE_BITS:
        raise FileFormatError(f"{p}: tensor {name!r} has unknown dtype {dtype!r}; valid: {', '.join(SAFETENSORS_DTYPE_BITS)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise FileFormatError(f"{p}: tensor {name!r}: shape must be a list of non-negative integers, got {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
        raise FileFormatError(f"{p}: tensor {name!r}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
    n_elements = 1
    for d in shape:
        n_elements *= d
    bits = n_elements * SAFETENSORS_DTYPE_BITS[dtype]
    if bits % 8:
        raise FileFormatError(f"{p}: tensor {name!r}: {n_elements} {dtype} elements do not fill whole bytes")
    n_bytes = bits // 8
    if offsets[1] - offsets[0] != n_bytes:
        raise FileFormatError(
            f"{p}: tensor {name!r}: data_offsets {offsets} span {offsets[1] - offsets[0]} bytes but {dtype} {shape} needs {n_bytes}"
        )
    if offsets[1] > data_bytes:
        raise FileFormatError(f"{p}: tensor {name!r} ends at byte {offsets[1]} of the data, past the file's {data_bytes} data bytes")
    return SafetensorsTensor(name, dtype, tuple(shape), n_bytes, p.name)


# --- a checkpoint folder -------------------------------------------------------------------------
def read_checkpoint(folder: str | os.PathLike) -> SafetensorsCheckpoint | None:
    """All safetensors of a folder (through its index when sharded); None if it has none."""
    d = Path(folder)
    index_path = d / INDEX_NAME
    if index_path.is_file():
        index = _read_json(index_path, "safetensors index", FileFormatError)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise FileFormatError(f"{index_path}: 'weight_map' must be an object of tensor name -> file name")
        files = sorted(set(weight_map.values()))
        for f in files:
            if Path(f).name != f:
                raise FileFormatError(f"{index_path}: shard name {f!r} must be a plain file name in the same folder")
        total = (index.get("metadata") or {}).get("total_size") if isinstance(index.get("metadata"), dict) else None
        total = total if isinstance(total, int) and not isinstance(total, bool) and total >= 0 else None
    else:
        files = sorted(p.name for p in d.glob("*.safetensors"))
        if any(not f.startswith("consolidated") for f in files):  # mistral repos hold both layouts
            files = [f for f in files if not f.startswith("consolidated")]
        total = None
    if not files:
        return None
    present = [f for f in files if (d / f).is_file()]
    missing = tuple(f for f in files if f not in present)
    tensors: list[SafetensorsTensor] = []
    metadata: dict = {}
    for f in present:
        ts, md = read_safetensors_header(d / f)
        tensors.extend(ts)
        metadata.update(md)
    names = Counter(t.name for t in tensors)
    dup = [n for n, c in names.items() if c > 1]
    if dup:
        raise FileFormatError(f"{d}: tensor {dup[0]!r} appears in more than one safetensors file")
    return SafetensorsCheckpoint(tuple(files), tuple(tensors), metadata, missing, total)


def _read_json(path: Path, what: str, error: type) -> dict:
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise error(f"{path}: {what} is not a regular file")
    try:
        size = path.stat().st_size
        if size > CONFIG_MAX_BYTES:
            raise error(f"{path}: {what} of {size} bytes is implausibly large (limit {CONFIG_MAX_BYTES})")
        text = path.read_bytes().decode("utf-8")
        data = json.loads(text)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"{path}: {what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{path}: {what} is nested too deeply to be a config (JSON arrays or objects inside each other thousands deep)") from None
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


def read_hf_config(path: str | os.PathLike) -> dict:
    """Parse a config.json; ConfigError with the reason if it is not a JSON object."""
    return _read_json(Path(path), "config.json", ConfigError)


# --- pre-quantized checkpoints -------------------------------------------------------------------
def quantization_summary(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """What config.json's quantization_config says: method, bits, group size, format, a label."""
    qc = config.get("quantization_config")
    if qc is None and isinstance(config.get("text_config"), Mapping):
        qc = config["text_config"].get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise ConfigError(f"quantization_config must be an object, got {type(qc).__name__}")
    method = str(qc.get("quant_method", "unknown")).lower()
    bits, group = qc.get("bits"), qc.get("group_size")
    fmt = qc.get("format") or qc.get("fmt") or qc.get("version")
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        weights = next((g.get("weights") for g in groups.values() if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping)), None)
        if weights:
            bits, group = weights.get("num_bits"), weights.get("group_size")
            fmt = f"{qc.get('format', '')} {weights.get('type', '')}".strip()
    elif method == "fp8":
        bits, group = 8, qc.get("weight_block_size")
    elif method == "mxfp4":
        bits, group = 4, 32  # OCP MX: 32 FP4 (E2M1) weights share one E8M0 scale
    elif method == "bitsandbytes":
        bits = 4 if qc.get("load_in_4bit") else 8 if qc.get("load_in_8bit") else bits
        fmt = qc.get("bnb_4bit_quant_type") or fmt
    label = method.upper() if method in ("awq", "gptq", "fp8", "mxfp4") else method
    if bits:
        label += f" {bits}-bit"
    if isinstance(group, int) and group > 0:
        label += f" g{group}"
    elif isinstance(group, list):
        label += " block " + "x".join(str(g) for g in group)
    return {"method": method, "bits": bits, "group_size": group, "format": fmt, "label": label}


# --- the model -----------------------------------------------------------------------------------
def model_from_hf_folder(path: str | os.PathLike, *, name: str | None = None, hf_id: str = "") -> ModelSpec:
    """ModelSpec of a Hugging Face model folder (or its config.json), with its checkpoint's real
    bytes in ``extra`` when safetensors files are present: "checkpoint" (SafetensorsCheckpoint),
    "checkpoint_bytes", "checkpoint_dtypes" (bytes per dtype) and "quantization"."""
    p = Path(path)
    config_path = p if p.is_file() else p / "config.json"
    folder = config_path.parent
    if not config_path.is_file():
        raise ConfigError(f"{folder}: no config.json (a Hugging Face model folder needs one)")
    config = read_hf_config(config_path)
    if hf_id:
        config = {**config, "_name_or_path": hf_id}
    label = name or hf_id or config.get("_name_or_path") or folder.name
    try:
        spec = model_from_hf_config(config, name=str(label), source=f"config.json of {folder}")
    except ConfigError as exc:  # say which file
        raise ConfigError(f"{config_path}: {exc}") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:  # a field of the wrong JSON type
        raise ConfigError(f"{config_path}: malformed config ({type(exc).__name__}: {exc}); is a field of the wrong type?") from None
    checkpoint = read_checkpoint(folder)
    try:
        quantization = quantization_summary(config)
    except ConfigError as exc:
        raise ConfigError(f"{config_path}: {exc}") from None
    extra: dict[str, Any] = {"config_path": str(config_path), "quantization": quantization}
    if checkpoint is not None:
        extra.update(
            checkpoint=checkpoint,
            checkpoint_bytes=checkpoint.total_bytes,
            checkpoint_dtypes=checkpoint.bytes_by_dtype,
            checkpoint_complete=checkpoint.complete,
        )
    spec.extra.update(extra)
    return spec

"""The vocabulary model files are written in: GGML tensor types as data (block layout, hence bits
per weight and the bytes of a row) and llama.cpp's file types (``general.file_type``).

Sources: data/ggml_types.json (from llama.cpp's ggml-common.h block structs and ggml.c type_traits)
and the file type ids of data/quant_presets.json (llama.h, enum llama_ftype). The readers (this
package) and the quantization rules (``quant/``, which re-exports these) share them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from ..errors import UnknownNameError


@dataclass(frozen=True)
class GGMLType:
    name: str  # e.g. "Q4_K"
    type_id: int  # enum ggml_type
    block_size: int  # weights per block
    type_size: int  # bytes per block
    layout: str = ""

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.type_size / self.block_size  # bits of one block spread over its weights

    def row_bytes(self, n: int) -> int:
        """Bytes of n consecutive weights (n must be a multiple of the block size, as in ggml_row_size)."""
        return n // self.block_size * self.type_size

    def tensor_bytes(self, shape: tuple[int, ...]) -> int:
        rows = 1
        for d in shape[1:]:
            rows *= d
        return self.row_bytes(shape[0]) * rows


@cache
def ggml_types() -> dict[str, GGMLType]:
    data = json.loads(resources.files("inferlab.data").joinpath("ggml_types.json").read_text())
    return {
        t["type"]: GGMLType(t["type"], t["ggml_type_id"], t["weights_per_block"], t["bytes_per_block"], t.get("layout", ""))
        for t in data["ggml_types"]
    }


@cache
def ggml_types_by_id() -> dict[int, GGMLType]:
    return {t.type_id: t for t in ggml_types().values()}


def ggml_type(name: str) -> GGMLType:
    """Look a type up by name, case-insensitively ("q4_k" -> Q4_K)."""
    table = ggml_types()
    t = table.get(name) or (table.get(name.upper()) if isinstance(name, str) else None)
    if t is None:
        raise UnknownNameError("GGML type", name, table)
    return t


@cache
def file_type_names() -> dict[int, str]:
    """llama_ftype id -> the llama-quantize preset name it denotes (general.file_type of a GGUF)."""
    data = json.loads(resources.files("inferlab.data").joinpath("quant_presets.json").read_text())
    return {p["ftype_id"]: p["name"] for p in data["presets"]}

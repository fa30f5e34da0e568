"""What every answer of the service layer shares: frozen reports, strict JSON, provenance.

A report is a frozen dataclass. ``to_dict()`` turns it (and every report, tuple and mapping inside
it) into plain JSON values: keys carry their units (``_bytes``, ``_s``, ``_tok_per_s``), a float that
is not finite becomes ``None`` (strict JSON has no NaN or Infinity), and the top level says which
schema it follows (``schema_version``) and what it is (``kind``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1

# Where a figure came from; every number a user sees carries one of these.
ORIGINS = (
    "catalog",  # a vendor or publisher figure kept in inferlab's data, with its source
    "file",  # read from the user's model file (GGUF header, config.json, safetensors header)
    "calibrated",  # measured on this machine by `inferlab calibrate`, with its date
    "measured",  # measured during this run
    "estimated",  # computed by a named model (the speed model, the placement rules)
    "assumed",  # a default inferlab chose where nothing better is known; said out loud
)


@dataclass(frozen=True)
class Figure:
    """One input figure and where it came from."""

    name: str  # "RTX 4090 memory bandwidth"
    value: float | int | str | None
    unit: str  # "GB/s", "bytes", "" for a count or a name
    origin: str  # one of ORIGINS
    source: str = ""  # the catalog entry's source, the file's path, the profile and its date, the model's name


def plain(obj: Any) -> Any:
    """Plain JSON values of a report: dataclasses become dicts, tuples lists, non-finite floats None."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [plain(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


@dataclass(frozen=True)
class Report:
    """Base of the service layer's answers."""

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": type(self).__name__, **plain(self)}

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON (allow_nan=False: a NaN that slipped through fails here, not in a client)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

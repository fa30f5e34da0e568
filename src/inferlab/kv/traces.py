"""Loaders for real request traces and arrival processes.

* Mooncake (FAST'25) JSONL: ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``;
  ``hash_ids`` name the prompt's 512-token blocks, chained like a prefix. Block ``h`` expands to
  the ids ``h * 512 + i`` (the traces README's rule), the last block cut to ``input_length``, so
  two requests repeating a hash list get identical prompts. Prompts stay lazy (RunTokens).
* Azure LLM inference 2023 CSV: ``TIMESTAMP, ContextTokens, GeneratedTokens``; no prefix
  information, so every prompt gets fresh ids (nothing is shared).
* Arrivals: from the trace, a Poisson process at a rate, or all at once (:func:`retime`).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from ..errors import FileFormatError, InvalidValueError, UnknownNameError
from .simulator import Request
from .tokens import RunTokens

MOONCAKE_BLOCK_TOKENS = 512
ARRIVAL_MODES = ("trace", "poisson", "at-once")
_AZURE_ID_BASE = 1 << 40  # Azure prompts: fresh ids, far from Mooncake's


def _mooncake_request(line_no: int, d: object, path: str, block_tokens: int) -> Request:
    where = f"{path}:{line_no}"
    if not isinstance(d, dict):
        raise FileFormatError(f"{where}: expected a JSON object, got {type(d).__name__}")
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in d]
    if missing:
        raise FileFormatError(f"{where}: missing field(s) {', '.join(missing)}")
    ts, n_in, n_out, hashes = d["timestamp"], d["input_length"], d["output_length"], d["hash_ids"]
    for name, v in (("input_length", n_in), ("output_length", n_out)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FileFormatError(f"{where}: {name} must be an integer >= 1, got {v!r}")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise FileFormatError(f"{where}: timestamp must be a number of milliseconds >= 0, got {ts!r}")
    if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                               for h in hashes):
        raise FileFormatError(f"{where}: hash_ids must be a list of integers >= 0")
    want = -(-n_in // block_tokens)
    if len(hashes) != want:
        raise FileFormatError(f"{where}: {len(hashes)} hash_ids for input_length {n_in}; expected "
                              f"ceil({n_in}/{block_tokens}) = {want}")
    last = n_in - block_tokens * (want - 1)
    runs = [(h * block_tokens, block_tokens) for h in hashes[:-1]]
    runs.append((hashes[-1] * block_tokens, last))
    return Request(line_no - 1, ts / 1000.0, RunTokens(runs), n_out)


def load_mooncake(path: str | Path, *, limit: int | None = None,
                  block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[Request]:
    """Requests of a Mooncake JSONL trace (ids = line index from 0), arrivals from ``timestamp``."""
    from ..fileio import text_lines

    path = Path(path)
    out: list[Request] = []
    for line_no, line in text_lines(path, what="a trace"):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FileFormatError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise FileFormatError(f"{path}:{line_no}: JSON nested too deeply") from None
        out.append(_mooncake_request(line_no, d, str(path), block_tokens))
    if not out:
        raise FileFormatError(f"{path}: no requests")
    _check_sorted(out, str(path))
    return out


def _parse_azure_time(s: str) -> datetime:
    # "2023-11-16 18:15:46.6805900": seven fractional digits, more than fromisoformat takes
    head, _, frac = s.strip().partition(".")
    t = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    return t.replace(microsecond=int((frac + "000000")[:6])) if frac else t


def load_azure(path: str | Path, *, limit: int | None = None) -> list[Request]:
    """Requests of an Azure LLM inference CSV; arrivals relative to the first timestamp."""
    from ..fileio import text_lines

    path = Path(path)
    out: list[Request] = []
    next_id = _AZURE_ID_BASE
    t0 = None
    # rows from a regular UTF-8 file only (a FIFO or a device would never end)
    reader = csv.DictReader(line for _, line in text_lines(path, what="a trace"))
    need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    if reader.fieldnames is None or not need <= set(reader.fieldnames):
        raise FileFormatError(f"{path}: expected columns {sorted(need)}, found {reader.fieldnames}")
    for row_no, row in enumerate(reader, 2):
        if limit is not None and len(out) >= limit:
            break
        try:
            t = _parse_azure_time(row["TIMESTAMP"])
            n_in, n_out = int(row["ContextTokens"]), int(row["GeneratedTokens"])
        except (ValueError, TypeError) as exc:
            raise FileFormatError(f"{path}:{row_no}: malformed row {row!r} ({exc})") from None
        if n_in < 1 or n_out < 1:
            raise FileFormatError(f"{path}:{row_no}: token counts must be >= 1, got {n_in}, {n_out}")
        t0 = t if t0 is None else t0
        if out and (t - t0).total_seconds() < out[-1].arrival_s:
            raise FileFormatError(f"{path}:{row_no}: {row['TIMESTAMP'].strip()} is earlier than the row before it; "
                                  "traces must be sorted by time")
        out.append(Request(row_no - 2, (t - t0).total_seconds(), RunTokens([(next_id, n_in)]), n_out))
        next_id += n_in
    if not out:
        raise FileFormatError(f"{path}: no requests")
    _check_sorted(out, str(path))
    return out


def _check_sorted(reqs: Sequence[Request], where: str) -> None:
    for a, b in zip(reqs, reqs[1:]):
        if b.arrival_s < a.arrival_s:
            raise FileFormatError(f"{where}: request {b.id} arrives at {b.arrival_s} s, before request "
                                  f"{a.id} at {a.arrival_s} s; traces must be sorted by time")


def load_trace(path: str | Path, *, limit: int | None = None) -> list[Request]:
    """Mooncake (.jsonl) or Azure (.csv), by extension."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return load_mooncake(path, limit=limit)
    if suffix == ".csv":
        return load_azure(path, limit=limit)
    raise UnknownNameError("trace format (file extension)", suffix, [".jsonl", ".csv"])


def retime(requests: Sequence[Request], mode: str = "trace", *, rate: float | None = None,
           seed: int = 0) -> list[Request]:
    """Arrivals from the trace, from a Poisson process at ``rate`` requests/s, or all at 0."""
    if mode not in ARRIVAL_MODES:
        raise UnknownNameError("arrival mode", mode, ARRIVAL_MODES)
    if mode == "trace":
        return list(requests)
    if mode == "at-once":
        return [Request(r.id, 0.0, r.prompt, r.max_new_tokens, r.output) for r in requests]
    if rate is None or isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise InvalidValueError(f"a Poisson arrival process needs a finite rate > 0 (requests/s), got {rate!r}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for r in requests:
        out.append(Request(r.id, t, r.prompt, r.max_new_tokens, r.output))
        t += rng.expovariate(rate)
    return out


def repeated_block_fraction(requests: Sequence[Request], block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> float:
    """Share of Mooncake prompt blocks seen before (the unbounded-cache upper bound: 36.6%)."""
    seen: set[int] = set()
    rep = total = 0
    for r in requests:
        for h in _hash_ids(r, block_tokens):
            total += 1
            if h in seen:
                rep += 1
            seen.add(h)
    return rep / total if total else 0.0


def _hash_ids(r: Request, block_tokens: int) -> list[int]:
    """The block hash ids of a Mooncake-derived prompt (each block starts at h * block_tokens)."""
    n = len(r.prompt)
    return [r.prompt[i] // block_tokens for i in range(0, n, block_tokens)]


def prefix_hit_upper_bound(requests: Sequence[Request], block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> float:
    """Share of Mooncake prompt tokens an unbounded token-granular cache could reuse.

    A request reuses its longest prefix shared with any earlier prompt, minus its last token
    (always computed). Hash ids name whole prefixes, so the shared prefix is the run of leading
    blocks seen before, extended into the first block that an earlier prompt held only in part.
    """
    seen: dict[int, int] = {}  # hash id -> longest part of its block seen so far
    reusable = total = 0
    for r in requests:
        n = len(r.prompt)
        hashes = _hash_ids(r, block_tokens)
        hit = 0
        for i, h in enumerate(hashes):
            size = min(block_tokens, n - i * block_tokens)
            have = seen.get(h, 0)
            hit += min(size, have)
            if have < size:
                break
        reusable += min(hit, n - 1)
        total += n
        for i, h in enumerate(hashes):
            size = min(block_tokens, n - i * block_tokens)
            if seen.get(h, 0) < size:
                seen[h] = size
    return reusable / total if total else 0.0

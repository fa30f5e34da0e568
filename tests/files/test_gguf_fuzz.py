"""Malformed GGUF files: more than a thousand mutated and truncated copies of a valid file, each
of which must either still read as a valid model or raise a typed inferlab error with a clear
message, quickly and without a large allocation. Field positions come from the gguf package's
GGUFReader, not from the parser under test."""

from __future__ import annotations

import random
import struct
import time
import tracemalloc

import pytest

from inferlab.errors import FileFormatError, InferlabError
from inferlab.models.gguf_reader import model_from_gguf

gguf = pytest.importorskip("gguf")

U64_HUGE = (2**64 - 1, 2**63, 2**63 - 1, 2**40, 10**12, 2**32 + 7)  # the first two read as negative int64
PEAK_BYTES_LIMIT = 4 * 2**20  # a header of ~100 KB must never need more than this
TIME_LIMIT_S = 1.0  # CPU seconds per file: a loop over a huge count would blow far past it


@pytest.fixture(scope="module")
def base(kit, tmp_path_factory):
    """A valid small llama GGUF (with an explicit general.alignment) and where its fields lie."""
    from inferlab.models.spec import ModelSpec

    spec = ModelSpec(name="fuzz", arch="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16,
                     d_ff=128, vocab_size=64, n_ctx_train=512)
    T = gguf.GGUFValueType
    path = kit.write_spec_gguf(spec, tmp_path_factory.mktemp("fuzz") / "base.gguf",
                               metadata={"general.alignment": (32, T.UINT32)})
    data = path.read_bytes()
    r = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensor_fields = [t.field for t in r.tensors]
    header_end = max(f.offset + sum(p.nbytes for p in f.parts) for f in tensor_fields)
    return path, data, fields, tensor_fields, header_end


def _pos(field, n_parts: int) -> int:
    """Byte position of part n_parts of a GGUFReader field (the sum of the parts before it)."""
    return field.offset + sum(p.nbytes for p in field.parts[:n_parts])


def _put(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into("<" + fmt, b, pos, value)
    return bytes(b)


def _targeted(base, rng: random.Random) -> list[tuple[str, bytes, str]]:
    """(what, bytes, a fragment the error message must contain)."""
    _, data, fields, tfields, _ = base
    cases: list[tuple[str, bytes, str]] = []
    for m in (b"GGUL", b"\x00\x00\x00\x00", b"ggml", b"GGJT", b"FUGG"):
        cases.append((f"magic {m!r}", m + data[4:], "not a GGUF file"))
    for v in (0, 1, 4, 5, 99, 2**31, 2**32 - 1):
        cases.append((f"version {v}", _put(data, 4, "I", v), "version"))
    for n in U64_HUGE:
        cases.append((f"tensor count {n}", _put(data, 8, "Q", n), "tensor count"))
        cases.append((f"metadata count {n}", _put(data, 16, "Q", n), "metadata count"))
    # tensor count a little too large: the parser runs into the data region and finds nonsense
    for extra in (1, 2, 5):
        cases.append((f"tensor count +{extra}", _put(data, 8, "Q", len(tfields) + extra), ""))
    for key, f in fields.items():
        for n in (len(data), len(data) * 4, *U64_HUGE):
            cases.append((f"key length of {key} = {n}", _put(data, f.offset, "Q", n), "bytes"))
        vtype = f.types[0]
        vt_pos = _pos(f, 2)
        for t in (13, 14, 255, 2**31, 2**32 - 1):
            cases.append((f"value type of {key} = {t}", _put(data, vt_pos, "I", t), "unknown value type"))
        if vtype == gguf.GGUFValueType.STRING:
            for n in (len(data), len(data) + 1, *U64_HUGE):
                cases.append((f"string length of {key} = {n}", _put(data, _pos(f, 3), "Q", n), "bytes"))
        if vtype == gguf.GGUFValueType.ARRAY:
            for n in (len(data), *U64_HUGE):
                cases.append((f"array length of {key} = {n}", _put(data, _pos(f, 4), "Q", n), "array"))
            for t in (9, 13, 2**32 - 1):
                cases.append((f"array element type of {key} = {t}", _put(data, _pos(f, 3), "I", t), "element type"))
    align = fields["general.alignment"]
    for a in (0, 3, 48, 100, 2**31 + 1):
        cases.append((f"alignment {a}", _put(data, _pos(align, 3), "I", a), "alignment"))
    for f in rng.sample(tfields, 8):
        name = bytes(f.parts[1]).decode()
        for n in (len(data), *U64_HUGE[:3]):
            cases.append((f"name length of {name} = {n}", _put(data, f.offset, "Q", n), "bytes"))
        for d in (0, 5, 2**31, 2**32 - 1):
            cases.append((f"n_dims of {name} = {d}", _put(data, _pos(f, 2), "I", d), "dimensions"))
        for d in (0, -1, -(2**63), 2**62, 2**40):
            cases.append((f"dim 0 of {name} = {d}", _put(data, _pos(f, 3), "q", d), ""))
        type_pos = _pos(f, 4)  # parts: name length, name, n_dims, dims, type, offset
        for t in (4, 5, 31, 36, 38, 99, 2**31, 2**32 - 1):
            cases.append((f"type of {name} = {t}", _put(data, type_pos, "I", t), "ggml type id"))
        off_pos = _pos(f, 5)
        for off in (len(data), len(data) * 1024, 2**64 - 32, 2**63):
            cases.append((f"offset of {name} = {off}", _put(data, off_pos, "Q", off), "past the end"))
        for off in (1, 7, 33):
            cases.append((f"offset of {name} + {off}", _put(data, off_pos, "Q", int(f.parts[-1][0]) + off), "alignment"))
    return cases


def _check(tmp_path, i: int, blob: bytes, what: str) -> InferlabError | None:
    p = tmp_path / f"m{i % 8}.gguf"
    p.write_bytes(blob)
    tracemalloc.start()
    t0 = time.process_time()
    err = None
    try:
        model_from_gguf(p)
    except InferlabError as exc:
        err = exc
    except Exception as exc:  # anything else is a crash of the parser
        tracemalloc.stop()
        raise AssertionError(f"{what}: untyped {type(exc).__name__}: {exc}") from exc
    elapsed_s = time.process_time() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed_s < TIME_LIMIT_S, f"{what}: took {elapsed_s:.2f} s"
    assert peak < PEAK_BYTES_LIMIT, f"{what}: allocated {peak} bytes at peak"
    if err is not None:
        msg = str(err)
        assert str(p) in msg or "GGUF" in msg, f"{what}: message does not say which file: {msg}"
        assert len(msg) < 1000, f"{what}: message too long ({len(msg)} chars)"
    return err


@pytest.mark.slow
@pytest.mark.timeout(600)  # a hang fails the test instead of the suite
def test_fuzz_more_than_a_thousand_bad_files(base, tmp_path):
    path, data, _, _, header_end = base
    assert model_from_gguf(path).n_layers == 2  # the unmutated file is valid
    rng = random.Random(1234)
    n = 0
    # 1. targeted: each must fail with a FileFormatError naming the problem
    for what, blob, fragment in _targeted(base, rng):
        err = _check(tmp_path, n, blob, what)
        n += 1
        assert isinstance(err, FileFormatError), f"{what}: expected FileFormatError, got {err!r}"
        assert fragment in str(err), f"{what}: message lacks {fragment!r}: {err}"
    # 2. truncated anywhere (header or data): always an error, since the tensors no longer fit
    cuts = sorted(set(rng.sample(range(len(data)), 300)) | set(range(0, 64)) | {header_end, len(data) - 1})
    for cut in cuts:
        err = _check(tmp_path, n, data[:cut], f"truncated to {cut} bytes")
        n += 1
        assert isinstance(err, FileFormatError), f"truncated to {cut}: expected FileFormatError, got {err!r}"
    # 3. random bytes overwritten in the header: valid or a typed error, never a crash
    outcomes = {"ok": 0, "error": 0}
    for _ in range(500):
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(header_end)] = rng.randrange(256)
        err = _check(tmp_path, n, bytes(b), "random bytes")
        n += 1
        outcomes["error" if err else "ok"] += 1
    assert n >= 1000
    assert outcomes["error"] > 50  # the mutations do bite


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(FileFormatError, match="shorter than the 24-byte GGUF preamble"):
        model_from_gguf(empty)
    with pytest.raises(FileFormatError, match="no such GGUF file"):
        model_from_gguf(tmp_path / "absent.gguf")
    with pytest.raises(FileFormatError, match="not a regular file"):
        model_from_gguf(tmp_path)  # a directory
    import os

    os.mkfifo(tmp_path / "fifo.gguf")  # opening a FIFO for reading would block until a writer came
    with pytest.raises(FileFormatError, match="not a regular file"):
        model_from_gguf(tmp_path / "fifo.gguf")

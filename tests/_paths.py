"""Where the test data lives.

Vendored copies (tests/data/, sources and licences in tests/data/README.md) make the trace tests
run offline: ``vendored(name)`` returns a file of tests/data, unpacking ``name.xz`` once into the
temporary folder. The project's shared/ folder sits beside the repository (as CI lays it out), or at
/work/shared on a developer's machine; INFERLAB_SHARED overrides both. CONVERSATION_TRACE is the
shared Mooncake conversation trace when present, else the vendored copy (the same bytes)."""

import hashlib
import lzma
import os
import tempfile
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
_CANDIDATES = [Path(os.environ["INFERLAB_SHARED"])] if os.environ.get("INFERLAB_SHARED") else []
_CANDIDATES += [_REPO.parent / "shared", Path("/work/shared")]

SHARED = next((p for p in _CANDIDATES if (p / "traces").is_dir()), _CANDIDATES[-1])
TRACES = SHARED / "traces"
DATA = _REPO / "tests" / "data"


def vendored(name: str) -> Path:
    """tests/data/<name>, unpacked from tests/data/<name>.xz when only the compressed copy is kept."""
    plain = DATA / name
    if plain.is_file():
        return plain
    packed = DATA / f"{name}.xz"
    raw = packed.read_bytes()
    out = Path(tempfile.gettempdir()) / f"inferlab-test-data-{hashlib.sha256(raw).hexdigest()[:16]}" / name
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(f"{out.name}.{os.getpid()}.part")
        part.write_bytes(lzma.decompress(raw))
        part.replace(out)  # atomic: parallel sessions never see half a file
    return out


_SHARED_CONVERSATION = TRACES / "conversation_trace.jsonl"
CONVERSATION_TRACE = _SHARED_CONVERSATION if _SHARED_CONVERSATION.is_file() else vendored("mooncake_conversation_trace.jsonl")

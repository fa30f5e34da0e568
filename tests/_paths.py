"""Where the shared data lives: the project's shared/ folder sits beside the repository (as CI lays
it out), or at /work/shared on a developer's machine; INFERLAB_SHARED overrides both."""

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
_CANDIDATES = [Path(os.environ["INFERLAB_SHARED"])] if os.environ.get("INFERLAB_SHARED") else []
_CANDIDATES += [_REPO.parent / "shared", Path("/work/shared")]

SHARED = next((p for p in _CANDIDATES if (p / "traces").is_dir()), _CANDIDATES[-1])
TRACES = SHARED / "traces"
CONVERSATION_TRACE = TRACES / "conversation_trace.jsonl"

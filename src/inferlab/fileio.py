"""Writing files safely: outputs are checked before the work starts and written atomically.

``check_output_path`` refuses, before any long computation, a path whose folder is missing or not
writable, whose suffix is not one the writer makes, that is a folder, or that is a symlink (nothing
is followed through a pre-placed link). ``atomic_write`` writes a unique temporary file in the
target folder, flushes and fsyncs it, then renames it over the target; on any failure, Ctrl-C
included, the temporary is removed and an existing file is left as it was.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from .errors import FileFormatError, InvalidValueError

MAX_LINE_BYTES = 16 << 20  # one line of a trace or table: a real one is a few KiB


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


def open_regular(path: str | os.PathLike, *, what: str = "input") -> IO[bytes]:
    """``path`` opened for reading in binary, only if it is a regular file: a FIFO would block
    forever, a device (/dev/zero) never ends. Opened without blocking and checked on the open file
    (no window between the check and the open)."""
    p = Path(os.fspath(path)).expanduser()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InvalidValueError(f"{what} {os.fspath(path)!r} does not exist") from None
    except IsADirectoryError:
        raise InvalidValueError(f"{what} {os.fspath(path)!r} is a folder; give a file") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"
        raise InvalidValueError(f"{what} {os.fspath(path)!r} exists but is not a regular file ({kind})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def text_lines(path: str | os.PathLike, *, what: str = "input", max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of a regular UTF-8 text file; bytes that are not UTF-8 or a
    line beyond ``max_line_bytes`` are a FileFormatError naming the file and line."""
    with open_regular(path, what=what) as f:
        n = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            n += 1
            if len(raw) > max_line_bytes:
                raise FileFormatError(f"{os.fspath(path)}:{n}: a line longer than {max_line_bytes:,} bytes; "
                                      f"is this {what} a text file?")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FileFormatError(f"{os.fspath(path)}:{n}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                                      f"column {exc.start + 1}); {what} must be UTF-8") from None
            yield n, (text[1:] if n == 1 and text.startswith("\ufeff") else text)  # a byte-order mark is not data


def interruptible(fn: Callable[..., object], *args: object, poll_s: float = 0.05) -> object:
    """``fn(*args)`` in a worker thread while the main thread waits in short joins, so that Ctrl-C
    stops the command at once even while a long foreign call (llama.cpp's quantizer through ctypes)
    holds the worker: Python runs a signal handler only on the main thread, between bytecodes. The
    worker is a daemon; the process exiting ends it."""
    import threading

    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # handed to the caller below
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True, name="inferlab-foreign-call")
    t.start()
    while t.is_alive():
        t.join(poll_s)
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out.get("value")

"""The machine profile `inferlab calibrate` saves: where it lives, how it is written (atomically),
read back and named. detect reads it for `--on local`; calibrate writes it.
"""

from __future__ import annotations

import contextlib
import json
import os

from ..errors import FileFormatError

PROFILE_VERSION = 1
PROFILE_NAME = "machine_profile.json"
REJECTED_NAME = "machine_profile.rejected.json"  # a calibration refused as noisy: kept, never read by detect
MAX_PROFILE_BYTES = 16 << 20  # a profile is a few KiB


def profile_id(profile: dict) -> str:
    """A profile's name in predictions: host and date (20261201T1430Z)."""
    d = profile.get("date", "")
    return f"{profile.get('host', {}).get('name') or 'local'}@{d[:16].replace('-', '').replace(':', '')}Z"


def config_dir() -> str:
    """$XDG_CONFIG_HOME/inferlab, else ~/.config/inferlab."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "inferlab")


def profile_path() -> str:
    return os.path.join(config_dir(), PROFILE_NAME)


def rejected_profile_path() -> str:
    """Where calibrate keeps the figures of a run it refused to save (unstable or busy), so that a
    long calibration is not lost: `inferlab calibrate --accept-rejected` makes them the profile."""
    return os.path.join(config_dir(), REJECTED_NAME)


def save_profile(profile: dict, path: str | None = None) -> str:
    """Write the profile atomically: a unique temporary file in the target folder, fsync, rename;
    the temporary is removed on any failure. A folder that cannot be made or written is a
    ConfigError naming it (and $XDG_CONFIG_HOME, which chooses it)."""
    import tempfile

    from ..errors import ConfigError

    path = path or profile_path()
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".machine_profile.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise ConfigError(f"cannot write the machine profile in {folder} ({exc.strerror or exc}); "
                          "set XDG_CONFIG_HOME to a writable folder") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(profile, fh, indent=1, sort_keys=True, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write the machine profile {path} ({exc.strerror or exc})") from None
        raise
    return path


def load_profile(path: str | None = None) -> dict | None:
    """The saved profile, or None when there is none. A file that is not a regular file, not UTF-8,
    not JSON, nested too deeply or too large raises FileFormatError naming it and the fixes."""
    from ..fileio import open_regular

    path = path or profile_path()
    if not os.path.lexists(path):
        return None
    fix = "run `inferlab calibrate` again, or delete the file"
    try:
        with open_regular(path, what="machine profile") as fh:
            raw = fh.read(MAX_PROFILE_BYTES + 1)
        if len(raw) > MAX_PROFILE_BYTES:
            raise FileFormatError(f"machine profile {path} is larger than {MAX_PROFILE_BYTES >> 20} MiB; {fix}")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if isinstance(exc, FileFormatError):
            raise
        from ..errors import InvalidValueError

        if isinstance(exc, InvalidValueError):  # a FIFO or a device where the profile should be
            raise FileFormatError(f"{exc}; {fix}") from None
        why = "nested too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:160]
        raise FileFormatError(f"machine profile {path} cannot be read ({why}); {fix}") from None
    if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
        raise FileFormatError(f"machine profile {path} is not a version-{PROFILE_VERSION} profile; {fix}")
    if not isinstance(data.get("host", {}), dict):
        raise FileFormatError(f"machine profile {path}: 'host' must be a JSON object; {fix}")
    return data

"""Outputs are checked before the work and written atomically; errors of the OS are one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from inferlab.errors import InvalidValueError
from inferlab.fileio import atomic_write, check_output_path
from _robust_cli import sigint_default


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.png"
    target.write_bytes(b"old")

    def broken(f):
        f.write(b"half")
        raise KeyboardInterrupt  # Ctrl-C in the middle of a write

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, broken)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]


def test_links_folders_missing_folders_and_suffixes_are_refused(tmp_path):
    (tmp_path / "real.png").write_bytes(b"x")
    os.symlink(tmp_path / "real.png", tmp_path / "link.png")
    cases = [(tmp_path / "link.png", "symbolic link"), (tmp_path / "nope" / "a.png", "does not exist"),
             (tmp_path / "a.jpg", "must end in .png or .svg"), (tmp_path, "must end in")]
    for path, needle in cases:
        with pytest.raises(InvalidValueError, match=needle):
            check_output_path(path, (".png", ".svg"), what="--plot")
    with pytest.raises(InvalidValueError, match="symbolic link"):
        atomic_write(tmp_path / "link.png", b"y")
    assert (tmp_path / "real.png").read_bytes() == b"x"  # nothing written through the link


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=60, **kw)


def test_a_bad_plot_path_fails_before_the_simulation(tmp_path):
    t = time.monotonic()
    r = _run("simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--plot", str(tmp_path / "missing" / "t.png"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "does not exist" in r.stderr
    assert "Traceback" not in r.stderr and time.monotonic() - t < 30
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_stops_a_long_simulation_within_a_second_and_leaves_no_plot(tmp_path):
    from _paths import CONVERSATION_TRACE

    out = tmp_path / "t.png"
    p = subprocess.Popen([sys.executable, "-m", "inferlab", "simulate", "--trace", str(CONVERSATION_TRACE),
                          "--capacity-tokens", "65536", "--plot", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline and "requests" not in line:  # wait until the simulation runs (progress on stderr)
        line = p.stderr.read(64) or line
    p.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        _, err = p.communicate(timeout=10)
    finally:
        p.kill()
    assert time.monotonic() - sent < 5  # stopped promptly (one second plus interpreter shutdown on a busy machine)
    assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []

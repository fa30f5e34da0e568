"""Class 5: files. Every writer goes through a unique temporary in the target folder and leaves an
earlier output as it was on any failure; Ctrl-C stops each long command within a second. Generated
cases: each plot-writing command x (a pre-placed symlink, a folder in the way, an existing file
that a failed run must keep); SIGINT sent to simulate on the Azure trace and to profile, with an
earlier output in place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from _robust_cli import assert_bad_input, files, run_cli, sigint_default

WRITERS = {
    "simulate": ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--plot"],
    "roofline": ["roofline", "--on", "rtx4090", "--plot"],
    "decode": ["trace", "decode", "qwen2.5-0.5b", "--on", "rtx4090", "--plot"],
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("obstacle", ["symlink", "folder"])
def test_nothing_is_written_through_a_link_or_over_a_folder(tmp_path, writer, obstacle):
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"keep me")
    target = tmp_path / "out.png"
    if obstacle == "symlink":
        os.symlink(victim, target)
    else:
        target.mkdir()
    before = files(tmp_path)
    line = assert_bad_input(run_cli(*WRITERS[writer], target), folder=tmp_path, before=before)
    assert ("symbolic link" in line) if obstacle == "symlink" else ("folder" in line or "directory" in line), line
    assert victim.read_bytes() == b"keep me"


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_successful_write_replaces_the_file_and_leaves_no_temporary(tmp_path, writer):
    target = tmp_path / "out.svg"
    target.write_bytes(b"old")
    r = run_cli(*WRITERS[writer], target, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    assert files(tmp_path) == ["out.svg"] and target.read_bytes().lstrip().startswith(b"<?xml")


def _interrupt(args, ready: str, tmp_path, deadline_s=120):
    """Start `inferlab args`, wait until stderr shows `ready`, send SIGINT; (returncode, stderr, seconds to stop)."""
    p = subprocess.Popen([sys.executable, "-m", "inferlab", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    seen = ""
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline and ready not in seen:
            chunk = p.stderr.read(1)
            if not chunk:
                break
            seen += chunk
        assert ready in seen, seen[-500:]
        p.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = p.communicate(timeout=20)
        return p.returncode, seen + err, time.monotonic() - sent
    finally:
        p.kill()


def test_ctrl_c_stops_simulate_on_the_azure_trace_and_keeps_the_earlier_plot(tmp_path):
    from _paths import TRACES

    trace = TRACES / "AzureLLMInferenceTrace_code.csv"
    if not trace.exists():
        pytest.skip(f"{trace} is not here")
    out = tmp_path / "t.png"
    out.write_bytes(b"earlier plot")
    rc, err, stop_s = _interrupt(["simulate", "--trace", trace, "--capacity-tokens", "65536", "--engine", "vllm,sglang",
                                  "--plot", out], "requests", tmp_path)  # vLLM alone ends 0.5 s after its first
    # progress line (8,819 requests), which a loaded machine's reader can miss; SGLang's run follows it
    assert rc == 130 and "interrupted" in err and "Traceback" not in err, err[-500:]
    assert stop_s < 5  # a second, plus interpreter shutdown on a loaded 2-core machine
    assert out.read_bytes() == b"earlier plot" and files(tmp_path) == ["t.png"]


def test_ctrl_c_stops_profile_and_keeps_the_earlier_plot(tmp_path):
    # the case study's SmallTransformer: the same sweep loop as a GGUF, without a model load to wait for
    out = tmp_path / "p.png"
    out.write_bytes(b"earlier plot")
    rc, err, stop_s = _interrupt(["profile", "small", "--ctx", "64,512,1024,2048", "--batch", "1,4", "--no-quality",
                                  "--plot", out], "measured", tmp_path)
    assert rc == 130 and "interrupted" in err and "Traceback" not in err, err[-500:]
    assert stop_s < 5
    assert out.read_bytes() == b"earlier plot" and files(tmp_path) == ["p.png"]

"""`inferlab validate` stops on Ctrl-C while llama.cpp quantizes (a foreign call that held the main
thread: the quantizer ran on for seconds after SIGINT) and leaves no partial file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from _robust_cli import sigint_default


def _parts(folder) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".part")]


@pytest.mark.engine
def test_ctrl_c_during_quantization_stops_validate_promptly(tmp_path):
    pytest.importorskip("llama_cpp")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "inferlab", "validate", "--models", "toy-290m", "--presets", "Q8_0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=sigint_default)
    try:
        deadline = time.monotonic() + 90
        while not _parts(tmp_path) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # until llama_model_quantize has opened its output (<dst>.part)
        assert _parts(tmp_path), f"quantization never started: {p.poll()} {p.stderr.read()[-300:] if p.poll() is not None else ''}"
        p.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = p.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        p.kill()
    assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err, err[-500:]
    assert took < 5, f"stopped {took:.1f} s after SIGINT"  # polling plus interpreter shutdown on a busy machine
    assert not _parts(tmp_path)  # the partial quantized file is removed

"""`inferlab serve` as a user starts it: bound to loopback by default, serving the page and the
API from the package, stopped by Ctrl-C; a missing model file is a one-line error."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if int(p, 16) == port and state == "0A":  # TCP_LISTEN
                out.append(addr)
    return out


def test_serve_binds_to_loopback_and_serves_the_page():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inferlab.cli.main", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "inferlab serve did not listen within 30 s"
            time.sleep(0.1)
        assert _listening(port) == ["0100007F"]  # 127.0.0.1 only, not 0.0.0.0 (00000000)
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert page.status_code == 200 and "inferlab" in page.text
        assert "http://" not in page.text.replace("http://www.w3.org", "")  # nothing loaded from elsewhere
        js = httpx.get(f"http://127.0.0.1:{port}/static/app.js", timeout=10)
        assert js.status_code == 200 and "fetch(" in js.text
        assert httpx.get(f"http://127.0.0.1:{port}/api/catalog", timeout=10).json()["default_machine"] == "rtx4060ti"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode in (0, -signal.SIGINT, 130)
    assert f"http://127.0.0.1:{port}/" in proc.stdout.read()


def test_serve_names_a_missing_model_file():
    p = subprocess.run([sys.executable, "-m", "inferlab.cli.main", "serve", "/no/such/model.gguf"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "/no/such/model.gguf" in p.stderr and "does not exist" in p.stderr

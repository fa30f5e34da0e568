"""A real inferlab server on loopback (uvicorn in a thread) and a real browser (Debian's chromium
driven by Playwright), shared by the web tests. Screenshots go to tests/web/artifacts/."""

from __future__ import annotations

import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _pagekit
from _pagekit import open_page  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def toy_gguf(tmp_path_factory) -> Path:
    """A small real GGUF named on the command line (the DENSE toy of tests/_toy.py, F16)."""
    from _toy import DENSE

    from inferlab.models.gguf_writer import write_gguf

    return Path(write_gguf(DENSE, tmp_path_factory.mktemp("models") / "toy-dense.gguf", dtype="F16"))


@pytest.fixture(scope="session")
def server(toy_gguf):
    import uvicorn

    from inferlab.web.app import create_app

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app([str(toy_gguf)]), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if time.monotonic() > deadline or not t.is_alive():
            pytest.fail("the inferlab server did not start within 30 s")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(timeout=10)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: scripts/test installs it (apt-get install -y chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    p = open_page(browser, server)
    yield p
    assert p.js_errors == [], p.js_errors
    p.context.close()

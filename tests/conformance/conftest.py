"""Fixtures the llama-server conformance tests share: the built binary and a tiny GGUF per module."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llama_server import server_binary, tiny_gguf  # noqa: E402


@pytest.fixture(scope="module")
def binary():
    return server_binary()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("llama_server") / "tiny.gguf")

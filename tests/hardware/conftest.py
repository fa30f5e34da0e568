"""Every hardware test writes only under tmp dirs: the config (profile) and cache (toy GGUFs) homes."""

import pytest


@pytest.fixture(autouse=True)
def _private_homes(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))  # shared: toy models are built once per run

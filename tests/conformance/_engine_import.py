"""Importing an engine's own code for the conformance suite."""

from __future__ import annotations

import importlib
import os

import pytest


def engine_or_skip(module: str, reason: str):
    """The engine's own code; outside CI a missing wheel skips (loudly), in CI (CI=true, where
    scripts/test installs the wheels) it is an error: the acceptance test must run there."""
    if os.environ.get("CI"):
        return importlib.import_module(module)  # a missing dependency fails the run, naming the module
    return pytest.importorskip(module, reason=reason)

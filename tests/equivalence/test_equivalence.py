"""The refactorings keep behaviour: the whole catalog sweep, every preset's tensor plan and the three
engines on the Mooncake trace give the same digests as the code before the restructuring (golden.json
was written by snapshot.py on commit d2dc2b9, before the perf/ package and the service layer)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("equivalence_snapshot", HERE / "snapshot.py")
snapshot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snapshot)
GOLDEN = json.loads((HERE / "golden.json").read_text())


@pytest.mark.parametrize("part", ["sweep", "plans", "engines"])
def test_same_outputs_as_before_the_restructuring(part):
    now = {"sweep": snapshot.sweep_digests, "plans": snapshot.plan_digests, "engines": snapshot.engine_digests}[part]()
    differ = sorted(k for k in GOLDEN[part] if now.get(k) != GOLDEN[part][k])
    assert set(now) == set(GOLDEN[part]), f"{part}: groups added or lost: {set(now) ^ set(GOLDEN[part])}"
    assert not differ, f"{part}: outputs changed for {differ}"

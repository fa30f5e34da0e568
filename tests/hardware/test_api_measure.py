"""The service layer's calibrate() and validate(): typed reports over the measurements, strict JSON."""

from __future__ import annotations

import json

import pytest

from inferlab.api import CalibrationReport, calibrate, validate
from inferlab.errors import InvalidValueError, UnknownNameError


def test_calibrate_measures_and_reports_without_saving(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    seen = []
    r = calibrate(threads=(1,), repeats=2, size_mib=16, save=False, accept_noisy=True, on_step=lambda s, m, why: seen.append(s.label))
    assert isinstance(r, CalibrationReport) and r.saved_to is None and not list(tmp_path.iterdir())  # nothing written
    d = json.loads(r.to_json())
    assert d["kind"] == "CalibrationReport" and d["profile"]["version"] == 1 and d["profile_id"] == r.profile_id
    bw = d["profile"]["cpu"]["read_bandwidth_gbs"]
    assert seen and all(v["best"] >= v["median"] > 0 for v in bw.values())  # the best sustained run, never below the median


def test_bad_arguments_are_typed_errors():
    with pytest.raises(UnknownNameError, match="calibration engine"):
        calibrate(engine="vllm", save=False)
    with pytest.raises(InvalidValueError, match="llama.cpp"):
        calibrate(types=("Q4_K",), save=False)
    with pytest.raises(UnknownNameError, match="toy model"):
        validate(models=("toy-9b",))
    with pytest.raises(UnknownNameError, match="preset"):
        validate(models=("toy-125m",), presets=("Q9_K",))

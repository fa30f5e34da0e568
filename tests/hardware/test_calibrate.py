"""calibrate: its measurements well formed and in physical ranges (compared with independent
measurements in benchmarks/calibrate_agreement.py: two timings are never compared in a test); the
profile file in the user's config directory (a tmp dir here), and detect using it."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

np = pytest.importorskip("numpy")

from inferlab.cli.main import cli  # noqa: E402
from inferlab.errors import FileFormatError, InvalidValueError  # noqa: E402
from inferlab.hardware import calibrate as cal  # noqa: E402
from inferlab.hardware.detect import inspect_machine  # noqa: E402

MIB = 2**20


def test_read_bandwidth_measurement_is_well_formed_and_physical():
    # calibrate against an independent stream is a timing comparison: benchmarks/calibrate_agreement.py
    m = cal.read_bandwidth_gbs(2, 64 * MIB, repeats=3)
    assert m.unit == "GB/s" and 3 <= len(m.samples) <= 9 and min(m.samples) <= m.median <= max(m.samples)
    assert 0.1 < m.median < 5000  # a unit slip (bytes, MB, GiB x 10^3) leaves this range


def test_working_set_is_past_the_last_level_cache():
    assert cal.default_working_set_bytes(32 * MIB) >= 4 * 32 * MIB
    assert cal.default_working_set_bytes(None) >= 256 * MIB


def test_fp32_matmul_measurement_is_well_formed_and_physical():
    # calibrate against products timed independently is a timing comparison: benchmarks/calibrate_agreement.py
    m = cal.matmul_tflops("fp32", n=256, repeats=3)
    assert m.unit == "TFLOP/s" and 3 <= len(m.samples) <= 9 and min(m.samples) <= m.median <= max(m.samples)
    assert 1e-4 < m.median < 1000  # 2 n^3 FLOP per product: a factor of n or 10^3 leaves this range


def test_measurement_statistics():
    m = cal.Measurement("x", "GB/s", (10.0, 12.0, 11.0, 30.0))
    assert m.median == 11.5 and m.spread == pytest.approx(20 / 11.5)
    j = m.to_json()
    assert j["min"] == 10.0 and j["max"] == 30.0 and j["samples"] == [10.0, 12.0, 11.0, 30.0]


def test_bad_inputs_are_typed_errors():
    with pytest.raises(InvalidValueError, match="threads"):
        cal.read_bandwidth_gbs(0)
    with pytest.raises(InvalidValueError, match="fp32, bf16, int8"):
        cal.matmul_tflops("fp8")


def test_calibrate_command_saves_a_profile_in_the_config_dir_and_machine_uses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    res = CliRunner().invoke(cli, ["calibrate", "--threads", "1,2", "--repeats", "2", "--size-mib", "64", "--json"])
    assert res.exit_code == 0, res.output
    path = tmp_path / "inferlab" / "machine_profile.json"
    saved = json.loads(path.read_text())
    assert saved["version"] == cal.PROFILE_VERSION and saved["date"].startswith(time.strftime("%Y-", time.gmtime()))
    two = saved["cpu"]["read_bandwidth_gbs"]["2"]
    assert two["min"] <= two["median"] <= two["max"] and two["spread"] >= 0
    assert 2 <= len(two["samples"]) <= 6  # --repeats 2: at least 2, up to max(3 x 2, 6) until stable (repeat_until_stable)
    assert "fp32" in saved["cpu"]["matmul_tflops"]
    assert set(saved["cpu"]["matmul_tflops"]) | set(k.split(".")[-1] for k in saved["skipped"]) >= {"fp32", "bf16", "int8"}
    # the library and `inferlab machine` now take the host figures from the profile
    d = inspect_machine()
    best = max(v["median"] for v in saved["cpu"]["read_bandwidth_gbs"].values())
    assert d.machine.ram.bandwidth_gbs == best
    out = CliRunner().invoke(cli, ["machine"])
    assert out.exit_code == 0 and "calibrated" in out.output
    # nothing was written anywhere else under the config home
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["machine_profile.json"]


def test_calibrate_rejects_bad_thread_lists(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    res = CliRunner().invoke(cli, ["calibrate", "--threads", "1,zero"])
    assert res.exit_code == 2 and "--threads" in res.output and "Traceback" not in res.output


def test_a_corrupt_profile_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert cal.load_profile() is None
    (tmp_path / "inferlab").mkdir()
    (tmp_path / "inferlab" / "machine_profile.json").write_text("{not json")
    with pytest.raises(FileFormatError, match="calibrate"):
        cal.load_profile()
    res = CliRunner().invoke(cli, ["machine"])
    assert res.exit_code == 2 and "calibrate" in res.output

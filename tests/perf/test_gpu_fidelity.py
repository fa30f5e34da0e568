"""Issue 16, section 2: the calibrated model on published llama-bench rows it was NOT fitted on.

data/llama_bench_validation.json holds every row of the devices the split rule held out (a device
of the issue-16 additions whose sha1(name) is 0 mod 3, fixed before any fit and blind to the
figures). The acceptance bounds are the issue's goals, on that split: decode median <= 6 %, p90 <=
15 %, prefill median <= 12 %, and better than the lesson's method (η = 0.7, 50 % of FP16 peak) on
both. Measured when written: decode 4.6 % / 7.6 %, prefill 9.5 % (p90 22 %, the ROCm MI50 and RX
9070 XT), lesson 9.0 % / 38 % and 33 %. The p90 is the value at rank round(0.9 (n-1)) of the 14
sorted errors (benchmarks/validate_calibrated.py)."""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from importlib import resources

from inferlab.perf.calibration import CALIBRATED, dev_rows, fitted_constants, validation_rows, validation_table
from inferlab.perf.speed import BANDWIDTH_ONLY


def _abs(table, key):
    return sorted(abs(r[key]) for r in table if r[key] is not None)


def _p90(e):
    return e[round(0.9 * (len(e) - 1))]


def test_validation_devices_are_the_split_rule_and_never_in_the_fit():
    raw = json.loads(resources.files("inferlab.data").joinpath("llama_bench_dev.json").read_text())["rows"]
    val = validation_rows()
    assert len(val) >= 14
    held = {r["device"] for r in val}
    for name in held:  # the rule, recomputed here: sha1(name) mod 3 == 0
        assert int(hashlib.sha1(name.encode()).hexdigest(), 16) % 3 == 0, name
    for r in raw:
        if r.get("device_id"):  # an issue-16 addition in the dev file: the rule kept it there
            assert int(hashlib.sha1(re.sub(r" #\d+$", "", r["device"]).encode()).hexdigest(), 16) % 3 != 0, r["device"]
    assert not held & {r["device"] for r in dev_rows()}  # no held-out device among the fitted rows
    assert sum(k["n_rows"] for b, k in fitted_constants().items() if "/" not in b) == sum(r["fit"] for r in dev_rows())


def test_validation_decode_meets_the_issue_goal_and_beats_the_lesson():
    cal, les = validation_table(CALIBRATED(), validation_rows()), validation_table(BANDWIDTH_ONLY, validation_rows())
    e, el = _abs(cal, "tg_err"), _abs(les, "tg_err")
    assert len(e) == 14
    assert statistics.median(e) <= 0.06 and _p90(e) <= 0.15
    assert statistics.median(e) < statistics.median(el) and _p90(e) < _p90(el)


def test_validation_prefill_meets_the_issue_goal_and_beats_the_lesson():
    cal, les = validation_table(CALIBRATED(), validation_rows()), validation_table(BANDWIDTH_ONLY, validation_rows())
    e, el = _abs(cal, "pp_err"), _abs(les, "pp_err")
    assert statistics.median(e) <= 0.12
    assert statistics.median(e) < statistics.median(el)


def test_the_a100_hbm_row_is_no_longer_a_tail():
    # the scoreboard's A100 row (build 5143fa8): 190.9 t/s tg128, 4,850 t/s pp512. It is a dev row
    # (in-sample), but it was predicted +35 % / 4.4x before the kernel roof (κ·S) and the MMQ rate
    # (ζ·S): the A100 streams a Q4_0 7B at ~0.73 TB/s of its 2.04 TB/s; its 108 SMs at 1.41 GHz
    # issue what 3.8 GB need in ~5 ms: 3.82e9 B / (κ 0.08-0.11 B/op x 9.75e12 op/s) = 3.6-4.9 ms.
    row = next(r for r in validation_table(CALIBRATED()) if "A100" in r["device"] and r["build"] == "5143fa8")
    assert abs(row["tg_err"]) < 0.15 and abs(row["pp_err"]) < 0.25, row


def test_apple_gpus_prefill_at_their_fp32_rate_for_f16():
    # no tensor units: F16 weights go through the same ALUs; the M1/M2 F16 rows were fitted at ε of
    # the FP32 figure and land within 10 % of their published pp512 (in-sample)
    rows = [r for r in validation_table(CALIBRATED()) if r["backend"] == "metal" and r["quant"] == "F16" and r["build"] is None]
    assert len(rows) >= 10
    assert statistics.median(abs(r["pp_err"]) for r in rows) < 0.10

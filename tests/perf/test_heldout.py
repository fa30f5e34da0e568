"""The calibrated speed model on rows it was NOT fitted on: leave one device out.

CALIBRATED fits, per backend, η, a fixed cost per block and ε on every row of
data/llama_bench_dev.json, so scoring it on those rows (tests/perf/test_calibration.py) is an
in-sample regression check. Here each device (a chip with its core count; the "32GB"/"192GB"
variants of one chip count as one device) is held out in turn: the backend is refitted on the
other devices' rows with the same code (calibration._fit_backend) and the held-out device's rows
are predicted.

Tolerances, from the data itself: the file holds several submissions for one device, and they
disagree: RTX 4090 CUDA pp512 11,993 vs 14,771 t/s (23 %), A100 pp512 4,850 vs 3,444 (41 %), M2
Ultra 76-core Q4_0 pp512 differs 2x between llama.cpp builds. No model of the hardware can predict a
held-out row closer than two runs of the same card agree, so the bounds are on the median error
per backend (robust to the old builds), at the in-sample bounds where the data allows it:
  metal (20 devices, 53 rows): held-out median |error| < 8 % for tg and pp (in-sample: 3.5 / 3.8 %,
    held-out measured 3.9 / 4.1 %), and within 2 points of the in-sample median: the fit transfers;
  cuda (4 devices, 8 rows): the GeForce cards (RTX 3060/3090/4090) held out: tg within 25 % each
    (measured 2-21 %), pp within 55 % each (measured 12-51 %, against 0-21 % in-sample: prefill
    transfers poorly between CUDA cards); the A100 is predicted far too fast even in-sample (tg
    +35..+89 %, pp 4.2-6.2x as fast as published) and held out (tg +58..+132 %, pp 4.3-6.4x): a strict xfail names it, so
    the day the model gets it right the test says so;
  vulkan (2 devices, 1 row each): a one-row fit predicts the other card within 15 % (tg) and 25 % (pp)
    (measured 6-12 % and 2-21 %).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from functools import cache

import pytest

from inferlab.models.catalog import MODELS
from inferlab.perf.calibration import CALIBRATED, _fit_backend, dev_rows, llama_bench, row_machine, validation_table


def device_of(row: dict) -> str:
    return re.sub(r", \d+GB\)", ")", row["device"])  # one chip, one core count: one device


@cache
def held_out() -> tuple[dict, ...]:
    rows, base = dev_rows(), CALIBRATED()
    out = []
    for backend in sorted({r["backend"] for r in rows}):
        for dev in sorted({device_of(r) for r in rows if r["backend"] == backend}):
            train = [r for r in rows if device_of(r) != dev]
            k = _fit_backend(train, backend)
            sm = replace(base, decode_bw_eff_by_backend={**base.decode_bw_eff_by_backend, backend: k["eta"]},
                         prefill_compute_eff_by_backend={**base.prefill_compute_eff_by_backend, backend: k["eps"]},
                         layer_overhead_s={**base.layer_overhead_s, backend: k["layer_overhead_s"]})
            for r in rows:
                if r["backend"] != backend or device_of(r) != dev:
                    continue
                pred = llama_bench(MODELS["llama-2-7b"], "preset:" + r["quant"], row_machine(r), 512, r["n_gen"], sm)
                out.append({"backend": backend, "device": dev, "quant": r["quant"], "n_train": k["n_rows"],
                            "tg_err": pred["tg"] / r["tg"] - 1 if r["tg"] else None,
                            "pp_err": pred["pp"] / r["pp"] - 1 if r["pp"] else None})
    return tuple(out)


def _median(table, backend, key):
    return statistics.median(abs(r[key]) for r in table if r["backend"] == backend and r[key] is not None)


def test_every_row_is_predicted_once_by_a_fit_that_did_not_see_its_device():
    h = held_out()
    assert len(h) == len(dev_rows())
    n_rows = {b: sum(r["backend"] == b for r in dev_rows()) for b in ("cuda", "metal", "vulkan")}
    for r in h:
        own = sum(device_of(x) == r["device"] for x in dev_rows() if x["backend"] == r["backend"])
        assert r["n_train"] == n_rows[r["backend"]] - own, r  # the held-out device's rows were left out


@pytest.mark.parametrize("key", ["tg_err", "pp_err"])
def test_held_out_apple_devices_within_8_percent_and_near_the_in_sample_error(key):
    h, ins = held_out(), validation_table(CALIBRATED())
    assert _median(h, "metal", key) < 0.08
    assert _median(h, "metal", key) - _median(ins, "metal", key) < 0.02  # the fit transfers to unseen chips


def test_held_out_geforce_cards():
    rows = [r for r in held_out() if r["backend"] == "cuda" and "A100" not in r["device"]]
    assert len(rows) == 5
    for r in rows:
        assert abs(r["tg_err"]) < 0.25 and abs(r["pp_err"]) < 0.55, r


@pytest.mark.xfail(strict=True, reason="known: the calibrated model predicts the A100 4-6x too fast in prefill and "
                                       "1.6-2.3x in decode, in-sample and held out (its catalog peaks are not what llama.cpp reaches)")
def test_held_out_a100():
    rows = [r for r in held_out() if "A100" in r["device"]]
    assert len(rows) == 3
    for r in rows:
        assert abs(r["tg_err"]) < 0.25 and abs(r["pp_err"]) < 0.55, r


def test_held_out_vulkan_card_from_a_one_row_fit():
    for r in held_out():
        if r["backend"] == "vulkan":
            assert abs(r["tg_err"]) < 0.15 and abs(r["pp_err"]) < 0.25, r

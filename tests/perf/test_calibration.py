"""The calibrated model, fitted on the llama-bench dev file, scored against that same file.

IN-SAMPLE: every row scored here is a row the constants were fitted on, so these are regression
tests (the fit and its error table do not drift), not validation. The held-out check, each device
predicted by a fit that never saw it, is tests/perf/test_heldout.py."""

import statistics

from inferlab.perf.calibration import CALIBRATED, dev_rows, fitted_constants, llama_bench, validation_table
from inferlab.hardware.catalog import MACHINES
from inferlab.models.catalog import MODELS
from inferlab.perf.speed import BANDWIDTH_ONLY as LESSON


def _median_err(table, backend, key):
    return statistics.median(abs(r[key]) for r in table if r["backend"] == backend and r[key] is not None)


def test_fit_covers_the_dev_backends_with_physical_constants():
    k = fitted_constants()
    backends = {b for b in k if "/" not in b}
    assert backends == {r["backend"] for r in dev_rows()} == {"cuda", "metal", "rocm", "vulkan"}
    assert {b.split("/")[0] for b in k} == backends  # a generation's constants refine its backend's
    for b, v in k.items():
        assert 0.4 <= v["eta"] <= 0.9, b  # no kernel streams above 90 % of peak
        assert 0 <= v["layer_overhead_s"] < 1e-3, b
        # a kernel roof, where fitted, between 0.01 and 1 byte per integer op of the cores
        assert v["kappa_bytes_per_op"] is None or 0.01 <= v["kappa_bytes_per_op"] <= 1.0, b
        assert v["eps_float"] is None or 0.05 < v["eps_float"] <= 1.0, b
        assert 0.5 < v["zeta_flop_per_op"] < 20, b  # quantized matmuls: FLOP per integer op of the cores


def test_in_sample_regression_calibrated_beats_the_lesson_on_apple_and_is_close():
    # in-sample: these are the rows the fit was made on (held out: test_heldout.py)
    cal, les = validation_table(CALIBRATED()), validation_table(LESSON)
    for key in ("tg_err", "pp_err"):
        assert _median_err(cal, "metal", key) < _median_err(les, "metal", key)
    assert _median_err(cal, "metal", "tg_err") < 0.08  # 51 Apple rows: median decode error under 8 %
    assert _median_err(cal, "cuda", "tg_err") < 0.2


def test_in_sample_regression_llama_bench_shape_and_published_rtx4090():
    # in-sample: the two RTX 4090 CUDA rows of discussion #15013 are in the dev file the fit used
    r = llama_bench(MODELS["llama-2-7b"], "preset:Q4_0", MACHINES["rtx4090"])
    assert set(r) >= {"pp", "tg"}
    # published llama-bench (discussion #15013): 186-189 t/s tg128, 12-15k t/s pp512 for Llama 2 7B Q4_0
    assert 150 < r["tg"] < 230 and 8000 < r["pp"] < 18000
    # prompt processing is one to two orders of magnitude faster than generation (the lesson's pitfall 3)
    assert 10 < r["pp"] / r["tg"] < 200


def test_llama_bench_skips_a_zero_token_test_as_llama_bench_does():
    import pytest

    from inferlab.errors import InvalidValueError

    model, machine = MODELS["llama-2-7b"], MACHINES["rtx4090"]
    full = llama_bench(model, "preset:Q4_0", machine)
    tg_only = llama_bench(model, "preset:Q4_0", machine, n_prompt=0)  # llama-bench -p 0: no pp test
    pp_only = llama_bench(model, "preset:Q4_0", machine, n_gen=0)
    assert tg_only["pp"] is None and pp_only["tg"] is None
    # the decode figure depends only on n_gen's midpoint context; the prompt adds only context to the placement
    assert abs(tg_only["tg"] / full["tg"] - 1) < 0.01 and pp_only["pp"] == pytest.approx(full["pp"], rel=0.01)
    for bad in ({"n_prompt": 0, "n_gen": 0}, {"n_prompt": -1}):
        with pytest.raises(InvalidValueError):
            llama_bench(model, "preset:Q4_0", machine, **bad)

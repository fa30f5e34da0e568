"""Time models: a hand-priced one, and the one built from inferlab.perf_model."""

import pytest

from inferlab.errors import InvalidValueError, UnknownNameError
from inferlab.kv.time_model import TimeModel
from inferlab.kv_managers import PagedManager, RadixManager, Request, simulate


def test_linear_time_model_prices_each_step():
    # prefill of 100 tokens at 1000 tok/s = 0.1 s -> first token at 0.1 s; 4 decode steps of
    # 0.01 s each -> finish at 0.14 s; time per output token 0.01 s.
    tm = TimeModel.linear(prefill_tok_per_s=1000, decode_step_s=0.01)
    for m in (PagedManager(capacity_tokens=1024), RadixManager(capacity_tokens=1024)):
        rec = simulate([Request("a", 0.0, list(range(100)), 5)], m, time_model=tm).requests[0]
        assert rec.ttft_s == pytest.approx(0.1)
        assert rec.e2e_s == pytest.approx(0.14)
        assert rec.tpot_s == pytest.approx(0.01)


def test_fast_forward_agrees_under_a_time_model():
    tm = TimeModel.linear(prefill_tok_per_s=5000, decode_step_s=0.02, per_context_token_s=1e-6)
    reqs = [Request(i, 0.05 * i, list(range(7 * i, 7 * i + 40)), 30 + i) for i in range(12)]
    fast = simulate(reqs, PagedManager(capacity_tokens=2048), time_model=tm)
    slow = simulate(reqs, PagedManager(capacity_tokens=2048), time_model=tm, fast_forward=False)
    assert [r.finish_s for r in fast.requests] == pytest.approx([r.finish_s for r in slow.requests])
    assert fast.summary["e2e"]["p99"] == pytest.approx(slow.summary["e2e"]["p99"])
    # the time-averaged KV: each fast-forwarded step's KV x its own duration, as stepping sums it
    # (a trapezoid over the stretch before: a block-granular vLLM pool's KV grows in steps, not linearly)
    assert fast.summary["kv_mean_tokens"] == pytest.approx(slow.summary["kv_mean_tokens"], rel=1e-12)


def test_bad_step_cost_is_reported():
    tm = TimeModel(lambda p, b, c: 0.0, name="broken")
    with pytest.raises(InvalidValueError, match="broken"):
        simulate([Request("a", 0, [1, 2, 3], 2)], PagedManager(capacity_tokens=256), time_model=tm)


def test_from_perf_model_uses_the_performance_model():
    import inferlab.perf_model as pm
    from inferlab.perf.calibration import CALIBRATED

    tm = TimeModel.from_perf_model("llama-3.1-8b", "rtx4090")  # calibrated speed, as `inferlab fit` reports
    lesson = TimeModel.from_perf_model("llama-3.1-8b", "rtx4090", speed="lesson")
    model, machine = pm.MODELS["llama-3.1-8b"], pm.MACHINES["rtx4090"]
    p = pm.place(model, machine, "Q4_K_M", 8192, kv_type="f16")
    assert tm.step_time(512, 0, 512) == pytest.approx(pm.prefill_time(p, machine, 512, CALIBRATED())["total_s"])
    assert lesson.step_time(512, 0, 512) == pytest.approx(pm.prefill_time(p, machine, 512)["total_s"])
    # one decode step of 4 sequences at a mean context of 1000 -> bucket 1024
    assert tm.step_time(0, 4, 4000) == pytest.approx(pm.decode_step_time(p, machine, 1024, batch=4, model=CALIBRATED())["total_s"])
    assert lesson.step_time(0, 4, 4000) == pytest.approx(pm.decode_step_time(p, machine, 1024, batch=4)["total_s"])
    assert tm.step_time(0, 4, 4000) != lesson.step_time(0, 4, 4000)
    with pytest.raises(UnknownNameError, match="speed model"):
        TimeModel.from_perf_model("llama-3.1-8b", "rtx4090", speed="fast")
    run = simulate([Request(i, 0.01 * i, list(range(i, i + 300)), 20) for i in range(8)],
                   RadixManager(capacity_tokens=8192), time_model=tm)
    s = run.summary
    assert s["time_unit"] == "s" and 0 < s["ttft"]["p50"] < 1 and s["e2e"]["p99"] >= s["e2e"]["p50"]
    assert s["throughput_tok_per_unit"] > 0


def test_kv_pool_from_memory_left_after_weights():
    import inferlab.perf_model as pm
    from inferlab.kv.pool import kv_pool_tokens

    model, machine = pm.MODELS["llama-3.1-8b"], pm.MACHINES["rtx4090"]
    per_token = pm.kv_bytes_per_token(model, "f16")
    weights = pm.weight_bytes(model, "Q4_K_M")["total"]
    budget = 0.92 * machine.gpu.memory_gb * 1e9 - weights
    vllm = kv_pool_tokens("vllm", model, machine)
    assert vllm * per_token <= budget  # the pool fits beside the weights within 92 %
    assert vllm * per_token > budget - 2e9  # and only activations (< 2 GB) are kept aside
    assert kv_pool_tokens("llamacpp", model, machine) == pm.place(model, machine, "Q4_K_M", None).n_ctx

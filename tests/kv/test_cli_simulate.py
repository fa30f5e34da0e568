"""inferlab simulate: table, JSON, plot, errors."""

import json

import pytest

from click.testing import CliRunner

from inferlab.cli.main import cli


def by_engine(text: str) -> dict:
    """The SimReport JSON's runs, keyed by engine."""
    out = json.loads(text)
    assert out["kind"] == "SimReport" and out["schema_version"] == 1
    return {r["engine"]: r for r in out["runs"]}


def test_json_summaries_for_the_seed_workload():
    res = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--json"])
    assert res.exit_code == 0, res.output
    out = by_engine(res.output)
    assert set(out) == {"llamacpp", "vllm", "sglang"}
    assert out["sglang"]["summary"]["prefill_computed"] == 208
    assert out["vllm"]["config"]["block_size"] == 16


def test_table_options_and_plot(tmp_path):
    png = tmp_path / "t.png"
    res = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384",
                                   "--engine", "vllm,sglang", "--vllm-version", "0.11", "--schedule-policy", "lpm",
                                   "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "prefill computed" in res.output and "llamacpp" not in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_with_limit_and_poisson_arrivals():
    from _paths import CONVERSATION_TRACE as trace

    if not trace.exists():
        pytest.skip(f"the Mooncake trace is not at {trace}")
    res = CliRunner().invoke(cli, ["simulate", "--trace", str(trace), "--limit", "30", "--arrivals", "poisson",
                                   "--rate", "0.5", "--capacity-tokens", "200000", "--json"])
    assert res.exit_code == 0, res.output
    assert by_engine(res.output)["vllm"]["summary"]["requests"] == 30


def test_errors_are_one_line_exit_2():
    r = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat"])
    assert r.exit_code == 2 and "--capacity-tokens" in r.output
    r = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384",
                                 "--engine", "vlm"])
    assert r.exit_code == 2 and "vllm" in r.output
    r = CliRunner().invoke(cli, ["simulate", "--capacity-tokens", "384"])
    assert r.exit_code == 2 and "--workload" in r.output


def test_model_on_machine_sizes_the_pool_and_prices_steps():
    from inferlab.kv.pool import kv_pool_tokens

    res = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat", "--model", "llama-3.1-8b", "--on", "rtx4090",
                                   "--engine", "vllm,sglang", "--json"])
    assert res.exit_code == 0, res.output
    out = by_engine(res.output)
    for e in ("vllm", "sglang"):
        assert out[e]["config"]["capacity_tokens"] == kv_pool_tokens(e, "llama-3.1-8b", "rtx4090")
        assert out[e]["summary"]["time_unit"] == "s"
        assert 0 < out[e]["summary"]["ttft"]["p50"] < 1


def test_a_partly_offloaded_model_is_pooled_and_priced_on_one_placement():
    """Qwen2.5 32B Q4_K_M on a 16 GB card: llama.cpp's --fit offloads 45 of 65 layers (the output
    head first). The run's KV pool (-c) and its step times must come from that one placement: the
    step of a 512-token prompt costs prefill_time on it, and a placement in the lesson's order
    (blocks 0..ngl-1 on the GPU) prices the same step differently, so mixing the two shows."""
    import pytest

    from inferlab.api import simulate
    from inferlab.kv.pool import engine_placement
    from inferlab.kv.workloads import seed_chat
    from inferlab.perf.calibration import CALIBRATED
    from inferlab.perf.placement import place
    from inferlab.perf.speed import prefill_time
    from inferlab.hardware.catalog import MACHINES

    rep = simulate(seed_chat(), engines="llamacpp", model="qwen2.5-32b", machine="rtx4060ti")
    run = rep.run("llamacpp")
    p = engine_placement("llamacpp", "qwen2.5-32b", "rtx4060ti")
    assert 0 < p.n_gpu_layers < p.model.n_layers + 1  # partly offloaded
    assert run.capacity_tokens == p.n_ctx and run.n_gpu_layers == p.n_gpu_layers
    mc = MACHINES["rtx4060ti"]
    tm_cost = run._run.config  # the manager's config records the pool it was given
    assert tm_cost["capacity_tokens"] == p.n_ctx
    from inferlab.kv.time_model import TimeModel

    tm = TimeModel.from_placement(p, mc)
    assert tm.step_time(512, 0, 0) == pytest.approx(prefill_time(p, mc, 512, CALIBRATED())["total_s"])
    lesson_order = place(p.model, mc, "Q4_K_M", p.n_ctx, n_gpu_layers=p.n_gpu_layers, order="first-blocks")
    assert prefill_time(lesson_order, mc, 512, CALIBRATED())["total_s"] != pytest.approx(tm.step_time(512, 0, 0), rel=1e-3)
    assert tm.name == run.time_model


def test_simulated_pools_are_the_engines_own_accounting_as_capacity_reports_it():
    """One source of truth: `simulate --model --on` gives vLLM blocks x 16 and SGLang max_total_num_tokens of
    the same accounting `inferlab capacity` shows (kv.pool), not a flat fraction of memory."""
    from inferlab.api import capacity, simulate
    from inferlab.kv.pool import sglang_pool, vllm_pool
    from inferlab.kv.workloads import seed_chat
    from inferlab.models.catalog import MODELS
    from inferlab.hardware.catalog import MACHINES
    from inferlab.quant.presets import resolve_quant

    rep = simulate(seed_chat(), engines="vllm,sglang", model="llama-3.1-8b", machine="rtx4090")
    spec, mc, q = MODELS["llama-3.1-8b"], MACHINES["rtx4090"], resolve_quant("preset:Q4_K_M")
    v, s = vllm_pool(spec, mc, q), sglang_pool(spec, mc, q)
    assert rep.run("vllm").capacity_tokens == v.num_blocks * 16 and v.num_blocks > 0
    assert rep.run("sglang").capacity_tokens == s.max_total_num_tokens
    # SGLang's own rule on a 24 GB card (0.70, not the flat 0.88 of before): (24e9/2^20 - reserved) / (24e9/2^20)
    mib = 24e9 / 2**20
    reserved = 512 + 4096 * 1.5 + 1 / 8 * 1024 + 48 * 2  # metadata + chunked prefill activations + tp slack + decode graphs
    assert s.mem_fraction_static == round((mib - reserved) / mib, 3)
    c = capacity("llama-3.1-8b", "rtx4090", engine="vllm", quant="Q4_K_M").to_dict()["pool"]
    assert c["num_blocks"] == v.num_blocks and c["block_size"] * c["num_blocks"] == rep.run("vllm").capacity_tokens


def test_the_service_layer_gives_each_runs_own_events():
    """api.simulate(record_events=True): each engine's per-step events in its report's JSON; the
    events count what the summary counts (finishes, preemptions) and the run is the same run."""
    from inferlab.api import simulate
    from inferlab.kv.workloads import seed_chat

    rep = simulate(seed_chat(), capacity_tokens=384, record_events=True)
    plain = simulate(seed_chat(), capacity_tokens=384)
    d = rep.to_dict()
    for run, base, js in zip(rep.runs, plain.runs, d["runs"]):
        assert run.events is not None and js["events"] == list(run.events)
        kinds = [e["kind"] for step in run.events for e in step["events"]]
        assert kinds.count("finish") == run.summary["finished"] == 8  # the seed workload's 8 requests
        assert kinds.count("preempt") == run.summary["preemptions"]
        assert [s["step"] for s in run.events] == list(range(1, run.summary["steps"] + 1))
        assert run.summary == base.summary  # kv_mean_tokens too: fast-forward sums it step by step
    assert all(r.events is None for r in plain.runs) and all(js["events"] is None for js in plain.to_dict()["runs"])


def test_cache_reuse_shifts_the_chunks_an_edited_history_kept(tmp_path):
    """--cache-reuse N reaches llama.cpp's manager. A Mooncake trace of two turns on one slot: the
    first prompt is blocks [1, 2, 3] (512 tokens each), the second drops block 2: [1, 3, 4].
    By hand (update_slots' reuse loop): the common prefix is block 1 = 512 tokens. Without reuse
    that is all the second turn keeps: cached 512. With --cache-reuse 256 the loop scans past the
    cache's block 2 and finds block 3 (512 >= 256 tokens) where the prompt has it: 512 + 512 = 1024
    cached. Prompts 1536 + 1536 = 3072 tokens in all; computed 3072 - 512 and 3072 - 1024."""
    trace = tmp_path / "edited.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1536, "output_length": 4, "hash_ids": [1, 2, 3]}\n'
                     '{"timestamp": 60000, "input_length": 1536, "output_length": 4, "hash_ids": [1, 3, 4]}\n')
    base = ["simulate", "--trace", str(trace), "--engine", "llamacpp", "--capacity-tokens", "8192", "--np", "1",
            "--cache-ram", "0", "--json"]
    runs = {}
    for n in (0, 256):
        res = CliRunner().invoke(cli, [*base, "--cache-reuse", str(n)])
        assert res.exit_code == 0, res.output
        runs[n] = by_engine(res.output)["llamacpp"]
    assert runs[256]["config"]["cache_reuse"] == 256
    assert runs[0]["summary"]["prefill_computed"] == 3072 - 512
    assert runs[256]["summary"]["prefill_computed"] == 3072 - 1024
    bad = CliRunner().invoke(cli, [*base, "--cache-reuse", "-1"])
    assert bad.exit_code == 2 and "cache_reuse" in bad.output and "Traceback" not in bad.output

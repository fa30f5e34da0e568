"""inferlab simulate: table, JSON, plot, errors."""

import json

import pytest

from click.testing import CliRunner

from inferlab.cli.main import cli


def test_json_summaries_for_the_seed_workload():
    res = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
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
    assert json.loads(res.output)["vllm"]["summary"]["requests"] == 30


def test_errors_are_one_line_exit_2():
    r = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat"])
    assert r.exit_code == 2 and "--capacity-tokens" in r.output
    r = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat", "--capacity-tokens", "384",
                                 "--engine", "vlm"])
    assert r.exit_code == 2 and "vllm" in r.output
    r = CliRunner().invoke(cli, ["simulate", "--capacity-tokens", "384"])
    assert r.exit_code == 2 and "--workload" in r.output


def test_model_on_machine_sizes_the_pool_and_prices_steps():
    import pytest

    pytest.importorskip("inferlab.perf_model")
    from inferlab.kv.pool import kv_pool_tokens

    res = CliRunner().invoke(cli, ["simulate", "--workload", "seed-chat", "--model", "llama-3.1-8b", "--on", "rtx4090",
                                   "--engine", "vllm,sglang", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for e in ("vllm", "sglang"):
        assert out[e]["config"]["capacity_tokens"] == kv_pool_tokens(e, "llama-3.1-8b", "rtx4090")
        assert out[e]["summary"]["time_unit"] == "s"
        assert 0 < out[e]["summary"]["ttft"]["p50"] < 1

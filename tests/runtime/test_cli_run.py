"""`inferlab run` and `inferlab profile` end to end (click's runner, the real SmolLM2)."""

import json

import pytest
from click.testing import CliRunner

from inferlab.cli.main import cli


def test_run_json_greedy_matches_the_library(smollm, smollm_file):
    from inferlab.runtime.generate import generate

    model, tok = smollm
    r = CliRunner().invoke(cli, ["run", smollm_file, "The capital of France is", "--max-tokens", "4", "--raw", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["prompt_ids"] == tok.encode("The capital of France is", special=False)
    assert out["token_ids"] == list(generate(model, out["prompt_ids"], 4).token_ids[0])
    assert out["text"] == tok.decode(out["token_ids"], skip_special=True)
    t = out["timings"]
    assert t["ttft_s"] > 0 and t["decode_tok_per_s"] > 0 and t["generated_tokens"] == 4


def test_run_streams_text_and_prints_speeds(smollm_file):
    r = CliRunner().invoke(cli, ["run", smollm_file, "What is 2+2?", "--max-tokens", "3"])
    assert r.exit_code == 0, r.output
    assert "TTFT" in r.output and "decode" in r.output and "tok/s" in r.output


@pytest.mark.parametrize("args, message", [
    (["run", "{model}", ""], "prompt is empty"),
    (["run", "/nonexistent.gguf", "hi"], "does not exist"),
    (["run", "{model}", "hi", "--temperature", "-1"], "temperature must be >= 0"),
    (["run", "{model}", "hi", "--max-tokens", "9000"], "exceeds the model's context of 8192"),
    (["profile", "small", "--cache", "windw:4"], "did you mean 'window'"),
    (["profile", "small", "--ctx", "10,abc"], "--ctx takes comma-separated integers"),
])
def test_bad_input_is_one_line_exit_2(smollm_file, args, message):
    r = CliRunner().invoke(cli, [a.replace("{model}", smollm_file) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output


@pytest.mark.slow
def test_profile_small_json_and_plot(tmp_path):
    plot = tmp_path / "p.png"
    r = CliRunner().invoke(cli, ["profile", "small", "--ctx", "16,32", "--batch", "2", "--cache", "contiguous,int8,window:8",
                                 "--new-tokens", "3", "--json", "--plot", str(plot)])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert len(rep["rows"]) == 2 * 3
    first = rep["rows"][0]
    assert first["naive_ttft_ms"] > 0 and first["speedup"] > 0
    assert {"weights_bytes", "kv_cache_bytes", "activations_bytes", "peak_bytes", "predicted_step_ms"} <= set(first)
    assert rep["prediction_note"].startswith("no prediction")  # SmallTransformer has no GGUF
    assert [q["cache"] for q in rep["quality"]] == ["int8", "window:8"]
    kv = {r["cache"]: r["kv_cache_bytes"] for r in rep["rows"] if r["context"] == 32 and r["batch"] == 2}
    assert kv["contiguous"] == 2 * 6 * 2 * 512 * (32 + 3) * 4  # K+V, layers, batch, d_model, positions, fp32
    assert kv["int8"] < kv["contiguous"] / 3
    assert plot.stat().st_size > 10_000


@pytest.mark.slow
def test_profile_gguf_has_predictions_beside_measurements(smollm_file):
    r = CliRunner().invoke(cli, ["profile", smollm_file, "--ctx", "16", "--new-tokens", "2", "--no-naive",
                                 "--cache", "contiguous,int8", "--no-quality", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    for row in rep["rows"]:
        assert row["predicted_step_ms"] > 0 and row["predicted_prefill_ms"] > 0
        # the error is (predicted - measured) / measured of the row's own figures
        assert row["step_error"] == pytest.approx((row["predicted_step_ms"] - row["cached_mean_step_ms"]) / row["cached_mean_step_ms"])
        assert row["prefill_error"] == pytest.approx((row["predicted_prefill_ms"] - row["cached_prefill_ms"]) / row["cached_prefill_ms"])
    assert "performance model" in rep["prediction_note"]

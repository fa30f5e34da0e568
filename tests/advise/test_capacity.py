"""Capacity: the case study's figures (by hand from its formula) and each engine's own accounting."""

import math

import pytest

from inferlab.advise.capacity import (llamacpp_max_sessions, llamacpp_pool, sglang_defaults, vllm_pool)
from inferlab.api.capacity import capacity
from inferlab.errors import InvalidValueError, UnknownNameError
from inferlab.hardware.catalog import MACHINES
from inferlab.models.catalog import MODELS
from inferlab.quant.presets import resolve_quant

CTXS = (2000, 4000, 6000, 8000, 10000, 12000)


@pytest.fixture(scope="module")
def case_study():
    # the case study: its 7B MHA model (Llama 2 7B: 32 layers x 32 heads x 128), an A100-40GB, 14 GB of weights
    return capacity("llama-2-7b", "a100-40gb", engine="vllm", contexts=CTXS, kv_types=("f16", "int8"), window=2048,
                    target_sessions=80, weights_gb=14.0)


def test_kv_bytes_per_token_is_the_case_studys(case_study):
    per = {k.kv_type: k.bytes_per_token for k in case_study.kv_per_token}
    assert per["f16"] == 2 * 32 * 32 * 128 * 2 == 524_288  # K and V x layers x heads x head size x 2 bytes
    assert per["int8"] == 262_144  # its quantisation_factor 0.5


def test_baseline_column_reproduces_the_case_study(case_study):
    base = next(r for r in case_study.rows if r.strategy.startswith("baseline"))
    # 26 GB // (524,288 B x n): 26e9/1.0486e9 = 24.8, /2.097e9 = 12.4, /3.146e9 = 8.3, /4.194e9 = 6.2, /5.243e9 = 4.96, /6.291e9 = 4.13
    assert [c.sessions for c in base.cells] == [24, 12, 8, 6, 4, 4]
    int8 = next(r for r in case_study.rows if r.strategy == "int8 KV")
    assert [c.sessions for c in int8.cells] == [49, 24, 16, 12, 9, 8]  # 26e9 // (262,144 x n)


def test_int8_plus_window_claim_gets_its_right_figures(case_study):
    chk = next(c for c in case_study.target_checks if c.strategy == "int8 KV + window W=2048" and c.context_tokens == 8000)
    assert chk.kv_bytes_per_session == 2 * 32 * 32 * 128 * 2048 * 1 == 536_870_912  # 0.54 GB a session
    assert chk.footprint_at_target_bytes == pytest.approx(80 * 536_870_912)  # 42.9 GB at B = 80, not "under 3 GB"
    assert chk.sessions == 48 and not chk.reached  # 26e9 / 5.369e8 = 48.4
    assert any("42.9 GB" in n and "48 fit" in n and "3 GB" in n for n in case_study.notes)
    assert any("no strategy reaches 80" in n for n in case_study.notes)  # the impossible target, explained
    assert "1,239 tokens" in " ".join(case_study.notes)  # 26e9 / (262,144 x 80) = 1,239.8 tokens each


def test_engines_reserve_more_than_the_bare_formula():
    r = capacity("llama-2-7b", "a100-40gb", engine="vllm", contexts=(2000, 8000), kv_types=("f16",))
    pool = r.pool
    # the pool is what is left of 0.92 x 40 GB after each reservation, in 16-token blocks of 524,288 B a token
    kv = 0.92 * 40e9 - pool.weights_bytes - pool.activation_bytes - pool.non_torch_bytes - pool.cuda_graph_bytes
    assert pool.kv_bytes == pytest.approx(kv)
    assert pool.num_blocks == int(kv // (16 * 524_288))
    x = pool.num_blocks / math.ceil(8000 / 16)
    assert pool.log_line == f"GPU KV cache size: {int(x * 8000):,} tokens, Maximum concurrency for 8,000 tokens per request: {x:.2f}x"
    for c in r.rows[0].cells:
        assert c.engine_sessions <= c.sessions
    eager = vllm_pool(MODELS["llama-2-7b"], MACHINES["a100-40gb"], resolve_quant("type:F16"), "auto", 8000, enforce_eager=True)
    assert eager.cuda_graph_bytes == 0 and eager.num_blocks > pool.num_blocks


def test_sglang_default_fraction_by_hand():
    # A100 40 GB = 38,147 MiB: reserved 512 + 1.5 x 4096 + 1024/8 + 2 x 32 = 6,848 MiB -> (38,147 - 6,848) / 38,147 = 0.820
    frac, reserved, chunk, bs = sglang_defaults(40e9)
    assert (reserved, chunk, bs, frac) == (6848, 4096, 32, 0.820)
    # 16 GB = 15,259 MiB: 512 + 1.5 x 2048 + 128 + 2 x 8 = 3,728 -> 0.756
    assert sglang_defaults(16e9)[:2] == (0.756, 3728)
    # 80 GB = 76,294 MiB: 512 + 1.5 x 8192 + 128 + 2 x 256 = 13,440 (above the 10 GiB floor) -> 0.824
    assert sglang_defaults(80e9)[:2] == (0.824, 13440)
    r = capacity("llama-2-7b", "a100-40gb", engine="sglang", contexts=(4000,), kv_types=("f16",))
    assert r.pool.max_total_num_tokens == int((0.820 * 40e9 - r.pool.weights_bytes) // 524_288)
    assert r.rows[0].cells[0].engine_sessions == r.pool.max_total_num_tokens // 4000


def test_llamacpp_sessions_are_the_largest_np_that_fits():
    m, mc, q = MODELS["llama-3.1-8b"], MACHINES["rtx4090"], resolve_quant("preset:Q4_K_M")
    s = llamacpp_max_sessions(m, mc, q, "f16", 8000)
    assert s > 1
    assert llamacpp_pool(m, mc, q, "f16", 8000, s).fits and not llamacpp_pool(m, mc, q, "f16", 8000, s + 1).fits
    assert llamacpp_max_sessions(m, mc, q, "q8_0", 8000) > s  # q8_0 is 8.5 bits a value: more slots
    r = capacity("llama-3.1-8b", "rtx4090", engine="llamacpp", contexts=(8000,), kv_types=("f16", "int8"))
    assert r.rows[1].engine_kv_type == "q8_0" and "q8_0" in r.rows[1].note
    assert r.pool.n_parallel == s and r.pool.n_ctx == -(-s * 8000 // 256) * 256  # llama.cpp pads -c to 256 cells


def test_window_is_only_llama_cpps_context_shift():
    r = capacity("llama-2-7b", "a100-40gb", engine="sglang", contexts=(8000,), kv_types=("f16",), window=2048)
    w = next(x for x in r.rows if x.window)
    assert w.cells[0].engine_sessions is None and "window" in w.note
    r2 = capacity("llama-2-7b", "a100-40gb", engine="llamacpp", quant="F16", contexts=(8000,), kv_types=("f16",), window=2048)
    w2 = next(x for x in r2.rows if x.window)
    assert w2.cells[0].engine_sessions is not None and "--context-shift" in w2.note


def test_bad_input_is_refused_with_the_value():
    with pytest.raises(UnknownNameError, match="fp9"):
        capacity("llama-2-7b", "a100-40gb", kv_types=("fp9",))
    with pytest.raises(InvalidValueError, match="context"):
        capacity("llama-2-7b", "a100-40gb", contexts=(0,))
    with pytest.raises(UnknownNameError):
        capacity("llama-2-7b", "a100-40gb", engine="tgi")
    with pytest.raises(InvalidValueError, match="needs a GPU"):
        capacity("llama-2-7b", "cpu-ddr5", engine="vllm")
    with pytest.raises(InvalidValueError):
        capacity("llama-2-7b", "a100-40gb", target_sessions=-3)


def test_capacity_plot_png_and_svg(tmp_path, case_study):
    from PIL import Image

    from inferlab.plots.capacity import save_capacity

    png, svg = tmp_path / "c.png", tmp_path / "c.svg"
    save_capacity(case_study, png)
    save_capacity(case_study, svg)
    with Image.open(png) as im:
        assert im.size == (1200, 720)
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20)) > 20  # not a blank canvas
    text = svg.read_text()
    assert "context length (tokens)" in text and "concurrent sessions that fit" in text and "B=80" in text


def test_kv_names_per_engine():
    r = capacity("llama-3.1-8b", "rtx4090", engine="llamacpp", contexts=(4000,), kv_types=("f16", "fp8", "q4_0"))
    fp8 = next(x for x in r.rows if x.kv_type == "fp8")
    assert fp8.engine_kv_type is None and fp8.cells[0].engine_sessions is None and "vLLM's and SGLang's" in fp8.note
    q4 = next(x for x in r.rows if x.kv_type == "q4_0")
    assert q4.cells[0].kv_bytes_per_session == 131_072 / 2 * 18 / 32 * 4000  # 65,536 values a token x 18/32 bytes (q4_0 blocks)
    v = capacity("llama-3.1-8b", "rtx4090", engine="vllm", contexts=(4000,), kv_types=("int8",))
    assert v.rows[0].engine_kv_type == "fp8" and "int8_per_token_head" in v.rows[0].note
    from inferlab.advise.flags import flag_table

    assert "int8_per_token_head" in flag_table("vllm").option("--kv-cache-dtype").choices


def test_vllm_batch_defaults_as_its_source_says():
    from inferlab.advise.capacity import vllm_batch_defaults

    gib = 2**30
    assert vllm_batch_defaults(24e9, "RTX 4090") == (2048, 256)
    assert vllm_batch_defaults(80e9, "A100 80GB SXM") == (2048, 256)  # the A100 keeps the small defaults (vLLM PR #17885)
    assert vllm_batch_defaults(80e9, "H100 SXM 80GB") == (8192, 1024)
    assert vllm_batch_defaults(160 * gib, "B200") == (16384, 1024)

"""The lesson's recipes and "Try This" answers, out of `advise` and `fit` (tests per recipe: the engine
chosen and the flags the recipe calls for); LoRA and speculative decoding worked out by hand."""

import pytest

from inferlab.advise.flags import parse_command
from inferlab.advise.lora import lora_params
from inferlab.advise.speculative import expected_tokens
from inferlab.api.advise import advise
from inferlab.api.fit import fit
from inferlab.errors import InvalidValueError


def _flags(e):
    return parse_command(e.engine, e.command.text)


def test_one_user_model_fits():
    r = advise("llama-3.1-8b", "rtx4060ti")
    assert r.recipe == "fits-one-user" and r.engine == "llamacpp" and r.fits_on_gpu
    f = _flags(r.engines[0])
    assert f["-ngl"] == "33" and f["-c"] == "8192" and f["-fa"] == "on"  # everything on the GPU, -c what you use
    assert {e.engine for e in r.engines} == {"llamacpp", "vllm", "sglang"}  # all three can run it
    v = next(e for e in r.engines if e.engine == "vllm")
    assert _flags(v)["--max-model-len"] == "8192" and v.reports[0].startswith("GPU KV cache size:")
    assert len({round(e.tok_per_s, 6) for e in r.engines}) == 1  # one stream: the same bandwidth limit for every engine


def test_one_user_model_larger_than_vram():
    r = advise("qwen2.5-32b", "rtx4060ti")
    assert r.recipe == "larger-than-vram" and r.engine == "llamacpp" and not r.fits_on_gpu
    assert [e.engine for e in r.engines] == ["llamacpp"]  # vLLM and SGLang do not offload layers
    assert r.placements[0].tok_per_s >= r.fit_default.tok_per_s
    assert "-ngl" in r.engines[0].command.argv


def test_moe_larger_than_vram_moves_experts():
    r = advise("qwen3-30b-a3b", "rtx4060ti")
    assert "--n-cpu-moe" in r.engines[0].command.argv and int(_flags(r.engines[0])["-ngl"]) == 49


def test_apple_silicon():
    r = advise("llama-3.1-8b", "m4max")
    assert r.recipe == "apple" and [e.engine for e in r.engines] == ["llamacpp"]
    assert _flags(r.engines[0])["-ngl"] == "33"


def test_cpu_only_uses_physical_cores():
    from inferlab.hardware.catalog import MACHINES

    r = advise("llama-3.1-8b", "cpu-ddr5")
    f = _flags(r.engines[0])
    assert r.recipe == "cpu-only" and "-ngl" not in f and f["-t"] == str(MACHINES["cpu-ddr5"].ram.n_cores)
    # decode = RAM bandwidth / model bytes: the lesson's upper bound of ~13 tok/s at 70 % of dual-channel DDR5
    assert r.engines[0].tok_per_s < 0.7 * 89.6e9 / 4.6e9


def test_many_users_and_shared_prefix():
    r = advise("llama-3.1-8b", "rtx4090", users=8)
    assert r.recipe == "many-users" and r.engines[0].engine == "vllm"
    f = _flags(r.engines[0])
    assert f["--max-model-len"] == "8192" and f["--kv-cache-dtype"] == "fp8" and float(f["--gpu-memory-utilization"]) < 0.92
    r2 = advise("llama-3.1-8b", "rtx4090", users=8, shared_prefix=2000)
    assert r2.recipe == "shared-prefix" and r2.engines[0].engine == "sglang"
    assert _flags(r2.engines[0])["--schedule-policy"] == "lpm"
    ll = next(e for e in r2.engines if e.engine == "llamacpp")
    assert _flags(ll)["-np"] == "8" and _flags(ll)["-c"] == str(8 * 8192)
    assert ll.aggregate_tok_per_s > ll.tok_per_s  # batching raises throughput


def test_try_this_qwen14b_rtx3060_32k():
    """Qwen2.5 14B on the RTX 3060 at 32k: q8_0 KV buys layers; 8k context buys more.
    By hand: KV per token 2 x 48 x 8 x 128 x 2 = 196,608 B; f16 at 32k 6.44 GB, q8_0 at 32k 3.42 GB
    (8.5/16 of it), f16 at 8k 1.61 GB: the shorter context frees the most VRAM."""
    kw = dict(speed="lesson", order="lesson")
    f16 = fit("qwen2.5-14b", "rtx3060", n_ctx=32768, **kw)
    q8 = fit("qwen2.5-14b", "rtx3060", n_ctx=32768, kv_type="q8_0", **kw)
    short = fit("qwen2.5-14b", "rtx3060", n_ctx=8192, **kw)
    assert sum(d.kv_bytes for d in f16.devices) == pytest.approx(196_608 * 32768)
    assert f16.n_gpu_layers < q8.n_gpu_layers < short.n_gpu_layers
    assert f16.decode.tok_per_s < q8.decode.tok_per_s < short.decode.tok_per_s
    # the diagnosis of the 32k setup names partial offload and prices the q8_0 fix with the same numbers
    from inferlab.api.diagnose import diagnose

    d = diagnose("qwen2.5-14b", "rtx3060", flags="-c 32768")
    po = next(x for x in d.findings if x.row == "partial-offload")
    q8c = fit("qwen2.5-14b", "rtx3060", n_ctx=32768, kv_type="q8_0")
    assert any(e.startswith(f"q8_0 KV: -ngl {d.n_gpu_layers} → {q8c.n_gpu_layers}") for e in po.effects)


def test_lora_by_hand():
    from inferlab.models.catalog import MODELS

    # Llama 3.1 8B, rank 16 on q, k, v, o, gate, up, down: 16 x (4096+4096 + 2 x (4096+1024) + 4096+4096 + 3 x (4096+14336))
    # = 1,310,720 per block, x 32 blocks
    assert lora_params(MODELS["llama-3.1-8b"], 16) == (41_943_040, 224)
    r = advise("llama-3.1-8b", "rtx4090", lora_rank=64)
    lc = r.lora
    assert lc.adapter_bytes == 4 * 41_943_040 * 2  # rank 64, fp16
    assert "--max-lora-rank 64" in lc.note  # above vLLM's default 16
    s = r.engines[0]
    assert lc.slowdown == pytest.approx(1 + lc.extra_decode_s * s.tok_per_s)
    with pytest.raises(InvalidValueError):
        lora_params(MODELS["llama-3.1-8b"], 0)


def test_speculative_by_hand():
    assert expected_tokens(0.7, 3) == pytest.approx((1 - 0.7 ** 4) / 0.3)  # 2.533
    assert expected_tokens(0.0, 3) == 1.0 and expected_tokens(1.0, 3) == 4.0
    r = advise("llama-3.1-8b", "rtx4090", draft="llama-3.2-1b", acceptance_rate=0.8)
    s = r.speculative
    assert s.fits and s.draft_weights_bytes > 0
    assert s.speedup == pytest.approx(expected_tokens(0.8, 3) * s.target_step_s / (3 * s.draft_step_s + s.verify_s))
    low = advise("llama-3.1-8b", "rtx4090", draft="llama-3.2-1b", acceptance_rate=0.1).speculative
    assert low.speedup < 1 < s.speedup  # a draft that is rarely right slows decode down
    with pytest.raises(InvalidValueError, match="tokenizer"):
        advise("llama-3.1-8b", "rtx4090", draft="qwen2.5-0.5b")
    with pytest.raises(InvalidValueError):
        advise("llama-3.1-8b", "rtx4090", draft="llama-3.2-1b", acceptance_rate=1.5)


def test_bad_input():
    with pytest.raises(InvalidValueError):
        advise("llama-3.1-8b", "rtx4090", users=0)
    with pytest.raises(InvalidValueError, match="shared prefix"):
        advise("llama-3.1-8b", "rtx4090", ctx=1000, shared_prefix=5000)


def test_advice_figures_are_fits_figures():
    """One source of truth: advise's speed is fit's for the same configuration (decode at half the context)."""
    r = advise("llama-3.1-8b", "rtx4060ti", ctx=8192)
    f = fit("llama-3.1-8b", "rtx4060ti", n_ctx=8192, n_gpu_layers=33, context=4096)
    assert r.engines[0].tok_per_s == pytest.approx(f.decode.tok_per_s)
    r2 = advise("qwen2.5-32b", "rtx4060ti", ctx=8192)
    fd = fit("qwen2.5-32b", "rtx4060ti", n_ctx=8192, context=4096)  # --fit's choice of -ngl
    assert r2.fit_default.n_gpu_layers == fd.n_gpu_layers and r2.fit_default.tok_per_s == pytest.approx(fd.decode.tok_per_s)


def test_lora_and_draft_flags_in_every_command():
    r = advise("llama-3.1-8b", "rtx4090", lora_rank=24, draft="llama-3.2-1b")
    by = {e.engine: _flags(e) for e in r.engines}
    assert by["llamacpp"]["--lora"].endswith(".gguf") and by["llamacpp"]["--spec-draft-model"].startswith("Llama-3.2-1B")
    assert by["llamacpp"]["--spec-draft-n-max"] == "3"  # llama.cpp's default draft length, the estimate's γ
    assert by["vllm"]["--enable-lora"] and by["vllm"]["--max-lora-rank"] == "32"  # rank 24 -> vLLM's next allowed rank
    assert '"method":"draft_model"' in by["vllm"]["--speculative-config"]
    assert by["sglang"]["--lora-paths"] and by["sglang"]["--speculative-algorithm"] == "STANDALONE"


def test_many_users_on_a_model_larger_than_vram():
    from inferlab.perf.placement import place

    r = advise("qwen2.5-32b", "rtx4060ti", users=4, ctx=4096)
    assert r.recipe == "many-users-offload" and [e.engine for e in r.engines] == ["llamacpp"]
    f = _flags(r.engines[0])
    assert f["-np"] == "4" and f["-c"] == str(4 * 4096) and f["-kvu"]
    p = place("qwen2.5-32b", "rtx4060ti", "Q4_K_M", 4 * 4096, f.get("-ctk", "f16"), int(f["-ngl"]))
    assert p.fits  # the slots' shared -c fits beside the layers the command puts on the GPU
    assert r.engines[0].aggregate_tok_per_s > r.engines[0].tok_per_s

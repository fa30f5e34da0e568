"""llama.cpp placement: layer order, --fit, explicit -ngl, MoE experts on CPU, split, unified memory."""

import pytest

from inferlab.errors import InvalidValueError, UnknownNameError
from inferlab.hardware.catalog import MACHINES
from inferlab.models.catalog import MODELS
from inferlab.perf.placement import FIT_TARGET_BYTES, place
from inferlab.quant.plan import weight_bytes

Q = "Q4_K_M"


def test_everything_accounted_for():
    m, mc = MODELS["qwen2.5-32b"], MACHINES["rtx4060ti"]
    for ngl in (0, 1, 20, 64, 65):
        p = place(m, mc, Q, 8192, n_gpu_layers=ngl)
        # every weight byte is on exactly one device
        assert p.weights_total == pytest.approx(weight_bytes(m, Q)["total"])
        # every layer's KV slice is on exactly one device
        assert p.kv_total == pytest.approx(64 * 8 * 128 * 2 * 2 * 8192)
        assert sum(d.n_blocks for d in p.devices) == 64


def test_llama_cpp_order_offloads_the_output_head_first():
    m, mc = MODELS["llama-3.1-8b"], MACHINES["rtx4090"]
    p1 = place(m, mc, Q, 4096, n_gpu_layers=1)
    assert p1.gpus[0].has_output and p1.gpus[0].n_blocks == 0  # i_gpu_start = n_layer + 1 - ngl = 32: the output layer
    p2 = place(m, mc, Q, 4096, n_gpu_layers=1, order="lesson")
    assert not p2.gpus[0].has_output and p2.gpus[0].n_blocks == 1
    full = place(m, mc, Q, 4096, n_gpu_layers=33)
    assert full.fully_offloaded and full.cpu.n_blocks == 0 and full.gpus[0].has_output
    # token_embd always stays in host memory
    assert full.cpu.weights_bytes == weight_bytes(m, Q)["token_embd"]


def test_fit_picks_the_largest_ngl_with_the_margin():
    m, mc = MODELS["llama-3.1-70b"], MACHINES["rtx4090"]
    p = place(m, mc, Q, 8192)
    assert p.auto and p.fits and 0 < p.n_gpu_layers < 81
    assert p.gpus[0].free_bytes >= FIT_TARGET_BYTES
    over = place(m, mc, Q, 8192, n_gpu_layers=p.n_gpu_layers + 1)
    assert over.gpus[0].free_bytes < FIT_TARGET_BYTES and not over.fits


def test_explicit_ngl_that_does_not_fit_is_reported_not_clipped():
    p = place(MODELS["llama-3.1-70b"], MACHINES["rtx4090"], Q, 8192, n_gpu_layers=81)
    assert p.n_gpu_layers == 81 and not p.fits
    assert "RTX 4090" in p.reason and "GB" in p.reason


def test_unset_context_shrinks_towards_fit_ctx():
    m, mc = MODELS["llama-3.1-8b"], MACHINES["rtx4060ti"]
    p = place(m, mc, Q)  # trained context 131072: 16 GiB of KV alone does not fit
    assert p.ctx_reduced and 4096 <= p.n_ctx < 131072 and p.fully_offloaded and p.fits
    assert p.n_ctx % 256 == 0
    bigger = place(m, mc, Q, p.n_ctx + 256, n_gpu_layers=33)
    assert not bigger.fits  # it took the largest context that fits
    pinned = place(m, mc, Q, 131072)  # a context the user set is never shrunk
    assert pinned.n_ctx == 131072 and not pinned.fully_offloaded


def test_cpu_only_and_unified_memory():
    m = MODELS["llama-3.1-8b"]
    p = place(m, MACHINES["cpu-ddr5"], Q, 4096)
    assert not p.gpus and p.n_gpu_layers == 0 and p.cpu.n_blocks == 32 and p.fits
    a = place(m, MACHINES["m4max"], Q, 8192)
    assert a.unified and a.fully_offloaded and a.fits
    # Metal may wire 3/4 of 128 GB
    assert a.gpus[0].capacity_bytes == pytest.approx(0.75 * 128e9)


def test_n_cpu_moe_keeps_experts_in_ram():
    m, mc = MODELS["qwen3-30b-a3b"], MACHINES["rtx4060"]
    wb = weight_bytes(m, Q)
    p = place(m, mc, Q, 8192, n_gpu_layers=49, cpu_moe=True)
    assert p.cpu.weights_bytes == pytest.approx(wb["token_embd"] + wb["experts"])
    assert p.fits  # attention and shared weights fit an 8 GB card once the experts stay in RAM
    part = place(m, mc, Q, 8192, n_gpu_layers=49, n_cpu_moe=10)
    assert p.cpu.weights_bytes > part.cpu.weights_bytes > wb["token_embd"]


def test_multi_gpu_layer_split():
    m, mc = MODELS["llama-3.1-70b"], MACHINES["2x-rtx3090"]
    p = place(m, mc, Q, 8192)
    assert len(p.gpus) == 2 and p.fully_offloaded and p.fits
    # even split of the 81 llama.cpp layers (80 blocks + the output layer)
    counts = [g.n_blocks + g.has_output for g in p.gpus]
    assert sum(counts) == 81 and abs(counts[0] - counts[1]) <= 1
    uneven = place(m, mc, Q, 8192, n_gpu_layers=81, tensor_split=(3, 1))
    assert uneven.gpus[0].n_blocks > 2 * uneven.gpus[1].n_blocks


def test_bad_input():
    m, mc = MODELS["llama-3.1-8b"], MACHINES["rtx4090"]
    with pytest.raises(InvalidValueError, match="n_ctx"):
        place(m, mc, Q, -1)
    with pytest.raises(InvalidValueError, match="n_gpu_layers"):
        place(m, mc, Q, 4096, n_gpu_layers=-3)
    with pytest.raises(UnknownNameError, match="Q4_K_M"):
        place(m, mc, "Q4_K_X", 4096)
    with pytest.raises(UnknownNameError, match="rtx4090"):
        MACHINES["rtx4909"]
    with pytest.raises(InvalidValueError, match="order"):
        place(m, mc, Q, 4096, order="random")


def test_fit_equals_brute_force_search():
    # --fit's answer (read off a cached curve for one GPU) is the largest ngl whose GPU fits
    from inferlab.perf.placement import _gpus_fit

    for key in ("qwen2.5-32b", "gemma-3-27b", "mixtral-8x7b", "deepseek-v2-lite", "gpt-oss-20b"):
        m = MODELS[key]
        for mc_key in ("rtx3060", "rtx4090", "m1pro"):
            mc = MACHINES[mc_key]
            for order in ("llama.cpp", "lesson"):
                auto = place(m, mc, Q, 16384, order=order)
                brute = max(n for n in range(m.n_layers + 2)
                            if n == 0 or _gpus_fit(place(m, mc, Q, 16384, n_gpu_layers=n, order=order), FIT_TARGET_BYTES))
                assert auto.n_gpu_layers == brute, (key, mc_key, order)


def test_tied_output_head_is_copied_only_to_a_gpu():
    m = MODELS["qwen2.5-0.5b"]  # tie_word_embeddings: the output head is token_embd
    wb = weight_bytes(m, Q)
    cpu = place(m, MACHINES["cpu-ddr5"], Q, 4096)
    assert cpu.weights_total == pytest.approx(wb["total"])  # one copy, memory-mapped once
    gpu = place(m, MACHINES["rtx4090"], Q, 4096)
    assert gpu.gpus[0].has_output
    assert gpu.weights_total == pytest.approx(wb["total"] + wb["token_embd"])  # TENSOR_DUPLICATED onto the GPU


def test_two_files_of_one_model_are_placed_by_their_own_tensors(tmp_path):
    # ModelSpec equality ignores the tensor table, so one path read before and after it was
    # re-quantized with another tensor mix (same file type) gives equal specs: placement must still
    # count each file's own bytes. Here: one tiny model written in F16 and in F32, the second
    # relabelled with the first's file type and source.
    from dataclasses import replace

    pytest.importorskip("gguf")
    from inferlab.models.gguf_reader import model_from_gguf
    from inferlab.models.gguf_writer import write_gguf
    from inferlab.models.spec import ModelSpec

    spec = ModelSpec("tiny", "llama", 2, 64, 4, 2, 16, 128, 300, n_ctx_train=256)
    f16 = model_from_gguf(write_gguf(spec, tmp_path / "a.gguf", "F16"))
    f32 = model_from_gguf(write_gguf(spec, tmp_path / "b.gguf", "F32"))
    twin = replace(f32, file_type=f16.file_type, source=f16.source)
    assert twin == f16 and twin.tensors != f16.tensors
    machine = MACHINES["rtx4090"]
    a, b = place(f16, machine, None, 256), place(twin, machine, None, 256)
    assert a.weights_total == sum(t.n_bytes for t in f16.tensors)
    assert b.weights_total == sum(t.n_bytes for t in twin.tensors) > 1.9 * a.weights_total

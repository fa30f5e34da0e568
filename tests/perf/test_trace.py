"""perf.trace and api.trace: the steps of a load, a prefill and a decode step.

One source of truth: a decode trace's seconds add up to decode_step_time's total, a prefill
trace's to prefill_time's, for the same placement and speed model; the load of one of the
lesson's four scenarios is worked out by hand below.
"""

import math

import pytest

from inferlab.api.setup import configure
from inferlab.api.trace import trace
from inferlab.errors import InvalidValueError
from inferlab.perf.speed import decode_step_time, prefill_time
from inferlab.perf.trace import BOUNDS, decode_steps, device_labels, load_steps, prefill_steps, total_s

# (model, machine, options): full offload, the lesson's 32B partial offload, unified memory, CPU only,
# a MoE with experts held in RAM, two GPUs, a sliding-window model, an explicit partial -ngl
CONFIGS = [
    ("llama-3.1-8b", "rtx4090", {"n_ctx": 8192}),
    ("qwen2.5-32b", "rtx4060ti", {"n_ctx": 8192}),
    ("llama-3.1-8b", "m4max", {"n_ctx": 8192}),
    ("llama-3.1-8b", "cpu-ddr5", {"n_ctx": 8192}),
    ("qwen3-30b-a3b", "rtx4060ti", {"n_ctx": 8192, "n_cpu_moe": 20}),
    ("llama-3.1-70b", "2x-rtx3090", {"n_ctx": 8192}),
    ("gemma-2-9b", "rtx3060", {"n_ctx": 8192}),
    ("llama-3.1-70b", "rtx4090", {"n_ctx": 4096, "n_gpu_layers": 30}),
]
SPEEDS = ["calibrated", "bandwidth-only"]


@pytest.mark.parametrize("speed", SPEEDS)
@pytest.mark.parametrize("model,machine,kw", CONFIGS)
@pytest.mark.parametrize("context,batch", [(0, 1), (2000, 1), (1000, 4)])
def test_decode_trace_adds_up_to_decode_step_time(model, machine, kw, speed, context, batch):
    s = configure(model, machine, speed=speed, **kw)
    steps = decode_steps(s.placement, s.machine, context, batch, s.speed)
    d = decode_step_time(s.placement, s.machine, context, batch, s.speed)
    assert total_s(steps) == pytest.approx(d["total_s"], rel=1e-12)
    # the bytes are the speed model's too: weights and KV read per device
    for p, label in zip(d["per_device"], device_labels(s.placement)):
        mine = [st for st in steps if st.where == label]
        assert math.fsum(st.s for st in mine) == pytest.approx(p["s"], rel=1e-12, abs=1e-15)
        assert sum(st.bytes_moved for st in mine if st.name == "read weights") == pytest.approx(p["weights_bytes"])
        assert sum(st.bytes_moved for st in mine if st.name == "read KV cache") == pytest.approx(p["kv_bytes"])
    assert all(st.bound in BOUNDS and st.s >= 0 for st in steps)


@pytest.mark.parametrize("speed", SPEEDS)
@pytest.mark.parametrize("model,machine,kw", CONFIGS)
@pytest.mark.parametrize("n_tokens,context", [(1, 0), (31, 0), (32, 0), (2000, 0), (1500, 3000)])
def test_prefill_trace_adds_up_to_prefill_time(model, machine, kw, speed, n_tokens, context):
    s = configure(model, machine, speed=speed, **kw)
    steps = prefill_steps(s.placement, s.machine, n_tokens, s.speed, context)
    f = prefill_time(s.placement, s.machine, n_tokens, s.speed, context)
    assert total_s(steps) == pytest.approx(f["total_s"], rel=1e-12)
    assert sum(st.s for st in steps if st.bound == "link") == pytest.approx(f["pcie_s"], rel=1e-12, abs=1e-15)
    assert {st.micro_batch for st in steps} == set(range(math.ceil(n_tokens / s.speed.n_ubatch)))


def test_prefill_micro_batches_share_one_rate_and_later_ones_attend_to_more():
    # calibrated counts attention FLOPs: micro-batch k's tokens attend to context + all before them,
    # so the 2nd of two full micro-batches has more FLOPs than the 1st, at the same FLOP/s
    s = configure("llama-3.1-8b", "rtx4090", n_ctx=8192)
    assert s.speed.attention_flops
    mm = [st for st in prefill_steps(s.placement, s.machine, 1024, s.speed) if st.name == "matmuls" and st.where == "RTX 4090"]
    assert len(mm) == 2 and mm[1].flops > mm[0].flops
    assert mm[0].flops / mm[0].s == pytest.approx(mm[1].flops / mm[1].s, rel=1e-12)
    # attention pairs: token i attends to i + 1/2 on average, so the two add up to (1024^2)/2 pairs per
    # unit of attn FLOPs; the weight part is 1024 x flops_per_token minus the head of all but the last token
    g = s.placement.gpus[0]
    head = 2.0 * s.spec.vocab_size * s.spec.d_model
    expect = 1024 * g.flops_per_token + g.attn_flops_per_token_ctx * 1024 ** 2 / 2 - 1023 * head
    assert mm[0].flops + mm[1].flops == pytest.approx(expect, rel=1e-12)


def test_op_offload_copies_cpu_layers_from_a_32_token_micro_batch():
    s = configure("qwen2.5-32b", "rtx4060ti", n_ctx=8192)
    assert not [st for st in prefill_steps(s.placement, s.machine, 31, s.speed) if st.bound == "link"]
    copies = [st for st in prefill_steps(s.placement, s.machine, 1100, s.speed) if st.bound == "link"]
    cpu = s.placement.cpu
    # calibrated follows llama.cpp: the CPU layers' weights cross PCIe once per micro-batch (3 of them)
    assert s.speed.op_offload_transfers_per_ubatch and len(copies) == 3
    assert all(st.bytes_moved == cpu.dense_read_bytes + cpu.expert_bytes for st in copies)


def test_load_of_the_lessons_32b_split_worked_out_by_hand():
    # Qwen2.5 32B Q4_K_M on a 16 GB RTX 4060 Ti + DDR5-5600, -c 8192, --fit: -ngl 43 (42 blocks + the
    # output head on the GPU, 22 blocks in RAM). The placement's bytes are the inputs:
    #   GPU weights 12,917,817,344 B, GPU KV 1,409,286,144 B, host weights 6,927,540,224 B of which the
    #   token_embd is 437,944,320 B (a token reads one row: it never pages in whole), host KV 738,197,504 B.
    # First launch, drive 3.5 GB/s, PCIe 15.75 GB/s x 0.7 = 11.025 GB/s:
    #   copy to the GPU: bounded by the drive: 12,917,817,344 / 3.5e9 = 3.690805 s ("disk")
    #   clear the KV: GPU 1,409,286,144 / (0.7 x 288e9) = 0.006990 s; host 738,197,504 / (0.7 x 89.6e9) = 0.011770 s
    #   warm-up page-in of the CPU layers: (6,927,540,224 - 437,944,320) / 3.5e9 = 1.854170 s
    #   total 5.563735 s
    # Second launch (page cache): the copy reads RAM at 0.7 x 89.6 = 62.72 GB/s, so the link bounds it:
    #   12,917,817,344 / 11.025e9 = 1.171684 s ("link"); page-in 0; total 1.171684 + 0.018760 = 1.190444 s
    s = configure("qwen2.5-32b", "rtx4060ti", n_ctx=8192, speed="bandwidth-only")
    p = s.placement
    assert p.n_gpu_layers == 43 and p.gpus[0].weights_bytes == 12_917_817_344 and p.cpu.weights_bytes == 6_927_540_224
    first = load_steps(p, s.machine, speed=s.speed)
    copy = next(st for st in first if st.name.startswith("copy"))
    assert copy.s == pytest.approx(3.690805, abs=1e-6) and copy.bound == "disk" and copy.where == "PCIe"
    page = next(st for st in first if st.name.startswith("warm-up"))
    assert page.bytes_moved == 6_927_540_224 - 437_944_320 and page.s == pytest.approx(1.854170, abs=1e-6)
    assert total_s(first) == pytest.approx(5.563735, abs=2e-6)
    second = load_steps(p, s.machine, speed=s.speed, page_cache=True)
    copy2 = next(st for st in second if st.name.startswith("copy"))
    assert copy2.bound == "link" and copy2.s == pytest.approx(1.171684, abs=1e-6)
    assert total_s(second) == pytest.approx(1.190444, abs=2e-6)


def test_lessons_other_load_scenarios():
    # 8B on a 24 GB GPU: everything copied, nothing left to page in (token_embd stays, one row a token)
    s = configure("llama-3.1-8b", "rtx4090", n_ctx=8192)
    steps = load_steps(s.placement, s.machine, speed=s.speed)
    assert any(st.name.startswith("copy 32 blocks + output head") for st in steps)
    assert not any(st.name.startswith("warm-up") for st in steps)
    # 8B on Apple unified memory: nothing crosses PCIe; the mapped weights page in from the drive
    s = configure("llama-3.1-8b", "m4max", n_ctx=8192)
    steps = load_steps(s.placement, s.machine, speed=s.speed)
    assert not any(st.where == "PCIe" or "PCIe" in st.detail for st in steps)
    assert any("nothing is copied" in st.detail for st in steps)
    # CPU only: no copies; the whole file but token_embd pages in
    s = configure("llama-3.1-8b", "cpu-ddr5", n_ctx=8192)
    steps = load_steps(s.placement, s.machine, speed=s.speed)
    assert not any(st.name.startswith(("copy", "map")) for st in steps)
    assert next(st for st in steps if st.name.startswith("warm-up")).bound == "disk"


def test_the_seed_facade_no_longer_says_pcie_on_unified_memory():
    from inferlab.inference_trace import load_steps as seed_load_steps
    from inferlab.perf_model import MACHINES, MODELS, place

    mc = MACHINES["m4max"]
    rows = seed_load_steps(place(MODELS["llama-3.1-8b"], mc, n_ctx=8192), mc)
    assert rows and not any("PCIe" in r["detail"] for r in rows)
    mc = MACHINES["rtx4060ti"]
    rows = seed_load_steps(place(MODELS["qwen2.5-32b"], mc, n_ctx=8192), mc)
    assert any("PCIe" in r["detail"] for r in rows) and {"step", "bytes", "s", "detail"} <= set(rows[0])


def test_trace_reports_agree_with_the_speed_model_and_refuse_what_does_not_fit():
    r = trace("decode", "qwen2.5-32b", "rtx4060ti", n_ctx=8192, context=2000)
    assert r.fits and r.total_s == pytest.approx(r.speed_model_s, rel=1e-12)
    assert sum(r.by_bound_s.values()) == pytest.approx(r.total_s)
    kinds = {c.kv_type for c in r.curve}
    assert kinds == {"f16", "q8_0"}
    # the curve's f16 point at 2000 tokens is the same configuration: the same figure
    r2 = trace("decode", "qwen2.5-32b", "rtx4060ti", n_ctx=8192, context=2000, contexts=[0, 2000])
    pt = next(c for c in r2.curve if c.kv_type == "f16" and c.context_tokens == 2000)
    assert pt.step_s == pytest.approx(r.total_s, rel=1e-12)
    q8 = [c for c in r2.curve if c.kv_type == "q8_0"]
    assert q8[0].n_gpu_layers > r2.n_gpu_layers  # the smaller cache lets --fit offload more layers
    p = trace("prefill", "qwen2.5-32b", "rtx4060ti", n_ctx=8192, n_tokens=2000)
    assert p.total_s == pytest.approx(p.speed_model_s, rel=1e-12) and p.tok_per_s == pytest.approx(2000 / p.total_s)
    r.to_json()
    p.to_json()
    # -ngl 99 on a 16 GB card: no decode and no prefill (they would not run); the load stops at the allocation
    bad = trace("decode", "qwen2.5-32b", "rtx4060ti", n_ctx=8192, n_gpu_layers=99)
    assert not bad.fits and bad.steps == () and bad.total_s is None and bad.tok_per_s is None
    load = trace("load", "qwen2.5-32b", "rtx4060ti", n_ctx=8192, n_gpu_layers=99)
    assert load.steps[-1].name.startswith("allocation fails") and not any(st.name.startswith("copy") for st in load.steps)


def test_decode_beyond_the_allocated_cache_is_refused_with_the_numbers():
    with pytest.raises(InvalidValueError, match=r"batch 4 x context 4,096 = 16,384 cached tokens .* -c 8,192"):
        trace("decode", "llama-3.1-8b", "rtx4090", n_ctx=8192, context=4096, batch=4)
    with pytest.raises(InvalidValueError, match="exceeds the allocated cache"):
        trace("decode", "llama-3.1-8b", "rtx4090", n_ctx=8192, contexts=[0, 9000])
    with pytest.raises(InvalidValueError, match="do not fit in the KV cache"):
        trace("prefill", "llama-3.1-8b", "rtx4090", n_ctx=4096, n_tokens=5000)


def test_load_of_a_real_gguf_reads_its_header_bytes(tmp_path):
    pytest.importorskip("gguf")
    import os

    from _toy import DENSE
    from inferlab.models.gguf_writer import write_gguf

    path = tmp_path / "toy.gguf"
    write_gguf(DENSE, path, "F16")
    r = trace("load", str(path), "rtx4090")
    head = r.steps[0]
    # the header and tensor table are the file's bytes before its (aligned) tensor data
    tensor_bytes = sum(t.n_bytes for t in configure(str(path), "rtx4090").spec.tensors)
    assert head.name == "read header" and head.bytes_moved == os.path.getsize(path) - tensor_bytes > 0
    assert head.s == pytest.approx(head.bytes_moved / 3.5e9)
    assert r.second_launch[0].s == 0.0  # in the page cache


def test_a_file_larger_than_ram_is_not_in_the_page_cache_on_the_second_launch():
    # Llama 3.1 405B Q4_K_M: ~243 GB of weights against 64 GB of DDR5: the second launch reads the drive again
    r = trace("load", "llama-3.1-405b", "rtx4090", n_ctx=4096)
    assert r.second_launch_s == pytest.approx(r.total_s) and any("page cache" in n for n in r.notes)
    assert any("re-read from the drive on every token" in n for n in r.notes)
    small = trace("load", "qwen2.5-32b", "rtx4060ti", n_ctx=8192)
    assert small.second_launch_s < small.total_s / 3

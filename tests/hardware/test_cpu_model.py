"""cpu_model: the measured dequantize+dot rates (data/cpu_limits.json) and how they combine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferlab.errors import InvalidValueError, UnknownNameError
from inferlab.hardware.catalog import DEVICES, HOSTS
from inferlab.perf.cpu_model import (
    attach_rates,
    cpu_decode_rate_bytes_per_s,
    cpu_decode_rate_for_mix,
    cpu_decode_rate_for_placement,
    cpu_prefill_flops_per_s_for_placement,
    cpu_prefill_s,
    decode_overhead_s_per_layer,
    kernel_family,
    limits,
    measured_reference,
    nearest_reference,
    prefill_eff_vs_fp32_peak,
    rate_provenance,
    rates_label,
    reference_for,
    resolve_type,
    scaled_reference,
)
from inferlab.hardware.device import Device

HOST = Device("AMD EPYC", 25.0, 12.0, 0.1, backend="cpu", n_cores=2, notes="ISA: fma, f16c, avx2")


def test_every_reference_has_its_source_command_and_positive_rates():
    data = limits()
    assert data["references"], data
    for ref in data["references"]:
        assert ref["source"] and "benchmarks/cpu_decode_rates.py" in ref["command"] and ref["date"]
        assert set(ref["per_core_bytes_per_s"]) >= {"Q4_K", "Q6_K", "Q8_0", "F16"}
        assert all(v > 1e8 for v in ref["per_core_bytes_per_s"].values())  # at least 0.1 GB/s per core
        assert all(0 < e <= 1 for e in ref["parallel_efficiency"].values())
        assert ref["overhead_s_per_layer"] >= 0 and 0 < ref["decode_bw_eff"] <= 1


def test_rate_grows_with_threads_up_to_the_physical_cores_only():
    one = cpu_decode_rate_bytes_per_s(HOST, "Q4_K", 1)
    two = cpu_decode_rate_bytes_per_s(HOST, "Q4_K", 2)
    assert one < two <= 2 * one
    assert cpu_decode_rate_bytes_per_s(HOST, "Q4_K", 8) == two  # 2 cores: more threads add nothing
    assert cpu_decode_rate_bytes_per_s(HOST, "Q4_K") == two  # default: all cores


def test_types_without_a_measurement_use_a_stand_in_and_unknown_ones_are_errors():
    assert cpu_decode_rate_bytes_per_s(HOST, "Q4_0", 1) == cpu_decode_rate_bytes_per_s(HOST, "Q4_K", 1)
    with pytest.raises(UnknownNameError, match="Q4_K"):
        cpu_decode_rate_bytes_per_s(HOST, "Q9_Z", 1)
    with pytest.raises(InvalidValueError, match="n_threads"):
        cpu_decode_rate_bytes_per_s(HOST, "Q4_K", 0)
    with pytest.raises(InvalidValueError, match="cpu devices"):
        cpu_decode_rate_bytes_per_s(DEVICES["rtx4090"], "Q4_K", 1)


def test_a_mix_takes_the_time_of_each_part():
    a, b = cpu_decode_rate_bytes_per_s(HOST, "Q4_K"), cpu_decode_rate_bytes_per_s(HOST, "Q8_0")
    mix = cpu_decode_rate_for_mix(HOST, {"Q4_K": 3e6, "Q8_0": 1e6})
    assert mix == pytest.approx(4e6 / (3e6 / a + 1e6 / b))
    assert min(a, b) <= mix <= max(a, b)
    with pytest.raises(InvalidValueError):
        cpu_decode_rate_for_mix(HOST, {})


def test_placement_adapter_reads_the_quant_plan():
    from inferlab.models.catalog import MODELS
    from inferlab.perf_model import place

    m = MODELS["llama-2-7b"]
    machine = replace(__import__("inferlab.hardware.catalog", fromlist=["MACHINES"]).MACHINES["cpu-ddr5"])
    p = place(m, machine, "Q8_0")
    # every matrix Q8_0 (not repacked on x86), 8 threads; llama.cpp splits a decode matmul in chunks
    # of 64 rows and the step waits for the busiest thread: rows of 4096 (q, k, v, o, down: 64
    # chunks, 8 each) split evenly; gate/up, 11008 rows = 172 chunks: 22 for the busiest thread,
    # 1408 rows against 1376 (x 11264 / 11008); the output head, 32000 rows = 500 chunks: 63, 4032
    # rows against 4000 (x 32256 / 32000). Weights: per layer attention 4 x 4096^2 = 67,108,864,
    # gate+up 90,177,536, down 45,088,768; head 131,072,000 (token_embd is a row lookup):
    total = 32 * (67_108_864 + 90_177_536 + 45_088_768) + 131_072_000
    split = 32 * (67_108_864 + 90_177_536 // 11008 * 11264 + 45_088_768) + 4096 * 32256
    assert total == 6_607_077_376 and split == 6_675_234_816
    assert cpu_decode_rate_for_placement(HOSTS["ddr5-dual"], p) == pytest.approx(
        cpu_decode_rate_bytes_per_s(HOSTS["ddr5-dual"], "Q8_0") * total / split)  # 0.9898 x the Q8_0 rate


def _host_of(ref: dict) -> Device:
    """A 2-core host of the reference's ISA class (the class picks the reference)."""
    return replace(HOST, notes=f"ISA: fma, {ref['simd']}")


def test_circular_regression_the_model_reproduces_the_measured_2_thread_rates():
    # circular: parallel_efficiency was computed from these same 2-thread rates, so this only checks
    # that the stored figures and the formula rate x threads x efficiency stay consistent (a regression test)
    for ref in limits()["references"]:
        for ty, rate in ref["rates_bytes_per_s_by_threads"]["2"].items():
            assert cpu_decode_rate_bytes_per_s(_host_of(ref), ty, 2) == pytest.approx(rate, rel=0.01), ref["id"]


def test_in_sample_regression_the_fit_explains_every_measured_run_within_25_percent():
    """In-sample: the rates and overhead were fitted on these measurements. Seconds per token from the stored rates and overhead against the stored measurements (this
    VM varies 10-20 % from run to run, even alone on its cores; the Zen 4 fit pools two runs of
    three shapes, worst residual 22 %)."""
    from inferlab.hardware.validate import TOY_MODELS

    for ref in limits()["references"]:
        host = _host_of(ref)
        for m in ref["measurements"]:
            n_layer = TOY_MODELS[m["model"]].n_layer
            predicted_s = n_layer * ref["overhead_s_per_layer"] + m["weight_bytes_per_token"] / cpu_decode_rate_bytes_per_s(host, m["type"], m["threads"])
            assert predicted_s * m["tg_tok_s"] == pytest.approx(1.0, abs=0.25), (ref["id"], m)


def test_reference_choice_and_overhead():
    refs = limits()["references"]
    assert len({r["simd"] for r in refs}) == len(refs)  # one reference per ISA class
    for ref in refs:
        assert reference_for(_host_of(ref)) is ref and measured_reference(_host_of(ref)) is ref
        assert decode_overhead_s_per_layer(_host_of(ref)) < 1e-3  # well under a millisecond per block
    # an ISA class nobody measured: no measured reference; the first entry stands in
    arm = replace(HOST, name="Ampere Altra", notes="ISA: neon")
    assert measured_reference(arm) is None and nearest_reference(arm) is None and reference_for(arm) is refs[0]
    assert "a stand-in (no reference of this ISA class)" in rates_label(arm)
    by_simd = {r["simd"]: r for r in refs}
    # an AMX Xeon (detected ISA features) also runs AVX-512 and AVX2: with no AMX reference stored it
    # takes the AVX-512 one (the kernels it runs without AMX), not the first entry (Zen 3, AVX2), and says so
    xeon = replace(HOST, name="Intel Xeon", notes="", isa=("avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"))
    assert "amx" not in by_simd and {"avx2", "avx512"} <= set(by_simd)
    assert measured_reference(xeon) is None
    assert nearest_reference(xeon) is by_simd["avx512"] and reference_for(xeon) is by_simd["avx512"]
    assert by_simd["avx512"] is not refs[0]  # the test tells the two fallbacks apart
    assert "the nearest ISA class measured: this CPU has amx" in rates_label(xeon) and by_simd["avx512"]["id"] in rates_label(xeon)
    # an AVX-512 CPU never falls to the narrower class while its own is stored
    assert nearest_reference(replace(xeon, isa=("avx2", "avx512f"))) is by_simd["avx512"]
    # the AVX-512 CPU's kernels are faster per core than the AVX2 one's (Zen 4 vs Zen 3, measured)
    if {"avx2", "avx512"} <= set(by_simd):
        for ty in ("Q4_K", "Q8_0", "F16"):
            assert by_simd["avx512"]["per_core_bytes_per_s"][ty] > by_simd["avx2"]["per_core_bytes_per_s"][ty]


def test_a_reference_that_measured_q4_0_and_q4_1_uses_them_not_the_stand_in():
    for ref in limits()["references"]:
        host = _host_of(ref)
        for ty in ("Q4_0", "Q4_1"):
            own = ty in ref["per_core_bytes_per_s"]
            expected = ref["per_core_bytes_per_s"][ty if own else "Q4_K"]
            assert cpu_decode_rate_bytes_per_s(host, ty, 1) == pytest.approx(expected), (ref["id"], ty)
        if "lacks" in ref:
            assert "Q4_1" in ref["lacks"]  # an entry without its own Q4_1 figures says so


def test_prefill_time_is_each_types_flops_at_its_share_of_the_peak_of_the_threads_used():
    ref = next((r for r in limits()["references"] if r.get("prefill_eff_vs_fp32_peak_by_type")), None)
    if ref is None:
        pytest.skip("no reference with per-type prefill efficiencies")
    host = replace(_host_of(ref), fp32_tflops=0.5)
    effs = ref["prefill_eff_vs_fp32_peak_by_type"]
    assert prefill_eff_vs_fp32_peak(host, "Q4_1") == effs["Q4_1"]
    assert prefill_eff_vs_fp32_peak(host, "q5_k") == effs["Q6_K"]  # the decode stand-ins apply
    # nobody measured TQ1_0: its family (ternary) has no measured member, k-quant (where it falls
    # back) has Q4_K on every reference: Q4_K's share, as for decode
    assert prefill_eff_vs_fp32_peak(host, "TQ1_0") == effs["Q4_K"]
    got = cpu_prefill_s(host, {"Q4_1": 1e12, "Q4_0": 2e12}, 2)
    assert got == pytest.approx(1e12 / (effs["Q4_1"] * 0.5e12) + 2e12 / (effs["Q4_0"] * 0.5e12))
    assert cpu_prefill_s(host, {"Q4_1": 1e12}, 1) == pytest.approx(2 * cpu_prefill_s(host, {"Q4_1": 1e12}, 2))  # half the cores
    assert cpu_prefill_s(host, {"Q4_1": 1e12}, 8) == cpu_prefill_s(host, {"Q4_1": 1e12}, 2)  # no more than the cores
    zen3 = _host_of(limits()["references"][0])  # no per-type figures: its one efficiency for every type
    assert prefill_eff_vs_fp32_peak(zen3, "Q4_1") == limits()["references"][0]["prefill_eff_vs_fp32_matmul"]
    with pytest.raises(InvalidValueError, match="cpu devices"):
        cpu_prefill_s(DEVICES["rtx4090"], {"Q4_1": 1.0})


def test_placement_adapters_count_a_tied_head_and_time_prefill_by_block_types():
    from inferlab.models.catalog import MODELS
    from inferlab.perf_model import place

    machine = __import__("inferlab.hardware.catalog", fromlist=["MACHINES"]).MACHINES["cpu-ddr5"]
    m = replace(MODELS["llama-2-7b"], tied_embeddings=True)
    p = place(m, machine, "type:Q4_1")
    host = HOSTS["ddr5-dual"]
    assert cpu_decode_rate_for_placement(host, p) == pytest.approx(cpu_decode_rate_bytes_per_s(host, "Q4_1"), rel=0.05)
    rate = cpu_prefill_flops_per_s_for_placement(host, p)
    assert rate == pytest.approx(1e12 / cpu_prefill_s(host, {"Q4_1": 1e12}))  # every block weight is Q4_1


def test_calibrated_speed_model_uses_the_cpus_own_overhead_prefill_rate_and_the_head_once():
    from inferlab.perf.calibration import CALIBRATED
    from inferlab.hardware.catalog import MACHINES
    from inferlab.models.catalog import MODELS
    from inferlab.perf_model import place
    from inferlab.perf.speed import SpeedModel, decode_step_time, prefill_time

    refs = {r["simd"]: r for r in limits()["references"]}
    base = MACHINES["cpu-ddr5"]
    m = MODELS["llama-2-7b"]
    for simd, ref in refs.items():
        machine = replace(base, ram=replace(base.ram, notes=f"ISA: fma, {simd}"))
        p = place(m, machine, "Q4_K_M", n_ctx=640)
        d = decode_step_time(p, machine, 64, 1, CALIBRATED())
        assert d["per_device"][0]["overhead_s"] == pytest.approx(m.n_layers * ref["overhead_s_per_layer"])  # its own reference's
        f = prefill_time(p, machine, 128, CALIBRATED())
        flops = 128 * p.devices[0].flops_per_token - 127 * 2.0 * m.vocab_size * m.d_model  # the head for the last token only
        flops += 128 * p.devices[0].attn_flops_per_token_ctx * 64
        rate = cpu_prefill_flops_per_s_for_placement(machine.ram, p)
        assert f["per_device"][0]["compute_s"] == pytest.approx(flops / rate)
    # without the hooks (the lesson's model) nothing changes: ε·P and the head for every token
    lesson = SpeedModel("plain", attention_flops=False)
    p = place(m, base, "Q4_K_M", n_ctx=640)
    assert prefill_time(p, base, 128, lesson)["per_device"][0]["compute_s"] == pytest.approx(
        128 * p.devices[0].flops_per_token / (base.ram.fp16_flops * 0.5))


# ------------------------------------------------------------------ every ggml type has a CPU cost

def _all_ggml_types() -> list[str]:
    import json
    from importlib import resources

    return [t["type"] for t in json.loads(resources.files("inferlab.data").joinpath("ggml_types.json").read_text())["ggml_types"]]


def test_every_ggml_type_has_a_kernel_family_and_a_cpu_cost_on_every_reference():
    """Issue 15 class 1: each of the 30 types of ggml_types.json (F32, IQ1-IQ4, MXFP4, TQ1/TQ2,
    NVFP4, Q1_0...) gets a decode rate and a prefill share on every reference; a measured type is
    its own figure, any other a measured type of the reference, named in the provenance."""
    types = _all_ggml_types()
    assert len(types) == 30 and {"F32", "IQ1_S", "IQ2_XXS", "MXFP4", "TQ1_0", "NVFP4", "Q2_0"} <= set(types)
    for ref in limits()["references"]:
        host = _host_of(ref)
        measured = ref["per_core_bytes_per_s"]
        for ty in types:
            kernel_family(ty)  # every type is in a family (a new type in ggml_types.json fails here)
            key, why = resolve_type(measured, ty)
            assert key in measured
            assert (why == "") == (ty in measured), (ty, why)
            if why:
                assert f"stand-in {key}" in why and ty in why
            rate = cpu_decode_rate_bytes_per_s(host, ty, 1)
            assert rate == measured[key]  # the stand-in's own per-core rate, not a made-up one
            assert 0 < prefill_eff_vs_fp32_peak(host, ty) <= 1
        said = rate_provenance(host, types)
        assert ref["id"] in said[0]
        shares = ref.get("prefill_eff_vs_fp32_peak_by_type") or {}
        prompt_own = [ty for ty in types if shares and ty not in shares
                      and resolve_type(shares, ty, prefill=True)[0] != resolve_type(measured, ty)[0]]
        assert ("Q5_0" in prompt_own) == bool(shares)  # Q5_0's prompt kernel differs from its decode one wherever shares exist
        # one sentence per stand-in, and one per type whose prompt matmuls take another one
        assert len(said) == 1 + sum(ty not in measured for ty in types) + len(prompt_own)


def test_q5_0_and_q5_1_decode_like_q4_1_and_q5_0_prompts_take_q8_0s_tinyblas_share():
    """llama.cpp's x86 kernels: ggml_vec_dot_q5_0_q8_0 / q5_1_q8_1 are the plain one-block-a-loop
    nibble unpack of Q4_1's (plus the fifth bit), never repacked, so their decode rate is Q4_1's
    (where Q4_1 was not measured, Q4_1's own stand-in); llamafile_sgemm runs Q5_0 prompt matmuls
    with tinyBLAS_Q0_AVX, Q8_0's kernel, and Q5_1's with the vec_dot loop, as Q4_1's. Until
    2026-12-03 both took Q6_K, whose share is 2.8x Q5_0's measured one on an AMX Xeon."""
    for ref in limits()["references"]:
        host, rates = _host_of(ref), ref["per_core_bytes_per_s"]
        q4_1 = resolve_type(rates, "Q4_1")[0]  # Q4_1 itself, or its stand-in (Q4_K on Zen 3)
        for ty in ("Q5_0", "Q5_1"):
            assert cpu_decode_rate_bytes_per_s(host, ty, 1) == rates[q4_1], (ref["id"], ty)
        shares = ref.get("prefill_eff_vs_fp32_peak_by_type")
        if shares:
            assert prefill_eff_vs_fp32_peak(host, "Q5_0") == shares["Q8_0"] != shares["Q6_K"]
            assert prefill_eff_vs_fp32_peak(host, "Q5_1") == shares[resolve_type(shares, "Q4_1")[0]]
            said = rate_provenance(host, ["Q5_0", "Q5_1"])
            assert [s for s in said if s.startswith("prompt matmuls")] == [
                "prompt matmuls: Q5_0 (legacy kernels) not measured: stand-in Q8_0 (same kernel family)"]
    # a table that measured the type itself never takes a stand-in, prompt or decode
    assert resolve_type({"Q5_0": 1.0, "Q8_0": 2.0}, "Q5_0", prefill=True) == ("Q5_0", "")


def test_prompt_stand_ins_follow_llamacpps_x86_prompt_kernels():
    """The prompt matmul's own kernel picks the stand-in of its share (data: prefill_stand_ins):
    tinyBLAS_Q0_AVX runs Q8_0 and Q5_0; Q4_1 and Q5_1 the plain vec_dot loop; Q4_0 and IQ4_NL the
    repacked 8x8 gemm; Q6_K's int8 dot against Q8_K is Q4_K's, not Q8_0's tinyBLAS. Decode:
    IQ4_NL is repacked like Q4_0 on AVX2/AVX-512."""
    every = dict.fromkeys(["F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "IQ4_NL"], 0.5)
    for ty, prompt_stand_in in {"Q8_0": "Q5_0", "Q5_0": "Q8_0", "Q4_1": "Q5_1", "Q6_K": "Q4_K", "Q4_0": "IQ4_NL",
                                "IQ4_NL": "Q4_0"}.items():
        table = {k: v for k, v in every.items() if k != ty}
        assert resolve_type(table, ty, prefill=True)[0] == prompt_stand_in, ty
    assert resolve_type({k: v for k, v in every.items() if k != "IQ4_NL"}, "IQ4_NL")[0] == "Q4_0"
    # where the first choice was not measured either, the old stand-in comes next
    assert resolve_type({"Q4_K": 1.0, "Q6_K": 1.0, "Q4_0": 1.0}, "Q8_0", prefill=True)[0] == "Q6_K"
    assert resolve_type({"Q4_K": 1.0, "Q4_0": 1.0}, "Q4_1", prefill=True)[0] == "Q4_K"


def test_prompt_stand_ins_on_the_xeon_that_measured_every_type():
    """Held out: the rule above was chosen from llama.cpp's source before this calibration (every
    type the calibrate default measures, an AMX Xeon VM, 2026-12-03) was read. Each changed type is
    left out and timed by its stand-in from the other 24; the share it gets is nearer its own than
    the old stand-in's. By hand from tests/data/xeon_full_calibration_rates.json (shares of the fp32
    peak): Q8_0 0.72 -> Q5_0 0.58 (-19 %; Q6_K 2.04: +182 %); Q4_1 0.30 -> Q5_1 0.25 (-17 %; Q4_K
    1.34: +348 %); Q6_K 2.04 -> Q4_K 1.34 (-34 %; Q8_0: -65 %); IQ4_NL 1.16 -> Q4_0 1.18 (+2 %;
    Q4_K: +16 %); Q4_0 1.18 -> IQ4_NL 1.16 (-2 %; Q4_K: +14 %). Decode, IQ4_NL 8.64 GB/s a core ->
    Q4_0 8.32 (-4 %; Q4_K 7.98: -8 %)."""
    import json

    from _paths import DATA

    xeon = json.loads((DATA / "xeon_full_calibration_rates.json").read_text())
    shares, rates = xeon["prefill_eff_vs_fp32_peak_by_type"], xeon["per_core_bytes_per_s"]
    assert len(rates) == len(shares) == 25

    def err(table: dict, ty: str, prefill: bool) -> float:
        rest = {k: v for k, v in table.items() if k != ty}
        return rest[resolve_type(rest, ty, prefill=prefill)[0]] / table[ty] - 1

    old = {"Q8_0": "Q6_K", "Q4_1": "Q4_K", "Q6_K": "Q8_0", "IQ4_NL": "Q4_K", "Q4_0": "Q4_K"}
    for ty, before in old.items():
        now = err(shares, ty, True)
        assert abs(now) < abs(shares[before] / shares[ty] - 1), (ty, now)
        assert abs(now) <= 0.35, (ty, now)
    assert abs(err(rates, "IQ4_NL", False)) < abs(rates["Q4_K"] / rates["IQ4_NL"] - 1)


def test_prompt_stand_ins_held_out_on_a_zen4_that_measured_every_type():
    """Held out twice over: the prompt stand-ins above were chosen from llama.cpp's source and scored
    on the Xeon before this Zen 4 VM (every type, 2026-12-04) was measured, and left unchanged after.
    By hand from tests/data/zen4_full_calibration_rates.json (shares of the fp32 peak): Q8_0 0.75 ->
    Q5_0 0.65 (-13 %; the old Q6_K 1.44: +92 %); Q4_1 0.29 -> Q5_1 0.25 (-13 %; Q4_K 1.20: +314 %);
    Q6_K 1.44 -> Q4_K 1.20 (-17 %; Q8_0 0.75: -48 %). Not better here: the repacked-gemm pair,
    IQ4_NL 1.50 -> Q4_0 1.18 (-21 %; Q4_K: -20 %) and Q4_0 1.18 -> IQ4_NL 1.50 (+27 %; Q4_K: +2 %),
    published as it came out (README) and only bounded below."""
    import json

    from _paths import DATA

    zen4 = json.loads((DATA / "zen4_full_calibration_rates.json").read_text())
    shares = zen4["prefill_eff_vs_fp32_peak_by_type"]
    assert len(shares) == len(zen4["per_core_bytes_per_s"]) == 25

    def err(ty: str) -> float:
        rest = {k: v for k, v in shares.items() if k != ty}
        return rest[resolve_type(rest, ty, prefill=True)[0]] / shares[ty] - 1

    for ty, before in {"Q8_0": "Q6_K", "Q4_1": "Q4_K", "Q6_K": "Q8_0"}.items():
        assert abs(err(ty)) < abs(shares[before] / shares[ty] - 1), (ty, err(ty))
        assert abs(err(ty)) <= 0.20, (ty, err(ty))
    for ty in ("IQ4_NL", "Q4_0"):
        assert abs(err(ty)) <= 0.30, (ty, err(ty))


@pytest.mark.parametrize("cpu", ["xeon", "zen4"])
def test_quick_types_time_the_other_types_on_both_cpus_that_measured_every_type(cpu):
    """`calibrate --types quick` holds one IQ grid type (IQ2_XXS), Q3_K and IQ4_XS: from the common
    presets' types alone every grid type took Q4_K's bytes a second, by hand from the two files
    +135 ... +260 % fast on the Xeon (IQ2_S 3.40 vs Q4_K 7.98 GB/s a core) and +447 ... +760 % on the
    Zen 4 (IQ1_S 2.62 vs 22.58). From IQ2_XXS (Xeon 2.80, Zen 4 3.31 GB/s): IQ1_S +26 % / +26 %,
    IQ2_S -18 % / -20 %, IQ3_XXS -16 % / -16 %. The worst of the rest: TQ1_0 from Q3_K, +62 % / +88 %."""
    import json

    from _paths import DATA

    from inferlab.hardware.calibrate import QUICK_TYPES

    rates = json.loads((DATA / f"{cpu}_full_calibration_rates.json").read_text())["per_core_bytes_per_s"]
    known = {k: v for k, v in rates.items() if k in QUICK_TYPES}
    assert len(known) == len(QUICK_TYPES)
    errors = {ty: known[resolve_type(known, ty)[0]] / rate - 1 for ty, rate in rates.items() if ty not in known}
    grid = {ty: e for ty, e in errors.items() if kernel_family(ty) == "iq-grid"}
    assert len(grid) == 6 and max(abs(e) for e in grid.values()) <= 0.30, grid
    assert max(abs(e) for e in errors.values()) <= 1.0, errors


def test_stand_ins_stay_in_the_kernel_family_when_it_has_a_measured_member():
    table = {"Q4_K": 1.0, "IQ3_XXS": 2.0, "IQ4_NL": 3.0, "F16": 4.0, "TQ2_0": 5.0}
    assert resolve_type(table, "IQ2_XXS")[0] == "IQ3_XXS"  # the grid-codebook kernels
    assert resolve_type(table, "IQ1_M")[0] == "IQ3_XXS"
    assert resolve_type(table, "MXFP4")[0] == "IQ4_NL"  # the 16-value table shuffle (kvalues_mxfp4 like iq4nl)
    assert resolve_type(table, "NVFP4")[0] == "IQ4_NL"
    assert resolve_type(table, "TQ1_0")[0] == "TQ2_0"
    assert resolve_type(table, "F32")[0] == "F16" and resolve_type(table, "BF16")[0] == "F16"
    assert "same kernel family" in resolve_type(table, "IQ2_S")[1]
    assert "nearest measured kernel family: k-quant" in resolve_type({"Q4_K": 1.0}, "IQ2_S")[1]
    with pytest.raises(UnknownNameError, match="ggml type"):
        resolve_type(table, "Q9_Z")


def _fit(*args: str) -> dict:
    import json

    from click.testing import CliRunner

    from inferlab.cli.main import cli

    res = CliRunner().invoke(cli, ["fit", *args, "--json"])
    assert res.exit_code == 0, (args, res.output)
    return json.loads(res.output)


@pytest.mark.parametrize("quant", ["IQ2_M", "IQ1_S", "IQ2_XXS", "IQ3_XXS", "TQ1_0", "type:F32", "type:MXFP4", "type:NVFP4",
                                   "type:TQ2_0", "type:BF16", "type:Q1_0"])
def test_fit_with_every_layer_on_the_cpu_never_refuses_a_type(quant):
    r = _fit("llama-2-7b", "--on", "cpu-ddr5", "--quant", quant)
    assert r["fits"] and r["decode"]["tok_per_s"] > 0 and r["prefill"]["tok_per_s"] > 0


def test_gpt_oss_mxfp4_moe_with_experts_on_the_cpu():
    """gpt-oss's MXFP4 experts are exactly what --n-cpu-moe keeps in RAM: the CPU times them with
    MXFP4's stand-in (IQ4_NL's family on a reference without MXFP4)."""
    all_gpu = _fit("gpt-oss-20b", "--on", "rtx4090", "--quant", "MXFP4_MOE", "--ngl", "99", "--ctx", "8192")
    some_cpu = _fit("gpt-oss-20b", "--on", "rtx4090", "--quant", "MXFP4_MOE", "--ngl", "99", "--ctx", "8192", "--n-cpu-moe", "12")
    assert some_cpu["devices"][0]["weights_bytes"] > all_gpu["devices"][0]["weights_bytes"] + 1e9  # 12 blocks of experts in RAM
    assert 0 < some_cpu["decode"]["tok_per_s"] < all_gpu["decode"]["tok_per_s"]  # the CPU's share of each step costs time


def test_attached_rates_are_the_devices_own_and_scaling_follows_calibrates_figures():
    ref = limits()["references"][0]
    here = {"fp32_matmul_gflops_per_core": 100.0, "int8_matmul_gops_per_core": 300.0}
    theirs = {"fp32_matmul_gflops_per_core": 50.0, "int8_matmul_gops_per_core": 100.0}
    scaled = scaled_reference(dict(ref, calibrate_figures=theirs), here, rid="test-profile", date="2026-12-01T00:00:00+00:00")
    # quantized kernels follow int8 (x3), float ones fp32 (x2); the per-layer overhead shrinks by the fp32 ratio
    assert scaled["per_core_bytes_per_s"]["Q4_K"] == pytest.approx(3 * ref["per_core_bytes_per_s"]["Q4_K"])
    assert scaled["per_core_bytes_per_s"]["F16"] == pytest.approx(2 * ref["per_core_bytes_per_s"]["F16"])
    assert scaled["overhead_s_per_layer"] == pytest.approx(ref["overhead_s_per_layer"] / 2)
    assert "test-profile" in scaled["provenance"] and ref["id"] in scaled["provenance"]
    bare = scaled_reference(dict(ref, calibrate_figures={}), here, rid="p2", date="d")  # no figures on the reference: nothing scaled, said
    assert bare["per_core_bytes_per_s"] == ref["per_core_bytes_per_s"] and "not scaled" in bare["provenance"]
    # the stored Zen 3 entry recorded an fp32 figure only (75 GFLOP/s a core): float kernels x 100/75, int8 ones as measured
    zen3 = scaled_reference(ref, here, rid="p3", date="d")
    assert zen3["per_core_bytes_per_s"]["F16"] == pytest.approx(ref["per_core_bytes_per_s"]["F16"] * 100 / 75)
    assert zen3["per_core_bytes_per_s"]["Q4_K"] == ref["per_core_bytes_per_s"]["Q4_K"] and "not scaled by int8" in zen3["provenance"]
    dev = replace(HOST, source="test: attached rates")
    before = cpu_decode_rate_bytes_per_s(dev, "Q4_K", 1)
    attach_rates(dev, scaled)
    assert reference_for(dev) is scaled and reference_for(replace(dev, memory_gb=8.0)) is scaled  # derived devices keep them
    assert cpu_decode_rate_bytes_per_s(dev, "Q4_K", 1) == pytest.approx(3 * before)
    assert "test-profile" in rate_provenance(dev, ["Q4_K"])[0]
    assert reference_for(HOST) is not scaled  # other devices are untouched


# ------------------------------------------------------------------ how llama.cpp splits a decode matmul over threads

@pytest.mark.parametrize("rows, threads, repacked, busiest", [
    # plain path (ggml-cpu.c): chunks of 64 rows; fewer than 4 a thread -> one chunk per thread
    (576, 2, False, 320),    # 9 chunks >= 8: 5 for one thread = 320 rows (288 is the even half)
    (512, 2, False, 256),    # 8 chunks: 4 each, even
    (192, 2, False, 96),     # 3 chunks < 8: re-chunked by thread, ceil(192 / 2) = 96
    (500, 2, False, 252),    # ceil(500 / 64) = 8 chunks, not fewer than 8, of ceil(500 / 8) = 63 rows (ggml's dr0): 4 each, 252 (not 250)
    (4096, 6, False, 704),   # 64 chunks, ceil(64 / 6) = 11 for the busiest: 704 (682.7 even)
    (11008, 8, False, 1408), # 172 chunks, 22 for the busiest (Llama-2-7B's FFN on 8 threads)
    (1000, 1, False, 1000),  # one thread does all
    # repacked path (repack.cpp): 4 chunks a thread of ceil(rows / (4 nth)) rows
    (576, 2, True, 288),     # chunks of 72 rows, 8 of them: 4 each, even
    (1024, 12, True, 88),    # chunks of ceil(1024 / 48) = 22 rows, 47 chunks, 4 for the busiest: 88
])
def test_the_busiest_threads_rows_follow_llama_cpps_split(rows, threads, repacked, busiest):
    from inferlab.perf.cpu_model import busiest_thread_rows

    assert busiest_thread_rows(rows, threads, repacked) == busiest


def test_which_types_llama_cpp_repacks_and_what_the_split_costs():
    from inferlab.perf.cpu_model import is_repacked, split_bytes

    # x86 repacks Q4_0, Q4_K, IQ4_NL (and MXFP4; Q2_K with AVX-512) when the rows are a multiple of 8;
    # Q5_0, Q8_0, Q6_K and Q4_1 keep the plain path; ARM also repacks Q8_0 and Q6_K
    assert is_repacked("avx2", "Q4_K", 576) and not is_repacked("avx2", "Q4_K", 580)
    assert not is_repacked("avx2", "Q5_0", 576) and not is_repacked("avx2", "Q8_0", 576) and not is_repacked("avx2", "Q2_K", 512)
    assert is_repacked("avx512", "Q2_K", 512) and is_repacked("neon", "Q8_0", 576)
    # SmolLM2-like layer on 2 threads: a Q5_0 576-row projection of 1 MB weighs 320 / 288 = 1.111 MB, a
    # Q4_K one of the same rows 1 MB (repacked: even), 192 rows of Q5_0 1 MB (re-chunked by thread: even)
    got = split_bytes([("Q5_0", 1e6, 576), ("Q4_K", 1e6, 576), ("Q5_0", 1e6, 192)], 2, "avx512")
    assert got == pytest.approx({"Q5_0": 1e6 * 320 / 288 + 1e6, "Q4_K": 1e6})
    assert split_bytes([("Q5_0", 1e6, 576)], 1, "avx512") == {"Q5_0": 1e6}  # one thread: nothing uneven


def _toy_thin_matrices(ty: str, bytes_per_weight: float) -> list[tuple[str, float, int]]:
    """toy-thin's decode matrices (512 wide, 24 layers, n_ff 1536, 4 KV heads of 64, 32000 tokens) as
    (type, bytes, rows): per layer q, k, v, o, gate, up, down, then the output head."""
    per_layer = ((512, 512), (256, 512), (256, 512), (512, 512), (1536, 512), (1536, 512), (512, 1536))
    return [(ty, r * c * bytes_per_weight, r) for r, c in per_layer * 24] + [(ty, 32000 * 512 * bytes_per_weight, 32000)]


@pytest.mark.parametrize("ty, simd, threads, chunks", [
    # plain path, 2 threads: 512 rows -> 8 chunks of 64 (not fewer than 4 a thread); 256 -> 4, fewer:
    # one a thread, 2; 1536 -> 24; the 32000-row head -> 500. A layer 8 + 2 + 2 + 8 + 24 + 24 + 8 = 76,
    # x 24 = 1824, + 500 = 2324
    ("Q6_K", "avx2", 2, 2324),
    # 4 threads: 512 and 256 rows -> fewer than 16 chunks: one a thread, 4 each; a layer 4 x 5 + 24 x 2
    # = 68, x 24 = 1632, + 500 = 2132
    ("Q6_K", "avx2", 4, 2132),
    # repacked (Q4_0 on x86): 4 chunks a thread of ceil(rows / 8) rows, 8 for every matrix here:
    # 7 x 8 x 24 + 8 = 1352
    ("Q4_0", "avx2", 2, 1352),
    ("Q6_K", "avx2", 1, 0),  # one thread takes its chunks one after another: none counted
])
def test_the_chunks_a_decode_step_hands_its_threads_follow_llama_cpps_split(ty, simd, threads, chunks):
    from inferlab.perf.cpu_model import decode_chunks

    assert decode_chunks(_toy_thin_matrices(ty, 1.0), threads, simd) == chunks


def test_a_chunk_started_in_dram_costs_what_calibrate_measured():
    """A profile with no cache ramp (lscpu's L3, 32 MiB) and 0.8 us a chunk started in DRAM on 2
    threads. toy-thin as Q6_K (210 bytes a 256 weights): 91,881,472 weights, 75,371,520 bytes;
    41,817,088 of them past the L3, a share of 0.554813; 2324 chunks (the test above): 0.8e-6 x
    0.554813 x 2324 = 1.031508 ms a token, added to the kernels' seconds. One thread, a step in the
    cache, or a reference without the figure: none."""
    from inferlab.perf.cpu_model import cpu_decode_compute_s, dram_chunk_s

    dev = replace(HOST, source="test: chunk starts")
    ref = dict(limits()["references"][0], id="chunks", date="2026-12-07", l3_bytes=32 * 2**20, dram_chunk_s_by_threads={"2": 0.8e-6})
    attach_rates(dev, ref)
    mats = _toy_thin_matrices("Q6_K", 210 / 256)
    assert sum(b for _, b, _ in mats) == pytest.approx(75_371_520)
    assert dram_chunk_s(dev, mats, 2) == pytest.approx(1.031508e-3, rel=1e-5)
    assert dram_chunk_s(dev, mats, 1) == 0.0
    assert dram_chunk_s(dev, [(t, b / 4, r) for t, b, r in mats], 2) == 0.0  # 18.8 MB: in the L3
    bare = replace(HOST, source="test: no chunk figure")
    attach_rates(bare, dict(ref, id="bare", dram_chunk_s_by_threads={}))
    assert dram_chunk_s(bare, mats, 2) == 0.0
    assert cpu_decode_compute_s(dev, mats, 2) == pytest.approx(cpu_decode_compute_s(bare, mats, 2) + 1.031508e-3, rel=1e-5)


def test_dram_stall_counts_only_the_bytes_the_l3_cannot_hold_and_only_where_measured():
    from inferlab.perf.cpu_model import dram_stall_s

    dev = replace(HOST, source="test: stall rates")
    ref = dict(limits()["references"][0], id="stall", date="2026-12-01", l3_bytes=32 * 2**20,
               dram_stall_s_per_byte_by_threads={"1": 0.0, "2": 1e-11})
    attach_rates(dev, ref)
    # 100 MB a step on 2 threads: (100e6 - 33,554,432) x 1e-11 s = 0.66446 ms; 1 thread: no stall fitted
    assert dram_stall_s(dev, 100e6, 2) == pytest.approx((100e6 - 33_554_432) * 1e-11)
    assert dram_stall_s(dev, 100e6, 1) == 0.0 and dram_stall_s(dev, 20e6, 2) == 0.0  # inside the L3: none
    assert dram_stall_s(HOST, 1e9, 2) == 0.0  # a stored reference measured none


def test_past_the_cache_ramp_all_of_a_steps_bytes_wait_on_dram():
    """A profile whose ladder put the ramp at 80-120 MB, 30 ps a byte on 2 threads: 60 MB, none;
    100 MB, half of its bytes (share (100 - 80) / 40 = 0.5): 50e6 x 3e-11 = 1.5 ms; 200 MB, all of
    them: 6 ms (bytes past a cache size would give (200 - 120) x 3e-11 = 2.4 ms). lscpu's L3 (also
    in the profile) no longer counts."""
    from inferlab.perf.cpu_model import dram_share, dram_stall_s

    assert [dram_share(b, (80e6, 120e6)) for b in (60e6, 80e6, 100e6, 120e6, 200e6)] == pytest.approx([0, 0, 0.5, 1, 1])
    dev = replace(HOST, source="test: ramp rates")
    ref = dict(limits()["references"][0], id="ramp", date="2026-12-05", l3_bytes=480 * 2**20, dram_ramp_bytes=[80e6, 120e6],
               dram_stall_s_per_byte_by_threads={"1": 0.0, "2": 3e-11})
    attach_rates(dev, ref)
    assert dram_stall_s(dev, 60e6, 2) == 0.0
    assert dram_stall_s(dev, 100e6, 2) == pytest.approx(1.5e-3) and dram_stall_s(dev, 200e6, 2) == pytest.approx(6e-3)
    assert dram_stall_s(dev, 200e6, 1) == 0.0  # none fitted at 1 thread
    assert "past 80-120 MB" in " ".join(rate_provenance(dev, ["Q4_K"]))  # a prediction says where decode leaves the cache
    # a whole step: the kernels' seconds as without the ramp, plus the stall of its non-F32 bytes; an
    # F32 file none (its rate is the bandwidth calibrate's F32 toys streamed at, the stall inside it)
    from inferlab.perf.cpu_model import cpu_decode_compute_s

    bare = replace(HOST, source="test: no ramp")
    attach_rates(bare, dict(ref, id="bare", dram_ramp_bytes=None, dram_stall_s_per_byte_by_threads={}))
    q4k, f32 = [("Q4_K", 200e6, 4096)], [("F32", 400e6, 4096)]
    assert cpu_decode_compute_s(dev, q4k, 2) == pytest.approx(cpu_decode_compute_s(bare, q4k, 2) + 6e-3)
    assert cpu_decode_compute_s(dev, f32, 2) == pytest.approx(cpu_decode_compute_s(bare, f32, 2))
    flat = replace(HOST, source="test: flat ladder")
    attach_rates(flat, dict(ref, id="flat", dram_ramp_bytes=None, cache_ladder={"ladder_bytes": [35e6, 53e6, 70e6, 87e6, 224e6]}))
    assert dram_stall_s(flat, 200e6, 2) == 0.0  # no ramp: lscpu's L3 (480 MiB, 503 MB) holds 200 MB, no stall
    assert "up to 224 MB: decode of larger models is not verified" in " ".join(rate_provenance(flat, ["Q4_K"]))


def test_a_deep_step_meets_the_cache_ramp_sooner_by_the_shift_calibrate_fitted():
    """A ladder of 10 MB a layer (2 layers at 40 MB ... 22 at 240 MB), its ramp 80-120 MB, 30 ps a
    byte on 2 threads, and a shift of 0.5 MB a layer. By hand, a 100 MB step: the ladder's toy there
    has 2 + (100 - 40) / 10 = 8 layers. With 28 layers (20 more) the ramp starts 10 MB lower, at 70:
    share (100 - 70) / (120 - 70) = 0.6, 100e6 x 0.6 x 3e-11 = 1.8 ms; with 8 the ladder's own 80-120
    (0.5: 1.5 ms); with 4 (4 fewer) it starts at 82: 18 / 38 x 3 ms = 1.42105 ms; with 1000 it stops
    at 0: 100 / 120 x 3 = 2.5 ms. Past the end (150 MB) every byte stalls at any depth. Without the
    layers, or without a shift in the profile (calibrated before it), the ladder's ramp as it is."""
    from inferlab.perf.cpu_model import cpu_decode_compute_s, dram_stall_s, ladder_layers_at, ramp_bytes_for

    ladder = [[40e6, 2], [140e6, 12], [240e6, 22]]
    assert [ladder_layers_at(ladder, b) for b in (10e6, 40e6, 100e6, 240e6, 400e6)] == pytest.approx([2, 2, 8, 22, 22])
    ref = dict(limits()["references"][0], id="shift", date="2026-12-08", dram_ramp_bytes=[80e6, 120e6],
               dram_ramp_shift_bytes_per_layer=0.5e6, cache_ladder={"layers_by_bytes": ladder},
               dram_stall_s_per_byte_by_threads={"1": 0.0, "2": 3e-11})
    assert ramp_bytes_for(ref, 100e6, 28) == pytest.approx((70e6, 120e6))
    assert ramp_bytes_for(ref, 100e6, 8) == ramp_bytes_for(ref, 100e6) == (80e6, 120e6)
    assert ramp_bytes_for(dict(ref, dram_ramp_shift_bytes_per_layer=0.0), 100e6, 28) == (80e6, 120e6)
    assert ramp_bytes_for(dict(ref, dram_ramp_bytes=None), 100e6, 28) is None
    dev = replace(HOST, source="test: shifted ramp")
    attach_rates(dev, ref)
    got = [dram_stall_s(dev, 100e6, 2, n_layer=n) for n in (28, 8, 4, 1000, None)]
    assert got == pytest.approx([1.8e-3, 1.5e-3, 18 / 38 * 3e-3, 2.5e-3, 1.5e-3])
    assert dram_stall_s(dev, 150e6, 2, n_layer=4) == dram_stall_s(dev, 150e6, 2, n_layer=40) == pytest.approx(4.5e-3)
    q4k = [("Q4_K", 100e6, 4096)]
    assert cpu_decode_compute_s(dev, q4k, 2, 28) == pytest.approx(cpu_decode_compute_s(dev, q4k, 2) + 0.3e-3)
    assert "0.50 MB lower for each layer" in " ".join(rate_provenance(dev, ["Q4_K"]))


def test_the_calibrated_speed_model_takes_the_cpus_own_decode_eta():
    """perf_model's CPU decode (fit --on local) uses the η its rates measured (calibrate's F32
    stream toy), not the GPU-fitted or the lesson's 0.7: one bandwidth-bound step is then bytes /
    (η x β). A 2-core host with a made-up reference of η 1.2 and kernels far faster than memory."""
    from inferlab.hardware.catalog import MACHINES
    from inferlab.models.catalog import MODELS
    from inferlab.perf.calibration import CALIBRATED
    from inferlab.perf.speed import decode_step_time
    from inferlab.perf_model import place

    base = MACHINES["cpu-ddr5"]
    ram = replace(base.ram, source="test: eta rates")
    ref = dict(limits()["references"][0], id="eta", date="2026-12-01", decode_bw_eff=1.2,
               per_core_bytes_per_s={k: 1e15 for k in limits()["references"][0]["per_core_bytes_per_s"]})
    attach_rates(ram, ref)
    machine = replace(base, ram=ram)
    p = place(MODELS["llama-2-7b"], machine, "Q4_K_M", n_ctx=640)
    d = decode_step_time(p, machine, 0, 1, CALIBRATED())["per_device"][0]
    assert d["memory_s"] == pytest.approx(d["bytes"] / (1.2 * ram.bandwidth_bytes_per_s))


def test_prefill_rest_of_the_graph_is_per_layer_token_and_channel_and_old_profiles_keep_their_figure():
    """A calibrated reference's prefill rest: n_layer x tokens x n_embd x its cost per channel, on
    the cores it was measured on. Made-up figures: 2 cores, 20 ns a layer-token-channel; a 12-layer,
    d 768 model, 128 tokens: 12 x 128 x 768 x 20e-9 = 23.59 ms on 2 threads, twice that on 1. A
    profile calibrated before the channel term (one cost per layer and token, 15 us): 12 x 128 x
    15e-6 = 23.04 ms, whatever n_embd."""
    dev = replace(HOST, source="test: prefill rest", fp32_tflops=0.5)
    base = dict(limits()["references"][0], id="rest", date="2026-12-02", n_cores=2)
    attach_rates(dev, dict(base, prefill_overhead_s_per_layer_token_channel=20e-9))
    matmuls = cpu_prefill_s(dev, {"Q4_0": 1e12}, 2)
    assert cpu_prefill_s(dev, {"Q4_0": 1e12}, 2, layer_tokens=12 * 128, n_embd=768) - matmuls == pytest.approx(12 * 128 * 768 * 20e-9)
    assert (cpu_prefill_s(dev, {"Q4_0": 1e12}, 1, layer_tokens=12 * 128, n_embd=768) - cpu_prefill_s(dev, {"Q4_0": 1e12}, 1)
            == pytest.approx(2 * 12 * 128 * 768 * 20e-9))
    with pytest.raises(InvalidValueError, match="n_embd must be an integer >= 1"):
        cpu_prefill_s(dev, {"Q4_0": 1e12}, 2, layer_tokens=128)
    old = replace(HOST, source="test: prefill rest, old profile", fp32_tflops=0.5)
    attach_rates(old, dict(base, prefill_overhead_s_per_layer_token=15e-6))
    assert (cpu_prefill_s(old, {"Q4_0": 1e12}, 2, layer_tokens=12 * 128, n_embd=4096) - cpu_prefill_s(old, {"Q4_0": 1e12}, 2)
            == pytest.approx(12 * 128 * 15e-6))

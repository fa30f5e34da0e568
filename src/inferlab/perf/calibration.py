"""The calibrated speed model: per-backend constants fitted on published llama-bench results.

Fitted only on data/llama_bench_dev.json (Llama 2 7B pp512/tg128: Apple M1-M5 (Metal), NVIDIA
cards (CUDA, Vulkan), AMD cards (ROCm), with sources); data/llama_bench_validation.json holds rows of
devices held out by a rule fixed before fitting, never fitted on (benchmarks/validate_calibrated.py).
Per backend it fits, for decode,

    t_step = max(bytes / (η·β), bytes / (κ·S)) + n_blocks · c

η: the share of peak bandwidth the mat-vec kernels stream at; κ: bytes they can dequantize and dot
per integer operation of the GPU's cores (S = the device's int32_tops: lanes x boost clock), a roof
that binds on very fast memory (HBM at 1.5-2 TB/s on GPUs of modest clocks: the A100 streams a Q4_0
7B at ~0.7 TB/s, not 0.9 x 2 TB/s); c: a fixed cost per block per step (kernel launches and syncs).
For prefill, quantized weights run llama.cpp's own quantized matmul kernels (MMQ on CUDA/ROCm, the
equivalent shaders elsewhere), whose rate follows the cores' clock x lanes rather than the tensor
peak: rate = ζ·S. F16/BF16/F32 weights run dequantize + the vendor GEMM (cuBLAS, rocBLAS, Metal's
simdgroup matmul): rate = ε·P_fp16 where the backend's dev rows have F16 prefill, else ζ·S. Apple
GPUs have no tensor units: their catalog FP16 is the FP32 rate, so both forms are one scale there.
A backend without rows (cpu, sycl) keeps the bandwidth-only model's values; the CPU is additionally
bounded by its measured dequantize-and-dot throughput when perf.cpu_model provides one. The fit runs
once, lazily, in well under a second.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import replace
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from ..errors import InvalidValueError, UnknownNameError, check_positive
from ..hardware.device import Device, Machine
from ..models.spec import ModelSpec
from .placement import place
from .speed import BANDWIDTH_ONLY, SpeedModel, decode_step_time, prefill_time

BACKEND_OF_ROW = {"Metal": "metal", "CUDA": "cuda", "Vulkan": "vulkan", "ROCm": "rocm", "CPU": "cpu"}


def _normalise(r: dict) -> dict:
    tg = r.get("tg128") or r.get("tg64") or r.get("tg_avg")
    pp = r.get("pp512") or r.get("pp_avg")
    return {"device": r["device"], "device_id": r.get("device_id"), "backend": BACKEND_OF_ROW[r["backend"]], "quant": r["quant"],
            "pp": pp, "tg": tg, "bandwidth_gbs": r.get("bandwidth_gbs"), "n_gen": 64 if r.get("tg64") else 128,
            "build": r.get("build"), "fa": r.get("fa"), "source": r.get("source", ""), "fit": r.get("fit", True)}


def _rows(name: str) -> list[dict]:
    data = json.loads(resources.files("inferlab.data").joinpath(name).read_text())
    return [_normalise(r) for r in data["rows"] if not r.get("skip")]


@cache
def dev_rows() -> list[dict]:
    """The dev file's rows, normalised: device, device_id, backend, quant, pp, tg, bandwidth_gbs, build."""
    return _rows("llama_bench_dev.json")


@cache
def validation_rows() -> list[dict]:
    """The held-out rows (data/llama_bench_validation.json): never fitted on."""
    return _rows("llama_bench_validation.json")


_NAME_KEYS = {"RTX 4090": "rtx4090", "RTX 3090": "rtx3090", "RTX 3060": "rtx3060", "A100 80GB": "a100-80gb", "RTX 5090": "rtx5090",
              "RTX 4080": "rtx4080", "RTX 4070": "rtx4070"}


def row_machine(row: dict) -> Machine:
    """A machine for a published row: the catalog device (by the row's device_id, or its chip name
    for the older rows), with the row's bandwidth and, for Apple GPUs with another core count than
    the catalog's, FP16/FP32 scaled by cores."""
    from ..hardware.catalog import DEVICES, apple_host, load_hosts

    name = row["device"]
    m = re.match(r"Apple (M\d(?: Pro| Max| Ultra)?) \((\d+)-core GPU", name)
    if m:
        chip, cores = m.group(1), int(m.group(2))
        base = DEVICES[row["device_id"]] if row.get("device_id") else next(d for d in DEVICES.values() if d.name.startswith(f"Apple {chip} ("))
        bm = re.search(r"\((\d+)-core", base.name)
        if bm is None:
            raise InvalidValueError(f"catalog device {base.name!r} (for the row {name!r}) names no GPU core count, e.g. 'Apple M2 (10-core GPU)'")
        base_cores = int(bm.group(1))
        f = cores / base_cores
        gpu = replace(base, name=name, fp16_tflops=base.fp16_tflops * f, fp32_tflops=(base.fp32_tflops or base.fp16_tflops) * f,
                      bandwidth_gbs=row["bandwidth_gbs"] or base.bandwidth_gbs, memory_gb=max(base.memory_gb, 16))
        return Machine(name, gpu, apple_host(gpu), 0.0, unified=True)
    dev_id = row.get("device_id") or next((v for k, v in _NAME_KEYS.items() if k in name), None)
    if dev_id is None:
        raise KeyError(name)
    gpu = DEVICES[dev_id]
    gpu = replace(gpu, backend=row["backend"], bandwidth_gbs=row["bandwidth_gbs"] or gpu.bandwidth_gbs)
    return Machine(name, gpu, load_hosts()["ddr5-dual"], 31.5)


def _gpu_of(mc: Machine) -> Device:
    """The machine's (first) GPU; every fitted row and -ngl pair is measured on one."""
    if mc.gpu is None:
        raise InvalidValueError(f"machine {mc.name!r} has no GPU; the llama-bench rows and -ngl pairs are GPU measurements")
    return mc.gpu


@cache
def _int32_by_name() -> dict:
    from ..hardware.catalog import _data

    return {e["name"]: e["int32_tops"] for e in _data()["devices"] if e.get("int32_tops")}


def _by_name(table: dict, name: str):
    """table[name], else the entry of the longest catalog name inside it ("NVIDIA GeForce RTX 4090"
    as a driver reports it holds the catalog's "RTX 4090"), else None."""
    if name in table:
        return table[name]
    hits = [k for k in table if k in name]
    return table[max(hits, key=len)] if hits else None


def shader_ops_per_s(dev) -> float:
    """S: integer operations per second of the device's cores (lanes x boost clock), the rate that
    bounds llama.cpp's dequantizing kernels. devices.json's int32_tops where given (NVIDIA, AMD),
    else half the FP32 FLOP/s (every FP32 lane an integer lane, one op a clock: Apple, Intel), else
    half the FP16 figure."""
    t = _by_name(_int32_by_name(), dev.name)
    if t is not None:
        return t * 1e12
    return (dev.fp32_tflops or dev.fp16_tflops) * 1e12 / 2


@cache
def _generation_by_name() -> dict:
    from ..hardware.catalog import _data

    return {e["name"]: e["generation"] for e in _data()["devices"] if e.get("generation")}


def device_class(dev) -> str | None:
    """backend/generation of a GPU ("cuda/turing", "metal/m5"): devices.json's generation, or the
    Apple chip generation read from the name (core-count variants share it); None if unknown."""
    g = _by_name(_generation_by_name(), dev.name)
    if (m := re.match(r"Apple (M\d)", dev.name)):
        g = m.group(1).lower()
    return f"{dev.backend}/{g}" if g else None


FLOAT_TYPES = ("F16", "BF16", "F32")


@lru_cache(maxsize=1024)
def _float_share(model, scheme) -> float:
    """Share of the matmul weight bytes held in float types (F16/BF16/F32): those run dequantize +
    GEMM in prefill, the rest llama.cpp's quantized kernels. token_embd is a lookup, left out."""
    from ..quant.plan import tensor_plan

    plan = tensor_plan(model, scheme)
    tied = not any(t.name == "output.weight" for t in plan)
    tot = flt = 0.0
    for t in plan:
        if len(t.shape) < 2 or (t.name == "token_embd.weight" and not tied):
            continue
        tot += t.n_bytes
        if t.ggml_type in FLOAT_TYPES:
            flt += t.n_bytes
    return flt / tot if tot else 0.0


def llama_bench(model: ModelSpec, quant, machine: Machine, n_prompt: int = 512, n_gen: int = 128, speed: SpeedModel | None = None) -> dict:
    """What llama-bench would print for a fully offloaded model: {"pp": tok/s, "tg": tok/s}
    (pp: a prompt of n_prompt tokens; tg: n_gen tokens generated from an empty context). As
    llama-bench with -p 0 or -n 0, a test of zero tokens is not run: its figure is None."""
    check_positive("n_prompt", n_prompt, allow_zero=True)
    check_positive("n_gen", n_gen, allow_zero=True)
    if n_prompt == n_gen == 0:
        raise InvalidValueError("llama_bench needs n_prompt or n_gen above 0, got both 0")
    speed = speed or CALIBRATED()
    p = place(model, machine, quant, n_ctx=n_prompt + n_gen)
    pp = n_prompt / prefill_time(p, machine, n_prompt, speed)["total_s"] if n_prompt else None
    # tg128 decodes at contexts 0 … n_gen-1; the step time is linear in context, so its mean is at the midpoint
    tg = 1.0 / decode_step_time(p, machine, n_gen // 2, 1, speed)["total_s"] if n_gen else None
    return {"pp": pp, "tg": tg, "placement": p}


MIN_FLOAT_ROWS = 3  # fewer F16 prefill rows than this on a backend: no separate ε for float weights
KAPPA_GRID = (None,) + tuple(round(0.01 * 1.08 ** i, 5) for i in range(90))  # bytes per integer op; None: no roof


def _probes(rows: list[dict]) -> list[tuple]:
    from ..models.catalog import MODELS

    model = MODELS["llama-2-7b"]
    out = []
    for r in rows:
        mc = row_machine(r)
        gpu = _gpu_of(mc)
        p = place(model, mc, "preset:" + r["quant"], n_ctx=640)
        d = decode_step_time(p, mc, r["n_gen"] // 2, 1, SpeedModel("probe", decode_bw_eff=1.0))
        g = d["per_device"][1]
        f = prefill_time(p, mc, 512, SpeedModel("probe", prefill_compute_eff=1.0, attention_flops=True))
        flops = f["total_s"] * gpu.fp16_flops  # the prompt's FLOPs (weights, attention; the head once)
        out.append((r, g["bytes"] / gpu.bandwidth_bytes_per_s, g["bytes"], p.gpus[0].n_blocks, flops,
                    shader_ops_per_s(gpu), gpu.fp16_flops, _float_share(model, p.scheme)))
    return out


def row_class(row: dict) -> str | None:
    return device_class(row_machine(row).gpu)


def _fit_backend(rows: list[dict], backend: str) -> dict:
    """The constants of one backend ("cuda") or one class of its devices ("cuda/turing"), fitted on
    the rows of it that are marked for fitting."""
    sel = [r for r in rows if r.get("fit", True) and (r["backend"] == backend or ("/" in backend and row_class(r) == backend))]
    if not sel:
        return {}
    probes = [x for x in _probes(sel)]
    dec = [x for x in probes if x[0]["tg"]]
    # decode: t = max(t_bw / η, B / (κ·S)) + c · blocks; least absolute log error over a grid of (η, κ),
    # c the median of the residuals (robust: several submissions per card disagree by 10-20 %)
    best: tuple[float, float, float | None, float] | None = None  # (error, η, κ, c)
    for kappa in KAPPA_GRID:
        for i in range(40, 91):  # η at most 0.9: no kernel streams at the full peak
            eta = i / 100
            base = [max(tb / eta, by / (kappa * sh) if kappa else 0.0) for _, tb, by, _, _, sh, _, _ in dec]
            cs = [max(0.0, (1 / x[0]["tg"] - b) / x[3]) for x, b in zip(dec, base)]
            c = statistics.median(cs) if cs else 0.0
            err = sum(abs(math.log((b + c * x[3]) * x[0]["tg"])) for x, b in zip(dec, base))
            if best is None or err < best[0] - 1e-12:
                best = (err, eta, kappa, c)
    assert best is not None  # KAPPA_GRID is not empty: the first (η, κ) always sets it
    # prefill: quantized weights at ζ·S, float weights at ε·P (where the backend has float rows)
    pre = [x for x in probes if x[0]["pp"]]
    quant = [x[4] * x[0]["pp"] / 512 / x[5] for x in pre if x[7] < 0.5]  # ζ: FLOP per integer op
    flt = [x[4] * x[0]["pp"] / 512 / x[6] for x in pre if x[7] >= 0.5]  # ε: share of the FP16 peak
    zeta = statistics.median(quant) if quant else None
    eps = min(statistics.median(flt), 1.0) if len(flt) >= MIN_FLOAT_ROWS else None  # else float weights take ζ·S too
    share = [x[4] * x[0]["pp"] / 512 / x[6] for x in pre]  # what prefill reached of the FP16 peak, row by row (descriptive)
    return {"eta": best[1], "kappa_bytes_per_op": best[2], "layer_overhead_s": best[3], "zeta_flop_per_op": zeta,
            "eps_float": eps, "eps": statistics.median(share) if share else None, "n_rows": len(sel), "n_decode": len(dec), "n_prefill_quant": len(quant), "n_prefill_float": len(flt)}


MIN_CLASS_DEVICES = 2  # a generation gets its own constants when the dev rows hold at least this many of its devices


def fit_all(rows: list[dict]) -> dict:
    """Per backend, then per backend/generation with enough devices (else the backend's constants apply)."""
    out = {b: _fit_backend(rows, b) for b in sorted({r["backend"] for r in rows})}
    devices: dict[str, set] = {}
    for r in rows:
        if r.get("fit", True) and (c := row_class(r)):
            devices.setdefault(c, set()).add(re.sub(r", \d+GB\)", ")", r["device"]))
    for c in sorted(devices):
        if len(devices[c]) >= MIN_CLASS_DEVICES:
            out[c] = _fit_backend(rows, c)
    return out


@cache
def fitted_constants() -> dict:
    return fit_all(dev_rows())


@cache
def host_kv_layer_s() -> dict:
    """Seconds per GPU block per decode step when the KV cache stays in host RAM (-nkvo), per backend,
    from the published pairs in data/ngl_sweeps.json ("nkvo_pairs": the same card and model with and
    without -nkvo): the measured step-time difference, less what the model already predicts for it
    (the cache bytes read from RAM instead of VRAM), over the GPU's blocks; the median of the pairs."""
    from ..models.catalog import MODELS

    data = json.loads(resources.files("inferlab.data").joinpath("ngl_sweeps.json").read_text())
    base = replace(CALIBRATED_NO_HOST_KV(), host_kv_layer_s={})
    each: dict[str, list] = {}
    for pair in data.get("nkvo_pairs", []):
        from ..hardware.catalog import MACHINES

        mc = MACHINES[pair["machine"]]
        model = MODELS[pair["model_id"]]
        t = {}
        for nk in (False, True):
            p = place(model, mc, "preset:" + pair["quant"], n_ctx=640, n_gpu_layers=model.n_layers + 1, no_kv_offload=nk)
            t[nk] = decode_step_time(p, mc, 64, 1, base)["total_s"]
        extra = (1 / pair["tg128_nkvo"] - 1 / pair["tg128"]) - (t[True] - t[False])
        each.setdefault(_gpu_of(mc).backend, []).append(max(0.0, extra) / model.n_layers)
    return {b: statistics.median(v) for b, v in each.items()}


@cache
def host_attention_flops() -> float | None:
    """FLOP/s of prompt attention on the host when the KV cache is in RAM (-nkvo), from the same
    pairs: the pp512 time -nkvo adds, less what the model predicts without it, over the attention
    FLOPs that move to the host (the median of the pairs; None without pairs)."""
    from ..hardware.catalog import MACHINES
    from ..models.catalog import MODELS

    data = json.loads(resources.files("inferlab.data").joinpath("ngl_sweeps.json").read_text())
    base = replace(CALIBRATED_NO_HOST_KV(), host_kv_layer_s={})
    rates = []
    for pair in data.get("nkvo_pairs", []):
        if not pair.get("pp512_nkvo"):
            continue
        mc, model = MACHINES[pair["machine"]], MODELS[pair["model_id"]]
        p = place(model, mc, "preset:" + pair["quant"], n_ctx=640, n_gpu_layers=model.n_layers + 1, no_kv_offload=True)
        f = prefill_time(p, mc, 512, base)
        attn = 512 * p.cpu.attn_flops_per_token_ctx * 256  # the cache is in RAM: the prompt attends to 256 cached tokens on average there
        # without the host rate, the model runs that attention where op offload sends the host's work (the GPU): take it out
        extra = 512 / pair["pp512_nkvo"] - (f["total_s"] - f["per_device"][0]["s"])
        if extra > 0:
            rates.append(attn / extra)
    return statistics.median(rates) if rates else None


def _constants_for(k: dict[str, dict[str, Any]], dev: Device) -> dict[str, Any] | None:
    c = device_class(dev)
    return k.get(c) if c in k else k.get(dev.backend)


def _gpu_decode_rate(k: dict):
    def rate(dev, placement):
        v = _constants_for(k, dev)
        if not v or not v.get("kappa_bytes_per_op"):
            return None
        return v["kappa_bytes_per_op"] * shader_ops_per_s(dev)  # bytes the cores dequantize and dot per second
    return rate


def _gpu_prefill_rate(k: dict):
    def rate(dev, placement):
        v = _constants_for(k, dev)
        if not v or v.get("zeta_flop_per_op") is None:
            return None
        q = v["zeta_flop_per_op"] * shader_ops_per_s(dev)  # quantized kernels (MMQ): the cores' clock x lanes
        f = v["eps_float"] * dev.fp16_flops if v.get("eps_float") else q  # float weights: dequantize + vendor GEMM
        share = _float_share(placement.model, placement.scheme) if placement.scheme is not None else 0.0
        return 1.0 / (share / f + (1 - share) / q)  # FLOPs split by the weights' bytes (same FLOPs per byte-share)
    return rate


def _cpu_rate():
    """The CPU's dequantize-and-dot limit, measured with llama.cpp (perf/cpu_model.py)."""
    from .cpu_model import cpu_decode_rate_for_placement

    return cpu_decode_rate_for_placement


def _cpu_overhead():
    from .cpu_model import decode_overhead_s_per_layer

    return decode_overhead_s_per_layer  # the graph/sync cost per block of the CPU's measured reference


def _cpu_decode_bw_eff():
    """η of a CPU's decode from its rates (this machine's profile: measured on the F32 stream toy;
    a stored reference: the value it was measured or assumed with)."""
    from .cpu_model import reference_for

    return lambda dev: reference_for(dev)["decode_bw_eff"]


def _cpu_prefill_rate():
    from .cpu_model import cpu_prefill_flops_per_s_for_placement

    return cpu_prefill_flops_per_s_for_placement


@cache
def CALIBRATED() -> SpeedModel:  # noqa: N802 (a constant built lazily)
    """The calibrated SpeedModel (llama.cpp's real behaviour: attention FLOPs counted, CPU
    weights cross PCIe once per micro-batch, the GPUs' kernel roofs fitted per backend, the
    per-block cost of a KV cache left in host RAM)."""
    return replace(CALIBRATED_NO_HOST_KV(), host_kv_layer_s=host_kv_layer_s(), host_attention_flops=host_attention_flops())


@cache
def CALIBRATED_NO_HOST_KV() -> SpeedModel:  # noqa: N802
    """CALIBRATED without the -nkvo cost (the base its own fit is measured against)."""
    k = fitted_constants()
    return SpeedModel(
        "calibrated",
        decode_bw_eff_by_backend={b: v["eta"] for b, v in k.items() if v},
        prefill_compute_eff_by_backend={b: v["eps_float"] for b, v in k.items() if v and v.get("eps_float")},
        layer_overhead_s={b: v["layer_overhead_s"] for b, v in k.items() if v},
        cpu_decode_rate=_cpu_rate(),
        cpu_layer_overhead=_cpu_overhead(),
        cpu_prefill_rate=_cpu_prefill_rate(),
        cpu_decode_bw_eff=_cpu_decode_bw_eff(),
        gpu_decode_rate=_gpu_decode_rate(k),
        gpu_prefill_rate=_gpu_prefill_rate(k),
        device_class=device_class,
        prefill_head_every_token=False,
        op_offload_transfers_per_ubatch=True,
        attention_flops=True,
        pcie_eff=0.8,
    )


SPEED_MODELS = ("calibrated", "bandwidth-only", "lesson")  # "lesson": the bandwidth-only model under the seed's name


def speed_model(speed: str | SpeedModel) -> SpeedModel:
    """A SpeedModel by name ("calibrated": CALIBRATED(); "bandwidth-only" or "lesson": BANDWIDTH_ONLY), or the one given."""
    if isinstance(speed, SpeedModel):
        return speed
    if speed == "calibrated":
        return CALIBRATED()
    if speed in ("bandwidth-only", "lesson"):
        return BANDWIDTH_ONLY
    raise UnknownNameError("speed model", speed, SPEED_MODELS)


def validation_table(speed: SpeedModel | None = None, rows: list[dict] | None = None) -> list[dict]:
    """Predicted vs published for every row (default: the dev rows; pass validation_rows() for the
    held-out ones): the numbers the validation script prints."""
    from ..models.catalog import MODELS

    speed = speed or CALIBRATED()
    out = []
    for r in (dev_rows() if rows is None else rows):
        mc = row_machine(r)
        pred = llama_bench(MODELS["llama-2-7b"], "preset:" + r["quant"], mc, 512, r["n_gen"], speed)
        out.append({"device": r["device"], "backend": r["backend"], "quant": r["quant"], "build": r.get("build"),
                    "pp": r["pp"], "pp_pred": pred["pp"], "pp_err": (pred["pp"] / r["pp"] - 1) if r["pp"] else None,
                    "tg": r["tg"], "tg_pred": pred["tg"], "tg_err": (pred["tg"] / r["tg"] - 1) if r["tg"] else None})
    return out


# --- partial offload against published -ngl sweeps (data/ngl_sweeps.json) ---

@cache
def ngl_sweeps() -> dict:
    """data/ngl_sweeps.json: published llama-bench -ngl sweeps with their sources."""
    return json.loads(resources.files("inferlab.data").joinpath("ngl_sweeps.json").read_text())


def _sweep_machine(sweep: dict) -> Machine:
    from ..hardware.catalog import _data, load_hosts

    e = next(x for x in _data()["devices"] if x.get("id") == sweep["gpu_proxy"])
    from ..hardware.catalog import DEVICES

    gpu = DEVICES[sweep["gpu_proxy"]]
    host = load_hosts()[sweep["host_proxy"]]
    return Machine(f"{gpu.name} + {host.name}", gpu, host, e.get("pcie_gbs", 31.5))


def _fit_two_scales(c: list[float], g: list[float], t: list[float]) -> tuple[float, float]:
    """a, b > 0 minimising sum (log(a c_i + b g_i) - log t_i)^2 (a coarse-to-fine grid in log space)."""
    def loss(la, lb):
        return sum((math.log(math.exp(la) * ci + math.exp(lb) * gi) - math.log(ti)) ** 2 for ci, gi, ti in zip(c, g, t))
    la, lb, step = 0.0, 0.0, 2.0
    for _ in range(40):
        la, lb = min(((la + i * step, lb + j * step) for i in (-1, 0, 1) for j in (-1, 0, 1)), key=lambda x: loss(*x))
        step *= 0.7
    return math.exp(la), math.exp(lb)


JUMP_DISTINCT = 1.10  # a sweep's largest step is its jump when it is at least 10 % larger than the next largest


def check_ngl_sweep(sweep: dict, speed: SpeedModel | None = None) -> dict:
    """The model's curve for one published sweep, anchored (see data/ngl_sweeps.json's notes): per
    metric (tg, pp) the measured and predicted t/s at each point, the relative error at the points
    not used as anchors, and where the largest step between consecutive points is, measured and
    predicted."""
    from ..models.catalog import MODELS

    speed = replace(speed or CALIBRATED(), n_ubatch=sweep.get("n_ubatch", 512))
    model = MODELS[sweep["model_id"]]
    mc = _sweep_machine(sweep)
    n_prompt = sweep.get("n_prompt", 512)
    full = model.n_layers + 1
    rows = []
    for pt in sweep["points"]:
        m = pt.get("mapped", {"ngl": pt["ngl"], "nkvo": False}) if "mapped" in pt else {"ngl": pt["ngl"], "nkvo": False}
        if m is None:
            continue
        ngl = min(m["ngl"], full)
        p = place(model, mc, "preset:" + sweep["quant"], n_ctx=n_prompt + 128, n_gpu_layers=ngl, no_kv_offload=m["nkvo"])
        d = decode_step_time(p, mc, 64, 1, speed)
        f = prefill_time(p, mc, n_prompt, speed)
        rows.append({"ngl": pt["ngl"], "ngl_model": ngl, "nkvo": m["nkvo"], "full": ngl == full and not m["nkvo"], "zero": ngl == 0,
                     "tg": pt.get("tg"), "pp": pt.get("pp"),
                     "tg_split": (d["cpu_s"], d["gpu_s"]), "pp_split": (f["cpu_s"] / n_prompt, f["gpu_s"] / n_prompt)})
    return {"id": sweep["id"], "metrics": _score_sweep(sweep, rows, "ngl")}


def _score_sweep(sweep: dict, rows: list[dict], knob: str, scales: dict[str, Any] | None = None) -> dict:
    """Per metric (tg, pp): anchor the model's (CPU-side, GPU-side) split of each point (scales given,
    else the sweep's two ends, else 2-scale least squares), predict, and find the largest step."""
    out: dict[str, Any] = {}
    for k in ("tg", "pp"):
        sel = [r for r in rows if r[k]]
        if len(sel) < 3:
            continue
        t = [1 / r[k] for r in sel]
        c = [r[f"{k}_split"][0] for r in sel]
        g = [r[f"{k}_split"][1] for r in sel]
        zero = next((i for i, r in enumerate(sel) if r["zero"]), None)
        top = next((i for i, r in enumerate(sel) if r["full"]), None)
        if scales is not None and k in scales:
            (a, b), anchors, method = scales[k], set(), "scales from " + str(scales.get("from", "another sweep"))
        elif zero is not None and top is not None and c[zero] > 0 and g[top] > 0:
            b = t[top] / g[top]  # full offload: all on the GPU side
            # the other end: -ngl 0 is all CPU side (its GPU share is nil); --n-cpu-moe n_layers keeps the
            # dense weights and the cache on the GPU, so that end's CPU scale is what the GPU side leaves
            a = t[zero] / c[zero] if knob == "ngl" else (t[zero] - b * g[zero]) / c[zero]
            anchors, method = {zero, top}, "ends"
        else:
            a, b = _fit_two_scales(c, g, t)
            anchors, method = set(), "least squares (2 scales)"
        pred = [1 / (a * ci + b * gi) for ci, gi in zip(c, g)]
        pts = [{knob: r[knob], "measured": r[k], "predicted": pv, "err": pv / r[k] - 1, "anchor": i in anchors}
               for i, (r, pv) in enumerate(zip(sel, pred))]
        steps = [(sel[i][knob], sel[i + 1][knob], sel[i + 1][k] / sel[i][k], pred[i + 1] / pred[i]) for i in range(len(sel) - 1)]
        jm = max(steps, key=lambda s: s[2])
        jp = max(steps, key=lambda s: s[3])
        ratios = sorted((s[2] for s in steps), reverse=True)
        distinct = len(ratios) < 2 or ratios[0] >= JUMP_DISTINCT * ratios[1]  # the measured largest step stands out from the next
        errs = [abs(x["err"]) for x in pts if not x["anchor"]]
        out[k] = {"method": method, "cpu_scale": a, "gpu_scale": b, "points": pts,
                  "jump_measured": [jm[0], jm[1]], "jump_predicted": [jp[0], jp[1]], "jump_distinct": distinct,
                  "checked": k in sweep.get("metrics_checked", ("tg", "pp")),
                  "median_abs_err": statistics.median(errs) if errs else None, "max_abs_err": max(errs) if errs else None,
                  "n_checked": len(errs)}
    return out


def check_n_cpu_moe_sweep(sweep: dict, speed: SpeedModel | None = None, scales: dict[str, Any] | None = None) -> dict:
    """The model's curve for one published --n-cpu-moe sweep (data/ngl_sweeps.json "n_cpu_moe_sweeps"):
    every block on the GPU (-ngl n_layers + 1), the routed experts of the first N blocks in host RAM.
    Points are taken in decreasing N (each step moves experts back to the GPU); anchored as
    check_ngl_sweep, or by `scales` ({"tg": (cpu, gpu), "pp": ..., "from": name}) fitted on another
    sweep of the same machine, when every point is a prediction. Besides the anchored curve it gives
    per metric the seconds per token each block's experts cost on the host, measured and predicted
    (the slope of 1/(t/s) against N, least squares), the model's unscaled slope on the proxies, and
    whether the measured and predicted curves are monotone."""
    from ..models.catalog import MODELS

    speed = replace(speed or CALIBRATED(), n_ubatch=sweep.get("n_ubatch", 512))
    model = MODELS[sweep["model_id"]]
    mc = _sweep_machine(sweep)
    n_prompt, n_gen = sweep.get("n_prompt", 512), sweep.get("n_gen", 128)
    L = model.n_layers
    rows = []
    for pt in sorted(sweep["points"], key=lambda x: -x["n_cpu_moe"]):
        n = min(pt["n_cpu_moe"], L)
        p = place(model, mc, "preset:" + sweep["quant"], n_ctx=n_prompt + n_gen, n_gpu_layers=L + 1, n_cpu_moe=n)
        d = decode_step_time(p, mc, n_gen // 2, 1, speed)
        f = prefill_time(p, mc, n_prompt, speed)
        rows.append({"n_cpu_moe": pt["n_cpu_moe"], "zero": n == L, "full": n == 0, "tg": pt.get("tg"), "pp": pt.get("pp"),
                     "tg_split": (d["cpu_s"], d["gpu_s"]), "pp_split": (f["cpu_s"] / n_prompt, f["gpu_s"] / n_prompt)})
    metrics = _score_sweep(sweep, rows, "n_cpu_moe", scales)
    for k, m in metrics.items():
        sel = [r for r in rows if r[k]]
        ns = [r["n_cpu_moe"] for r in sel]
        m["slope_measured_s"] = _slope(ns, [1 / r[k] for r in sel])  # seconds per token per block whose experts stay on the host
        m["slope_predicted_s"] = _slope(ns, [1 / p["predicted"] for p in m["points"]])
        m["slope_unscaled_s"] = _slope(ns, [sum(r[f"{k}_split"]) for r in sel])
        meas = [p["measured"] for p in m["points"]]
        pred = [p["predicted"] for p in m["points"]]
        m["monotone_measured"] = all(y > x for x, y in zip(meas, meas[1:]))  # faster with every block's experts back on the GPU
        m["monotone_predicted"] = all(y > x for x, y in zip(pred, pred[1:]))
    return {"id": sweep["id"], "metrics": metrics}


def check_n_cpu_moe_sweeps(speed: SpeedModel | None = None) -> list[dict]:
    """check_n_cpu_moe_sweep for every sweep of the data file, a sweep with 'scales_from' taking the
    scales fitted on the one it names (the same machine), so that every one of its points is predicted."""
    sweeps = ngl_sweeps()["n_cpu_moe_sweeps"]
    done: dict[str, dict] = {}
    for s in sorted(sweeps, key=lambda x: "scales_from" in x):  # the sweeps others take their scales from first
        scales = None
        if "scales_from" in s:
            src = done[s["scales_from"]]["metrics"]
            scales = {k: (m["cpu_scale"], m["gpu_scale"]) for k, m in src.items()} | {"from": s["scales_from"]}
        done[s["id"]] = check_n_cpu_moe_sweep(s, speed, scales)
    return [done[s["id"]] for s in sweeps]


def _slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of y against x."""
    mx, my = statistics.fmean(x), statistics.fmean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)

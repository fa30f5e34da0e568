"""The calibrated speed model: per-backend efficiencies fitted on published llama-bench results.

Fitted only on data/llama_bench_dev.json (a copy of shared/reference/llama_bench_dev.json:
Llama 2 7B pp512/tg128 on Apple M1/M2 (Metal) and NVIDIA cards (CUDA, Vulkan), with sources).
Per backend it fits η (the share of peak bandwidth decode reaches), a fixed cost per block per
decode step (kernel launches and syncs, which dominate on fast GPUs) and ε (the share of peak
FP16 throughput prompt processing reaches). The fit runs once, lazily, in a few milliseconds.
Backends without rows (cpu, rocm, sycl) keep the bandwidth-only model's values, and the CPU is additionally
bounded by its measured dequantize-and-dot throughput when perf.cpu_model provides one.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import replace
from functools import cache
from importlib import resources

from ..errors import InvalidValueError, UnknownNameError, check_positive
from ..hardware.device import Machine
from ..models.spec import ModelSpec
from .placement import place
from .speed import BANDWIDTH_ONLY, SpeedModel, decode_step_time, prefill_time

BACKEND_OF_ROW = {"Metal": "metal", "CUDA": "cuda", "Vulkan": "vulkan", "ROCm": "rocm", "CPU": "cpu"}


@cache
def dev_rows() -> list[dict]:
    """The dev file's rows, normalised: device, backend, quant, pp, tg, bandwidth_gbs."""
    data = json.loads(resources.files("inferlab.data").joinpath("llama_bench_dev.json").read_text())
    out = []
    for r in data["rows"]:
        tg = r.get("tg128") or r.get("tg64") or r.get("tg_avg")
        pp = r.get("pp512") or r.get("pp_avg")
        out.append({"device": r["device"], "backend": BACKEND_OF_ROW[r["backend"]], "quant": r["quant"], "pp": pp, "tg": tg,
                    "bandwidth_gbs": r.get("bandwidth_gbs"), "n_gen": 64 if r.get("tg64") else 128, "source": r.get("source", "")})
    return out


def row_machine(row: dict) -> Machine:
    """A machine for a dev row: the catalog device of that chip, with the row's bandwidth and,
    for Apple GPUs with another core count than the catalog's, FP16 scaled by cores."""
    from ..hardware.catalog import DEVICES, apple_host, load_hosts

    name = row["device"]
    m = re.match(r"Apple (M\d(?: Pro| Max| Ultra)?) \((\d+)-core GPU", name)
    if m:
        chip, cores = m.group(1), int(m.group(2))
        base = next(d for d in DEVICES.values() if d.name.startswith(f"Apple {chip} ("))
        base_cores = int(re.search(r"\((\d+)-core", base.name).group(1))
        gpu = replace(base, name=name, fp16_tflops=base.fp16_tflops * cores / base_cores,
                      bandwidth_gbs=row["bandwidth_gbs"] or base.bandwidth_gbs, memory_gb=max(base.memory_gb, 16))
        return Machine(name, gpu, apple_host(gpu), 0.0, unified=True)
    key = {"RTX 4090": "rtx4090", "RTX 3090": "rtx3090", "RTX 3060": "rtx3060", "A100 80GB": "a100-80gb", "RTX 5090": "rtx5090",
           "RTX 4080": "rtx4080", "RTX 4070": "rtx4070"}
    dev_id = next((v for k, v in key.items() if k in name), None)
    if dev_id is None:
        raise KeyError(name)
    gpu = DEVICES[dev_id]
    gpu = replace(gpu, backend=row["backend"], bandwidth_gbs=row["bandwidth_gbs"] or gpu.bandwidth_gbs)
    return Machine(name, gpu, load_hosts()["ddr5-dual"], 31.5)


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


def _fit_backend(rows: list[dict], backend: str) -> dict:
    from ..models.catalog import MODELS

    model = MODELS["llama-2-7b"]
    sel = [r for r in rows if r["backend"] == backend]
    if not sel:
        return {}
    probes = []
    for r in sel:
        mc = row_machine(r)
        p = place(model, mc, "preset:" + r["quant"], n_ctx=640)
        d = decode_step_time(p, mc, r["n_gen"] // 2, 1, SpeedModel("probe", decode_bw_eff=1.0))
        g = d["per_device"][1]
        f = prefill_time(p, mc, 512, SpeedModel("probe", prefill_compute_eff=1.0, attention_flops=True))
        probes.append((r, g["bytes"] / (mc.gpu.bandwidth_bytes_per_s), p.gpus[0].n_blocks, f["total_s"]))
    # decode: t = t_bw / η + c · blocks, least absolute log error over a grid of η (c: median residual)
    best = None
    for i in range(40, 91):  # η at most 0.9: no kernel streams at the full peak
        eta = i / 100
        cs = [max(0.0, (1 / r["tg"] - tb / eta) / nb) for r, tb, nb, _ in probes if r["tg"]]
        c = statistics.median(cs) if cs else 0.0
        err = sum(abs(math.log((tb / eta + c * nb) * r["tg"])) for r, tb, nb, _ in probes if r["tg"])  # robust: L1 in log space
        if best is None or err < best[0]:
            best = (err, eta, c)
    # prefill: t = t_peak / ε, the median of the rows' ratios (robust to old builds' outliers)
    eps_each = [tp * r["pp"] / 512 for r, _, _, tp in probes if r["pp"]]
    eps = statistics.median(eps_each) if eps_each else BANDWIDTH_ONLY.prefill_compute_eff
    return {"eta": best[1], "layer_overhead_s": best[2], "eps": min(eps, 1.0), "n_rows": len(sel)}


@cache
def fitted_constants() -> dict:
    rows = dev_rows()
    return {b: _fit_backend(rows, b) for b in sorted({r["backend"] for r in rows})}


def _cpu_rate():
    """The CPU's dequantize-and-dot limit, measured with llama.cpp (perf/cpu_model.py)."""
    from .cpu_model import cpu_decode_rate_for_placement

    return cpu_decode_rate_for_placement


def _cpu_overhead():
    from .cpu_model import decode_overhead_s_per_layer

    return decode_overhead_s_per_layer  # the graph/sync cost per block of the CPU's measured reference


def _cpu_prefill_rate():
    from .cpu_model import cpu_prefill_flops_per_s_for_placement

    return cpu_prefill_flops_per_s_for_placement


@cache
def CALIBRATED() -> SpeedModel:  # noqa: N802 (a constant built lazily)
    """The calibrated SpeedModel (llama.cpp's real behaviour: attention FLOPs counted, CPU
    weights cross PCIe once per micro-batch)."""
    k = fitted_constants()
    return SpeedModel(
        "calibrated",
        decode_bw_eff_by_backend={b: v["eta"] for b, v in k.items() if v},
        prefill_compute_eff_by_backend={b: v["eps"] for b, v in k.items() if v},
        layer_overhead_s={b: v["layer_overhead_s"] for b, v in k.items() if v},
        cpu_decode_rate=_cpu_rate(),
        cpu_layer_overhead=_cpu_overhead(),
        cpu_prefill_rate=_cpu_prefill_rate(),
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


def validation_table(speed: SpeedModel | None = None) -> list[dict]:
    """Predicted vs published for every dev row (the numbers the validation script prints)."""
    from ..models.catalog import MODELS

    speed = speed or CALIBRATED()
    out = []
    for r in dev_rows():
        mc = row_machine(r)
        pred = llama_bench(MODELS["llama-2-7b"], "preset:" + r["quant"], mc, 512, r["n_gen"], speed)
        out.append({"device": r["device"], "backend": r["backend"], "quant": r["quant"],
                    "pp": r["pp"], "pp_pred": pred["pp"], "pp_err": (pred["pp"] / r["pp"] - 1) if r["pp"] else None,
                    "tg": r["tg"], "tg_pred": pred["tg"], "tg_err": (pred["tg"] / r["tg"] - 1) if r["tg"] else None})
    return out

"""How fast llama.cpp's CPU backend can dequantize-and-dot weights, per core and ggml type.

Decode on a CPU reads every weight once per token. When the cores are fast and few memory
channels feed them, bandwidth limits it (bytes / (η·β)); when the cores are few or slow, the
dequantize+dot kernels do (bytes / (rate per core x threads)). The rates are measured with
llama.cpp itself (tg128 of single-type models, benchmarks/cpu_decode_rates.py) and stored as
data with their source in data/cpu_limits.json. Standard library only (core).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache, lru_cache
from importlib import resources

from ..errors import InvalidValueError, UnknownNameError
from ..hardware.device import Device

# Types a rate can be asked for but which were not measured: the measured type with the same
# kernel family and the nearest bits per weight stands in (noted in the entry's source). A
# reference that measured Q4_0/Q4_1 uses its own figures (on Zen 4 Q4_1's kernel runs at about
# half Q4_K's bytes per second: no repacked or tinyBLAS path for it).
_STAND_IN = {"Q4_0": "Q4_K", "Q4_1": "Q4_K", "Q5_K": "Q6_K", "Q5_0": "Q6_K", "Q5_1": "Q6_K", "Q3_K": "Q4_K",
             "Q2_K": "Q4_K", "IQ4_XS": "Q4_K", "IQ4_NL": "Q4_K", "BF16": "F16"}


@cache
def limits() -> dict:
    """The table (data/cpu_limits.json): reference CPUs, each with per-type rates and sources."""
    return json.loads(resources.files("inferlab.data").joinpath("cpu_limits.json").read_text())


def _simd_of(device: Device) -> str:
    """The vector ISA class of a CPU device, from its ``isa`` features (detected); a catalog host
    without them may name its ISA in its notes, else AVX2 (the common desktop and server baseline)."""
    words = {w.lower() for w in device.isa} or set(device.notes.lower().replace(",", " ").split())
    if any(w.startswith("avx512") for w in words):
        words.add("avx512")
    if any(w.startswith("amx") for w in words):
        words.add("amx")
    if "amx" in words:
        return "amx"
    if "avx512" in words:
        return "avx512"
    if "neon" in words or "apple" in device.name.lower():
        return "neon"
    return "avx2"


def measured_reference(device: Device) -> dict | None:
    """The measured reference CPU of ``device``'s ISA class, or None when none was measured."""
    simd = _simd_of(device)
    return next((r for r in limits()["references"] if r["simd"] == simd), None)


def reference_for(device: Device) -> dict:
    """The measured reference CPU that stands for ``device``: same ISA class if measured, else the
    first entry (a stand-in: its rates may be far from this CPU's)."""
    return measured_reference(device) or limits()["references"][0]


def _measured_key(table: Mapping[str, float], ggml_type: str, what: str) -> str:
    key = ggml_type.upper()
    key = key if key in table else _STAND_IN.get(key, key)
    if key not in table:
        raise UnknownNameError(what, ggml_type, list(table) + list(_STAND_IN))
    return key


def cpu_decode_rate_bytes_per_s(device: Device, ggml_type: str, n_threads: int | None = None) -> float:
    """Bytes of ``ggml_type`` weights per second that llama.cpp's CPU kernels can dequantize and
    dot with one token's activations, using ``n_threads`` threads on ``device`` (default: its
    cores). This is the compute limit of CPU decode only; the caller takes the minimum with the
    memory limit η·β. Threads past the physical cores add nothing (SMT shares the vector units).

    rate = per-core rate of the type x threads x parallel efficiency (both measured with llama.cpp;
    data/cpu_limits.json says on which CPU, how and when).
    """
    if not device.is_cpu:
        raise InvalidValueError(f"{device.name!r} is a {device.backend} device; CPU decode rates apply to cpu devices")
    used = _threads_used(device, n_threads)
    ref = reference_for(device)
    rates = ref["per_core_bytes_per_s"]
    key = _measured_key(rates, ggml_type, "ggml type with a measured CPU rate")
    eff = ref["parallel_efficiency"][key] if used > 1 else 1.0  # threads synchronise after every matmul
    return rates[key] * used * eff  # per-core rate x threads x measured parallel efficiency


def cpu_decode_rate_for_mix(device: Device, bytes_by_type: Mapping[str, float], n_threads: int | None = None) -> float:
    """The same limit for a model whose weights mix types (Q4_K_M: Q4_K and Q6_K...): total bytes
    over the sum of each type's time, bytes_t / rate_t (a harmonic mean weighted by bytes)."""
    total = sum(bytes_by_type.values())
    if total <= 0:
        raise InvalidValueError(f"bytes_by_type must hold some bytes, got {dict(bytes_by_type)!r}")
    t = sum(b / cpu_decode_rate_bytes_per_s(device, ty, n_threads) for ty, b in bytes_by_type.items() if b)
    return total / t


def decode_overhead_s_per_layer(device: Device) -> float:
    """Fixed seconds per transformer block per decode step on the CPU backend: the block's ~20
    small graph nodes (norms, RoPE, attention, activations) and the threads' barrier after each,
    which cost the same in a thin model as in a wide one; fitted with the rates."""
    return reference_for(device)["overhead_s_per_layer"]


def _threads_used(device: Device, n_threads: int | None) -> int:
    cores = device.n_cores or 1
    threads = cores if n_threads is None else n_threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidValueError(f"n_threads must be an integer >= 1, got {n_threads!r}")
    return min(threads, cores)


def prefill_eff_vs_fp32_peak(device: Device, ggml_type: str) -> float:
    """Share of the CPU's fp32 peak that llama.cpp's prompt matmuls reach with ``ggml_type``
    weights (measured per type: each type has its own kernel path, repacked, tinyBLAS or the
    plain dot loop). A reference without per-type figures has one for every type."""
    ref = reference_for(device)
    by_type = ref.get("prefill_eff_vs_fp32_peak_by_type")
    if not by_type:
        return ref["prefill_eff_vs_fp32_matmul"]  # one figure for every type (the Zen 3 entry)
    try:
        return by_type[_measured_key(by_type, ggml_type, "ggml type with a measured prefill efficiency")]
    except UnknownNameError:
        return ref["prefill_eff_vs_fp32_matmul"]  # a type nobody measured: the reference's median


def cpu_prefill_s(device: Device, flops_by_type: Mapping[str, float], n_threads: int | None = None) -> float:
    """Seconds the CPU's prompt matmuls take for ``flops_by_type`` (2 FLOP per weight per token,
    by the weights' ggml type): each type at its measured share of the fp32 peak of the threads
    used (the cores share the peak evenly; SMT adds nothing)."""
    if not device.is_cpu:
        raise InvalidValueError(f"{device.name!r} is a {device.backend} device; CPU prefill rates apply to cpu devices")
    used = _threads_used(device, n_threads)
    peak = (device.fp32_tflops or device.fp16_tflops) * 1e12 * used / (device.n_cores or 1)
    return sum(f / (prefill_eff_vs_fp32_peak(device, ty) * peak) for ty, f in flops_by_type.items() if f)


def cpu_decode_rate_for_placement(device: Device, placement, n_threads: int | None = None) -> float:
    """``SpeedModel.cpu_decode_rate``'s signature: the limit for the weights a decode step reads,
    with the model's own mix of types (its tensor plan, token_embd left out: a row lookup)."""
    return _rate_for_plan(device, placement.model, placement.scheme, n_threads)


@lru_cache(maxsize=4096)
def _rate_for_plan(device: Device, model, scheme, n_threads: int | None) -> float:
    from ..quant.plan import tensor_plan

    plan = tensor_plan(model, scheme)
    tied = not any(t.name == "output.weight" for t in plan)  # then token_embd is the output head too
    mix: dict[str, float] = {}
    for t in plan:
        if (t.name != "token_embd.weight" or tied) and t.ggml_type != "F32":
            mix[t.ggml_type] = mix.get(t.ggml_type, 0.0) + t.n_bytes
    return cpu_decode_rate_for_mix(device, mix, n_threads)


def cpu_prefill_flops_per_s_for_placement(device: Device, placement, n_threads: int | None = None) -> float:
    """``SpeedModel.cpu_prefill_rate``'s signature: FLOP/s of the CPU's prompt matmuls for the
    model's own mix of block weight types (the output head runs for one token only)."""
    return _prefill_rate_for_plan(device, placement.model, placement.scheme, n_threads)


@lru_cache(maxsize=4096)
def _prefill_rate_for_plan(device: Device, model, scheme, n_threads: int | None) -> float:
    from ..quant.plan import tensor_plan

    flops: dict[str, float] = {}
    for t in tensor_plan(model, scheme):
        if t.layer is not None and len(t.shape) > 1 and t.ggml_type != "F32":
            flops[t.ggml_type] = flops.get(t.ggml_type, 0.0) + 2.0 * t.n_elements
    if not flops:
        raise InvalidValueError(f"{model.name!r} has no block weights to time")
    return sum(flops.values()) / cpu_prefill_s(device, flops, n_threads)

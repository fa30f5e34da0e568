"""The seed lesson's performance model, by its names: ``from inferlab.perf_model import ...``.

A thin facade over models/, quant/, kv_size, placement and speed. With default arguments every
function is the lesson's model (``LESSON``: η = 0.7 for decode, 50 % of peak compute for prefill,
the assumed CPU throughput of the host preset, the approximate compute buffer; the core calls it
``perf.speed.BANDWIDTH_ONLY``); pass ``model=CALIBRATED()`` to the speed functions (``CALIBRATED``
is a function that fits the model once and returns it), or call ``llama_bench``, for the
calibrated one.
"""

from __future__ import annotations

from .perf.calibration import CALIBRATED, llama_bench  # noqa: F401
from .hardware.catalog import DDR4_DUAL, DDR5_DUAL, DEVICES, HOSTS, MACHINES as CATALOG_MACHINES, LESSON_MACHINES
from .hardware.device import Device, Machine
from .perf.kv_size import KV_TYPES, kv_bytes_per_token, kv_cache_bytes
from .models.catalog import MODELS
from .models.hf_config import model_from_hf_config
from .models.spec import ModelSpec
from .perf.placement import Placement
from .perf.placement import place as _place
from .quant.plan import Preset, PureType, effective_bpw, resolve_quant, tensor_plan, weight_bytes
from .perf.speed import BANDWIDTH_ONLY as LESSON, SpeedModel, arithmetic_intensity, decode_step_time, prefill_time, ridge_batch, roofline_point, throughput

GB = 1e9  # the lesson prints sizes in GB = 10^9 bytes
GiB = 2**30
# The lesson's machines: the catalog, with the lesson's own approximations where it used them
# (RTX 4060 Ti: 45.2 TFLOP/s and a 31.5 GB/s link; RTX 3060: 26.0 TFLOP/s). CATALOG_MACHINES
# holds the vendor figures.
MACHINES = LESSON_MACHINES


def place(model, machine, quant="Q4_K_M", n_ctx=None, kv_type="f16", n_gpu_layers=None, *, order="lesson", **kw) -> Placement:
    """The lesson's placement: blocks 0 … ngl-1 on the GPU, the output head only at
    ngl = n_layers + 1 (pass order="llama.cpp" for llama.cpp's real order, output head first)."""
    return _place(model, machine, quant, n_ctx, kv_type, n_gpu_layers, order=order, **kw)

__all__ = [
    "CALIBRATED", "CATALOG_MACHINES", "DDR4_DUAL", "DDR5_DUAL", "DEVICES", "GB", "GiB", "HOSTS", "KV_TYPES", "LESSON", "MACHINES", "MODELS",
    "Device", "Machine", "ModelSpec", "Placement", "Preset", "PureType", "SpeedModel", "arithmetic_intensity",
    "decode_step_time", "effective_bpw", "kv_bytes_per_token", "kv_cache_bytes", "llama_bench", "model_from_hf_config",
    "place", "prefill_time", "resolve_quant", "ridge_batch", "roofline_point", "tensor_plan", "throughput", "weight_bytes",
]

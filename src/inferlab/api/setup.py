"""One configuration, resolved once: model, machine, quantization, placement and speed model.

Every question of the service layer (fit, traces, capacity, advice, timed simulation) starts from
a :class:`Setup`, so all of them see the same placement and the same speed model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError
from ..hardware.device import Machine
from ..hardware.resolve import resolve_machine
from ..models.resolve import resolve_model
from ..models.spec import ModelSpec
from ..perf.calibration import speed_model
from ..perf.placement import Placement, place
from ..perf.speed import SpeedModel
from ..quant.presets import Preset, PureType, preset_aliases, presets, resolve_quant

DEFAULT_PRESET = "Q4_K_M"
# the speed models by the names the faces offer; "lesson" is the bandwidth-only model with the lesson's constants
SPEED_NAMES = ("calibrated", "bandwidth-only", "lesson")


def read_quant(quant: str | Preset | PureType | None, spec: ModelSpec, *, bare: str = "preset") -> Preset | PureType | None:
    """The quantization a user asked for. ``None``: the file's own tensors for a model read from a
    GGUF, else Q4_K_M. ``bare="preset"`` (the command line, how files are named): a bare name means
    the llama-quantize preset when one exists; ``bare="type"`` (the lesson's reading): a GGML type
    name means every weight in that type. ``preset:X`` / ``type:X`` force either."""
    if quant is None:
        return None if spec.tensors is not None else resolve_quant("preset:" + DEFAULT_PRESET)
    if isinstance(quant, (Preset, PureType)) or bare == "type":
        return resolve_quant(quant)
    if bare != "preset":
        raise InvalidValueError(f"bare must be 'preset' or 'type', got {bare!r}")
    if not isinstance(quant, str):
        raise InvalidValueError(f"quant must be a preset or GGML type name, got {type(quant).__name__} {quant!r:.60}")
    names = {k.upper() for k in presets()} | {k.upper() for k in preset_aliases()}
    return resolve_quant("preset:" + quant if ":" not in quant and quant.strip().upper() in names else quant)


@dataclass(frozen=True)
class Setup:
    """A resolved configuration: what `fit` and every other question compute from."""

    spec: ModelSpec
    machine: Machine
    machine_id: str | None  # the catalog key or "local" when given by name
    scheme: Preset | PureType | None  # None: the file's own tensors
    placement: Placement
    speed: SpeedModel
    order: str
    kv_type: str


def configure(model: ModelSpec | str, machine: Machine | str, *, quant: Any = None, n_ctx: int | None = None,
              kv_type: str = "f16", n_gpu_layers: int | None = None, n_cpu_moe: int = 0, speed: str | SpeedModel = "calibrated",
              order: str = "llama.cpp", bare: str = "preset", profile: bool = True, flash_attn: str = "auto",
              **place_options: Any) -> Setup:
    """Resolve names and place the model: the one path from a user's question to a placement.

    ``speed="lesson"`` also takes the lesson's own device approximations for a catalog machine
    (as the lesson computed with them); ``"bandwidth-only"`` is the same model on vendor figures.
    ``n_ctx=0`` is llama.cpp's ``-c 0``: the trained context, which ``--fit`` may shrink (as None).
    ``flash_attn``: llama.cpp's ``-fa auto|on|off``; a quantized V cache needs it not off.
    The placement's notes say when a setting does nothing or needs care (see llama_cpp_notes).
    """
    check_llama_cpp_cache(kv_type, flash_attn)
    if n_ctx == 0 and not isinstance(n_ctx, bool):
        n_ctx = None  # llama.cpp: -c 0 = the trained context, left to --fit (common/fit.cpp: n_ctx_auto = n_ctx == 0)
    spec = resolve_model(model)
    if isinstance(speed, str) and speed not in SPEED_NAMES:
        from ..errors import UnknownNameError

        raise UnknownNameError("speed model", speed, SPEED_NAMES)
    m = resolve_machine(machine, lesson_figures=speed == "lesson", profile=profile)
    machine_id = machine if isinstance(machine, str) else None
    scheme = read_quant(quant, spec, bare=bare)
    sm = speed_model("bandwidth-only" if speed == "lesson" else speed)
    p = place(spec, m, scheme, n_ctx, kv_type, n_gpu_layers, n_cpu_moe=n_cpu_moe, order=order, **place_options)
    notes = llama_cpp_notes(spec, p.n_ctx, n_cpu_moe, place_options.get("cpu_moe", False))
    if notes:
        p = p._replace(notes=tuple(p.notes) + notes)
    return Setup(spec, m, machine_id, scheme, p, sm, order, kv_type)


FLASH_ATTN = ("auto", "on", "off")  # llama.cpp -fa / --flash-attn


def check_llama_cpp_cache(kv_type: str, flash_attn: str = "auto") -> None:
    """llama.cpp's rules for its cache types (-ctk/-ctv), raised as one-line errors: fp8 is not one
    of them (vLLM's and SGLang's --kv-cache-dtype has it), and a quantized V cache needs flash
    attention (src/llama-context.cpp: with -fa off, "quantized V cache requires flash_attn to be
    enabled"; -fa auto turns it on for a quantized V cache)."""
    from ..errors import UnknownNameError
    from ..perf.kv_size import LLAMA_CPP_KV_TYPES, SERVING_KV_TYPES

    if flash_attn not in FLASH_ATTN:
        raise UnknownNameError("flash-attention setting", flash_attn, FLASH_ATTN)
    k = kv_type.lower() if isinstance(kv_type, str) else kv_type
    if k in SERVING_KV_TYPES:
        raise InvalidValueError(f"KV cache type {kv_type!r} is not a llama.cpp cache type (-ctk/-ctv take {', '.join(LLAMA_CPP_KV_TYPES)}); "
                                f"fp8 KV caches are vLLM's and SGLang's --kv-cache-dtype fp8; for llama.cpp use q8_0 (8.5 bits)")
    if k not in LLAMA_CPP_KV_TYPES:
        raise UnknownNameError("KV cache type", kv_type, LLAMA_CPP_KV_TYPES)
    if flash_attn == "off" and k not in ("f32", "f16", "bf16"):
        raise InvalidValueError(f"llama.cpp refuses a quantized V cache ({kv_type}) without flash attention "
                                f"(\"quantized V cache requires flash_attn to be enabled\"): use -fa on or auto, or -ctv f16")


def llama_cpp_notes(spec: ModelSpec, n_ctx: int, n_cpu_moe: int = 0, cpu_moe: bool = False) -> tuple[str, ...]:
    """What llama.cpp would warn about for these settings: a context beyond the trained length
    (RoPE positions it never saw), --n-cpu-moe / --cpu-moe on a dense model (no experts to move)."""
    notes = []
    if n_ctx > spec.n_ctx_train:
        notes.append(f"context {n_ctx:,} is beyond the model's trained length of {spec.n_ctx_train:,} tokens: llama.cpp warns "
                     "(n_ctx_seq > n_ctx_train, possible training context overflow); quality degrades past it unless "
                     "the model is run with RoPE scaling (--rope-scaling yarn --rope-scale, for a model that supports it)")
    if (n_cpu_moe or cpu_moe) and not spec.is_moe:
        flag = "--cpu-moe" if cpu_moe else f"--n-cpu-moe {n_cpu_moe}"
        notes.append(f"{flag} does nothing here: {spec.name} is a dense model, it has no expert tensors to keep in RAM")
    return tuple(notes)

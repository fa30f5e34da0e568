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
              order: str = "llama.cpp", bare: str = "preset", profile: bool = True, **place_options: Any) -> Setup:
    """Resolve names and place the model: the one path from a user's question to a placement.

    ``speed="lesson"`` also takes the lesson's own device approximations for a catalog machine
    (as the lesson computed with them); ``"bandwidth-only"`` is the same model on vendor figures.
    """
    spec = resolve_model(model)
    if isinstance(speed, str) and speed not in SPEED_NAMES:
        from ..errors import UnknownNameError

        raise UnknownNameError("speed model", speed, SPEED_NAMES)
    m = resolve_machine(machine, lesson_figures=speed == "lesson", profile=profile)
    machine_id = machine if isinstance(machine, str) else None
    scheme = read_quant(quant, spec, bare=bare)
    sm = speed_model("bandwidth-only" if speed == "lesson" else speed)
    p = place(spec, m, scheme, n_ctx, kv_type, n_gpu_layers, n_cpu_moe=n_cpu_moe, order=order, **place_options)
    return Setup(spec, m, machine_id, scheme, p, sm, order, kv_type)

"""``calibrate() -> CalibrationReport`` and ``validate() -> ValidationReport``: this machine,
measured, and the speed model's predictions checked against real llama.cpp here.

Thin over ``hardware.calibrate`` (the measurements, their stability rules, the profile) and
``hardware.validate`` (toy models through llama.cpp beside the prediction).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError, UnknownNameError
from .report import Report


@dataclass(frozen=True)
class CalibrationReport(Report):
    profile_id: str
    saved_to: str | None  # None: measured only (save=False)
    problems: tuple[str, ...]  # why figures are unstable or the machine was busy (a profile with problems is not saved)
    skipped: dict[str, str]
    profile: dict[str, Any]  # the whole profile, as saved


def calibrate(*, threads: tuple[int, ...] | None = None, repeats: int = 5, size_mib: int | None = None, engine: str = "none",
              types: tuple[str, ...] | None = None, n_gen: int = 64, n_prompt: int = 128, realtime: bool = False,
              accept_noisy: bool = False, save: bool = True, rounds: int = 1, probe: bool = True, retime: int = 2,
              on_step: Callable[[Any, Any, str], None] | None = None) -> CalibrationReport:
    """Measure memory bandwidth and matmul throughput here (and llama.cpp's kernels per ggml type
    with ``engine="llama.cpp"``); save the profile `--on local` uses. A profile whose figures are
    unstable, or were measured on a busy machine, raises UnstableMeasurementError unless
    ``accept_noisy`` (then it is saved flagged). ``rounds``: passes over the llama.cpp figures;
    ``probe``: time each llama.cpp repetition between two runs of the level probe (llama_cpp_plan);
    ``retime``: passes that time again the llama.cpp figures with under two repetitions out of a slow
    spell, then (when not 0) one over the decode figures furthest off the fit of the others
    (run_calibration's misfit)."""
    from ..hardware import calibrate as cal

    if engine not in ("none", "llama.cpp"):
        raise UnknownNameError("calibration engine", engine, ("none", "llama.cpp"))
    if types and engine == "none":
        raise InvalidValueError("types need engine='llama.cpp'")
    if isinstance(retime, bool) or not isinstance(retime, int) or not 0 <= retime <= 10:
        raise InvalidValueError(f"retime must be an integer from 0 to 10, got {retime!r}")
    steps = cal.plan(threads, size_mib * 2**20 if size_mib else None, repeats)
    if engine == "llama.cpp":
        steps += cal.llama_cpp_plan(types or tuple(cal.LLAMA_CPP_TYPES), n_gen=n_gen, n_prompt=n_prompt, repeats=3, rt=realtime,
                                    rounds=rounds, probe=probe)
    with cal.realtime(realtime):
        profile = cal.run_calibration(steps, on_step, retime=retime, misfit=retime > 0)
    if profile["problems"] and not accept_noisy and save:
        raise cal.UnstableMeasurementError(profile["problems"], kept=_keep_rejected(profile))
    if profile["problems"]:
        profile["accepted_with_problems"] = True
    where = cal.save_profile(profile) if save else None
    if where:
        _drop_rejected()  # an older refused run must not be accepted over this one later
    return CalibrationReport(cal.profile_id(profile), where, tuple(profile["problems"]), dict(profile["skipped"]), profile)


def _keep_rejected(profile: dict) -> str | None:
    """Write a refused calibration's figures beside the profile (a long run is not lost); None
    when that folder cannot be written (the refusal itself is what the caller reports)."""
    from ..errors import ConfigError
    from ..hardware import calibrate as cal

    try:
        return cal.save_profile(profile, cal.rejected_profile_path())
    except ConfigError:
        return None


def _drop_rejected() -> None:
    import contextlib
    import os

    from ..hardware import calibrate as cal

    with contextlib.suppress(OSError):  # none there, or not removable: the profile itself was saved
        os.unlink(cal.rejected_profile_path())


def accept_rejected() -> CalibrationReport:
    """Make the figures of the last calibration refused as noisy (kept in rejected_profile_path)
    the machine profile, flagged ``accepted_with_problems`` as --accept-noisy would have saved
    them; ConfigError when there is none to accept."""
    from ..errors import ConfigError
    from ..hardware import calibrate as cal

    path = cal.rejected_profile_path()
    profile = cal.load_profile(path)  # FileFormatError for a damaged file, naming it
    if profile is None:
        raise ConfigError(f"no refused calibration to accept: {path} does not exist (calibrate keeps one there when it "
                          "refuses to save a noisy run); run `inferlab calibrate`")
    profile["accepted_with_problems"] = True
    where = cal.save_profile(profile)
    _drop_rejected()
    return CalibrationReport(cal.profile_id(profile), where, tuple(profile.get("problems") or ()), dict(profile.get("skipped") or {}),
                             profile)


@dataclass(frozen=True)
class ValidationRow:
    model: str
    preset: str
    n_params: int
    decode_bytes: float
    threads: int
    pp_measured: float | None
    pp_samples: tuple[float, ...]
    pp_predicted: float | None
    pp_error: float | None
    tg_measured: float | None
    tg_samples: tuple[float, ...]
    tg_cpu_samples: tuple[float, ...]
    tg_predicted: float | None
    tg_error: float | None
    flags: tuple[str, ...]  # repetitions that disagree: their error is not scored
    rates: str  # whose CPU rates the prediction used (this machine's profile, or the reference)
    dominant_limit: str
    memory_s: float
    compute_s: float
    overhead_s: float
    eta: float
    bandwidth_gbs: float
    perf_model_pp: float | None
    perf_model_tg: float | None
    perf_model_tg_error: float | None
    perf_model_note: str
    # with the level probe (validate's default): its speeds around each repetition, the machine's
    # speed level against calibrate (the probe here / at calibrate), and the errors vs the probe
    # (a row's speed relative to the probe around each repetition, at the probe's calibrate speed)
    pp_probe_samples: tuple[float, ...] = ()
    tg_probe_samples: tuple[float, ...] = ()
    pp_level: float | None = None
    tg_level: float | None = None
    pp_matched_error: float | None = None
    tg_matched_error: float | None = None
    pp_scored_error: float | None = None  # the matched error where a probe ran, else pp_error
    tg_scored_error: float | None = None  # tg_state_error where the state probes ran, else as pp's
    # with the state probes (validate.STATE_PROBES, a calibrated profile with a cache ramp): their
    # decode speeds around each repetition, the machine's state solved from them and the level probe's
    # per repetition (kernels' slowdown, the cache ramp's scale, the DRAM stall's scale, rms log
    # residual), its median cache scale, and decode predicted at that state against each repetition
    # (the median; what decode is scored on where it is given: tg_scored_error)
    tg_state_probe_samples: tuple[tuple[float, ...], ...] = ()
    tg_states: tuple[tuple[float, float, float, float], ...] = ()
    tg_cache_scale: float | None = None
    tg_state_error: float | None = None


@dataclass(frozen=True)
class ValidationReport(Report):
    n_prompt: int
    n_gen: int
    repetitions: int
    rows: tuple[ValidationRow, ...]
    _rows: tuple[Any, ...] = ()  # hardware.validate's records behind the rows (for renderers): not in to_dict()


def validation_row(r) -> ValidationRow:
    """One hardware.validate row as the report holds it."""
    return ValidationRow(
        model=r.model, preset=r.preset, n_params=r.n_params, decode_bytes=r.decode_bytes, threads=r.n_threads,
        pp_measured=r.measured.best("pp") if r.measured.pp_tok_s else None, pp_samples=tuple(r.measured.pp_tok_s),
        pp_predicted=r.predicted_pp, pp_error=r.pp_error,
        tg_measured=r.measured.best("tg") if r.measured.tg_tok_s else None, tg_samples=tuple(r.measured.tg_tok_s),
        tg_cpu_samples=tuple(r.measured.tg_cpu_tok_s), tg_predicted=r.predicted_tg,
        tg_error=r.tg_error if r.measured.tg_tok_s else None, flags=tuple(r.flags), rates=r.rates,
        dominant_limit=r.limits.dominant, memory_s=r.limits.memory_s, compute_s=r.limits.compute_s, overhead_s=r.limits.overhead_s,
        eta=r.limits.eta, bandwidth_gbs=r.limits.bandwidth_gbs, perf_model_pp=r.perf_model_pp, perf_model_tg=r.perf_model_tg,
        perf_model_tg_error=r.perf_model_tg_error, perf_model_note=r.perf_model_note,
        pp_probe_samples=tuple(r.measured.pp_probe_tok_s), tg_probe_samples=tuple(r.measured.tg_probe_tok_s),
        pp_level=r.level("pp"), tg_level=r.level("tg"), pp_matched_error=r.matched_error("pp"), tg_matched_error=r.matched_error("tg"),
        pp_scored_error=r.scored_error("pp") if r.measured.pp_tok_s else None,
        tg_scored_error=r.scored_error("tg") if r.measured.tg_tok_s else None,
        tg_state_probe_samples=tuple(r.measured.tg_state_probe_tok_s), tg_states=tuple(r.machine_states()),
        tg_cache_scale=r.cache_scale(), tg_state_error=r.state_error() if r.measured.tg_tok_s else None)


def validate(*, models: tuple[str, ...] | None = None, presets: tuple[str, ...] = ("Q4_K_M", "Q8_0"), gguf_paths: tuple[str, ...] = (),
             threads: int | None = None, repetitions: int = 3, n_prompt: int = 512, n_gen: int = 128, realtime: bool = False,
             profile: bool = True, on_row: Callable[[Any], None] | None = None, rounds: int = 1,
             probe: bool = True, state: bool = False) -> ValidationReport:
    """Toy models (random weights, each preset) and any GGUF given, through real llama.cpp here and
    through the speed model: measured vs predicted prefill and decode tokens/s, llama-bench style.
    ``probe``: time the level probe around every repetition and score each row at the machine's
    speed level of that moment (hardware.validate.ValidationRow.matched_error); ``rounds``: passes.
    ``state``: with the probe and a profile whose calibrate measured a cache ramp, also time the
    state probes and score decode at the machine's state they give (ValidationRow.state_error; the
    level probe's ratio stays beside it)."""
    from ..hardware import validate as v

    models = tuple(models) if models is not None else tuple(v.TOY_MODELS)
    for m in models:
        if m not in v.TOY_MODELS:
            raise UnknownNameError("toy model", m, v.TOY_MODELS)
    for p in presets:
        if p not in v.FTYPES:
            raise UnknownNameError("quantization preset", p, v.FTYPES)
    rows = v.validate_llama_cpp(models, tuple(presets), threads, repetitions, n_prompt, n_gen, tuple(gguf_paths), on_row=on_row,
                                rt=realtime, profile=profile, rounds=rounds, probe=probe, state=state)
    return ValidationReport(n_prompt, n_gen, repetitions, tuple(validation_row(r) for r in rows), tuple(rows))

"""``simulate(...) -> SimReport``: one workload through the engines' KV managers and schedulers.

Each engine serves the same requests with its own rules (llama.cpp's slots, vLLM's paged blocks,
SGLang's radix tree). The KV pool is either given in tokens (every engine the same) or sized from a
model on a machine; then each engine's pool and its step times come from one placement
(``kv.pool.engine_placement``), and steps last seconds instead of one unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError
from ..kv.registry import ENGINES, manager_class
from ..kv.simulator import Request, Run
from .report import Report


_NAME_OPTIONS = {"version", "schedule_policy"}  # the managers' options that are names; kv_unified a flag; the rest numbers
_FLAG_OPTIONS = {"kv_unified"}
MAX_OPTION = 1 << 53  # an engine option beyond this (tokens, MiB, sequences) is a typo, and overflows once scaled
MAX_POOL_TOKENS = 1 << 31  # the simulators keep per-block state; a pool this large is a typo, not a machine


@dataclass(frozen=True)
class EngineRun:
    engine: str
    capacity_tokens: int
    pool: str  # how the pool was sized ("given", or the engine's rule on the placement)
    n_gpu_layers: int | None  # of the placement the steps are priced on (timed runs)
    time_model: str | None
    config: dict[str, Any]
    summary: dict[str, Any]
    events: tuple[dict[str, Any], ...] | None = None  # per-step events (kv.events, as dicts) when asked for: what each step did to the cache
    _run: Run | None = None  # the simulator's full result (records, timeline): not in to_dict()


@dataclass(frozen=True)
class SimReport(Report):
    workload: str
    n_requests: int
    prompt_tokens: int
    time_unit: str  # "s" (priced by the speed model) or "step"
    model: str | None
    machine: str | None
    runs: tuple[EngineRun, ...]

    def run(self, engine: str) -> EngineRun:
        for r in self.runs:
            if r.engine == engine:
                return r
        raise InvalidValueError(f"no run for engine {engine!r}; this report has {', '.join(r.engine for r in self.runs)}")


def _engines(engines: str | Iterable[str]) -> list[str]:
    if not isinstance(engines, (str, list, tuple)) or not all(isinstance(e, str) for e in engines):
        raise InvalidValueError(f"engines must be engine names ('vllm,sglang' or a list of them, from {', '.join(ENGINES)}), "
                                f"got {engines!r:.60}")
    names = [e.strip() for e in engines.split(",")] if isinstance(engines, str) else list(engines)
    names = [e for e in names if e]
    if not names:
        raise InvalidValueError(f"name at least one engine, from {', '.join(ENGINES)}")
    for e in names:
        manager_class(e)  # UnknownNameError with the valid names
    if len(set(names)) != len(names):
        raise InvalidValueError(f"engines named twice: {names}")
    return names


def simulate(requests: Iterable[Request], *, engines: str | Iterable[str] = ("llamacpp", "vllm", "sglang"),
             capacity_tokens: int | None = None, model: Any = None, machine: Any = None, quant: str = "Q4_K_M",
             kv_type: str = "f16", speed: Any = "calibrated", timed: bool | None = None,
             engine_options: Mapping[str, Mapping[str, Any]] | None = None, workload: str = "",
             record_timeline: bool = False, record_events: bool = False, progress: Callable[[str, int, int, float], None] | None = None) -> SimReport:
    """Serve ``requests`` with each engine and report its summary.

    ``capacity_tokens``: the KV pool of every engine, in tokens; or ``model`` and ``machine``
    (names or objects): each engine's pool by its own rule (kv.pool) on the placement it runs with,
    and (``timed``, default on with a model) its step times priced on that same placement.
    ``engine_options``: per engine, keyword options of its manager (``{"vllm": {"block_size": 32}}``).
    ``record_events``: each run's per-step events (admissions, allocations with block ids and hashes,
    prefix hits, evictions, preemptions, finishes), as the simulator recorded them.
    """
    from ..errors import check_positive
    from ..kv.pool import engine_placement, kv_pool_tokens
    from ..kv.simulator import simulate as run_sim
    from ..kv.time_model import TimeModel

    names = _engines(engines)
    if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Iterable):
        raise InvalidValueError(f"requests must be an iterable of kv.simulator.Request, got {type(requests).__name__} {requests!r:.60}")
    reqs = list(requests)
    if not all(isinstance(r, Request) for r in reqs):
        bad = next(r for r in reqs if not isinstance(r, Request))
        raise InvalidValueError(f"requests must hold kv.simulator.Request objects, got {type(bad).__name__} {bad!r:.60}")
    if not reqs:
        raise InvalidValueError("simulate needs at least one request")
    if capacity_tokens is not None:
        check_positive("capacity_tokens", capacity_tokens)
        if isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, int):
            raise InvalidValueError(f"capacity_tokens must be an integer number of tokens, got {capacity_tokens!r}")
        if capacity_tokens > MAX_POOL_TOKENS:
            raise InvalidValueError(f"capacity_tokens {capacity_tokens:,} is beyond any KV pool (at most {MAX_POOL_TOKENS:,} tokens: "
                                    "eight 141 GB GPUs hold about 8.6 million tokens of an 8B model's f16 KV at 128 KiB per token)")
    if capacity_tokens is None and (model is None or machine is None):
        raise InvalidValueError("give capacity_tokens, or a model and a machine to size the KV pool")
    if (model is None) != (machine is None):
        raise InvalidValueError("model and machine go together")
    if timed and model is None:
        raise InvalidValueError("timed runs need a model and a machine")
    timed = bool(model is not None) if timed is None else timed
    opts = {e: dict((engine_options or {}).get(e, {})) for e in names}
    for e, o in opts.items():  # numbers a manager would turn into ints or loop on: finite, and not bools
        for k, v in o.items():
            if v is None:
                continue  # the engine's default
            want = str if k in _NAME_OPTIONS else bool if k in _FLAG_OPTIONS else (int, float)
            if isinstance(v, bool) != (want is bool) or not isinstance(v, want):
                kind = "a name" if want is str else "true or false" if want is bool else "a number"
                raise InvalidValueError(f"{e} option {k} must be {kind}, got {type(v).__name__} {v!r:.40}")
            if isinstance(v, float) and not math.isfinite(v):
                raise InvalidValueError(f"{e} option {k} must be a finite number, got {v!r}")
            if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > MAX_OPTION:
                raise InvalidValueError(f"{e} option {k} = {v:.6g} is beyond any engine's setting (at most 2^53)")
    unknown = set(engine_options or {}) - set(names)
    if unknown:
        raise InvalidValueError(f"options given for engines not simulated: {sorted(unknown)}")
    runs = []
    spec = mc = None
    if model is not None:
        from ..hardware.resolve import resolve_machine
        from ..models.resolve import resolve_model

        spec, mc = resolve_model(model), resolve_machine(machine)
    for e in names:
        placement = engine_placement(e, spec, mc, quant, kv_type) if spec is not None else None
        if capacity_tokens is not None:
            cap = capacity_tokens
        else:
            cap = kv_pool_tokens(e, spec, mc, quant, kv_type, placement=placement)
        tm = TimeModel.from_placement(placement, mc, speed) if timed and placement is not None else None
        manager = manager_class(e)(capacity_tokens=cap, **{k: v for k, v in opts[e].items() if v is not None})
        cb = (lambda done, total, now, _e=e: progress(_e, done, total, now)) if progress else None
        run = run_sim(reqs, manager, tm, progress=cb, record_timeline=record_timeline, record_events=record_events)
        runs.append(EngineRun(e, cap, "given" if capacity_tokens is not None else f"{e}'s rule on its placement (kv.pool)",
                              placement.n_gpu_layers if placement is not None else None, tm.name if tm else None,
                              dict(run.config), dict(run.summary),
                              tuple(e.to_dict() for e in run.events) if record_events and run.events is not None else None,
                              run))
    return SimReport(workload=workload, n_requests=len(reqs), prompt_tokens=sum(len(r.prompt) for r in reqs),
                     time_unit="s" if any(r.time_model for r in runs) else "step",
                     model=spec.name if spec else None, machine=mc.name if mc else None,
                     runs=tuple(runs))

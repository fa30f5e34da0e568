"""The shared serving loop: requests, per-request state, the manager interface, the run loop,
the accounting (records, summary, timeline) and the invariant checks every manager obeys.

Each manager (slots.py, paged.py, radix.py) is an engine's whole KV policy *and* scheduler:
``step(now)`` decides what one engine iteration computes, advances the requests it scheduled and
returns a :class:`StepStats`. This module owns time: without a time model a step lasts one
unit (1.0 simulated second); with one, a step lasts what its batched prefill and decode tokens
cost.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InferlabError, InvalidValueError
from .events import Finish, FirstToken, Reject, StepEvents
from .tokens import RunTokens, concat, generated_output, to_runs


class InvariantError(InferlabError, AssertionError):
    """A manager broke one of the simulator's invariants (a bug, reported with the numbers)."""


class SimulationStuckError(InferlabError, RuntimeError):
    """The manager scheduled nothing while requests were pending and none can still arrive."""


# --------------------------------------------------------------------------------------------
# requests


@dataclass(frozen=True)
class Request:
    """One request: token ids in, ``max_new_tokens`` generated.

    ``output`` is the known reply (token ids, length ``max_new_tokens``) so that a later turn can
    repeat it; without one, deterministic ids unique to ``id`` are generated
    (:func:`inferlab.kv.tokens.generated_output`).
    """

    id: Any
    arrival_s: float
    prompt: Sequence[int]
    max_new_tokens: int
    output: Sequence[int] | None = None

    def __post_init__(self) -> None:
        a = self.arrival_s
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
            raise InvalidValueError(f"request {self.id!r}: arrival_s must be a finite number >= 0, got {a!r}")
        m = self.max_new_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InvalidValueError(f"request {self.id!r}: max_new_tokens must be an integer >= 1, got {m!r}")
        if len(self.prompt) < 1:
            raise InvalidValueError(f"request {self.id!r}: prompt must hold at least one token id")
        _check_ids(self.id, "prompt", self.prompt)
        if self.output is not None:
            if len(self.output) != m:
                raise InvalidValueError(
                    f"request {self.id!r}: output has {len(self.output)} token ids but max_new_tokens is {m}"
                )
            _check_ids(self.id, "output", self.output)

    def output_tokens(self) -> Sequence[int]:
        return self.output if self.output is not None else generated_output(self.id, self.max_new_tokens)


def _check_ids(rid: object, what: str, ids: Sequence[int]) -> None:
    if isinstance(ids, RunTokens):
        bad = next((s for s, _ in ids.runs if not isinstance(s, int) or s < 0), None)
    else:
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0), None)
    if bad is not None:
        raise InvalidValueError(f"request {rid!r}: {what} token ids must be integers >= 0, found {bad!r}")


class Seq:
    """A request being served: what the engine knows about it, plus the accounting."""

    def __init__(self, req: Request, index: int):
        self.req = req
        self.index = index
        self.prompt_runs = to_runs(req.prompt)
        self.prompt_len = len(req.prompt)
        self.out_len = req.max_new_tokens
        self.runs = concat(self.prompt_runs, to_runs(req.output_tokens()))  # prompt + reply
        self.num_computed = 0  # tokens whose KV is in the pool (engine view)
        self.num_output = 0  # tokens sampled so far
        # accounting
        self.cached_tokens: int | None = None  # prompt tokens reused at first admission
        self.computed_prompt_tokens = 0
        self.recomputed_tokens = 0  # tokens recomputed after preemption/retraction
        self.preemptions = 0
        self.admitted_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.rejected: str | None = None
        self.truncated = False

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens (vLLM's ``request.num_tokens``)."""
        return self.prompt_len + self.num_output

    def note_first_admission(self, cached: int, now: float) -> None:
        """Record the prompt hit the first time the request is admitted; later ones are recompute."""
        if self.cached_tokens is None:
            self.cached_tokens = cached
            self.computed_prompt_tokens = self.prompt_len - cached
            self.admitted_s = now
        else:
            self.recomputed_tokens += self.num_tokens - cached

    def __repr__(self) -> str:
        return f"Seq({self.req.id!r}, computed={self.num_computed}, out={self.num_output}/{self.out_len})"


@dataclass
class StepStats:
    """What one engine iteration did."""

    prefill_tokens: int = 0  # prompt (or recompute) tokens computed
    decode_tokens: int = 0  # one per decoding request
    context_tokens: int = 0  # KV tokens the batch attends to (for the time model)
    first_token: list[Seq] = field(default_factory=list)
    finished: list[Seq] = field(default_factory=list)
    rejected: list[Seq] = field(default_factory=list)
    num_running: int = 0  # requests holding a running state during this step


class KVManager:
    """The interface every engine's manager implements (see slots.py, paged.py, radix.py)."""

    engine = "abstract"
    hit_rate_name = "hit_rate"
    request_type: type[Seq] = Seq  # the engine's per-request state: a Seq subclass declaring its fields
    events: list | None = None  # a list while a run records per-step events (see events.py), else None

    def set_events(self, events: list | None) -> None:
        """Start (a list to append :mod:`~inferlab.kv.events` records to) or stop (None)
        recording events."""
        self.events = events

    def __init__(self, capacity_tokens: int):
        if isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, int) or capacity_tokens < 1:
            raise InvalidValueError(f"capacity_tokens must be an integer >= 1, got {capacity_tokens!r}")
        self.capacity_tokens = capacity_tokens

    # scheduling
    def add(self, seq: Seq, now: float) -> str | None:
        """Queue an arrived request; return a rejection reason if it can never be served."""
        raise NotImplementedError

    def step(self, now: float) -> StepStats:
        raise NotImplementedError

    @property
    def num_running(self) -> int:
        raise NotImplementedError

    @property
    def num_waiting(self) -> int:
        raise NotImplementedError

    # accounting
    def kv_used_tokens(self) -> int:
        """KV cells held by requests being served."""
        raise NotImplementedError

    def kv_cached_tokens(self) -> int:
        """KV cells held only as reusable cache (evictable)."""
        raise NotImplementedError

    def hit_rate(self) -> float | None:
        """The engine's own prefix-cache hit-rate metric."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        raise NotImplementedError

    def check_invariants(self) -> None:
        """Raise InvariantError if the manager's state is inconsistent."""
        raise NotImplementedError

    def check_drained(self) -> None:
        """After every request is done: raise InvariantError if a block/slot/lock leaked."""
        raise NotImplementedError

    # decode fast-forward (an exact shortcut, see simulate)
    def decode_horizon(self) -> tuple[int, int, int] | None:
        """If the next steps are pure decode steps with nothing else happening (no finish, no
        admission, no eviction, no preemption), return (how many such steps at most, batch size,
        context tokens of the first); else None."""
        return None

    def fast_forward(self, k: int) -> Sequence[int] | None:
        """Apply ``k`` pure decode steps at once (only after decode_horizon allowed >= k). Returns
        the KV tokens (in use + cached) after each of the k steps, or None when every step adds one
        token per running sequence (the batch), so that the time-averaged KV (kv_mean_tokens) comes
        out as stepping one by one gives it."""
        raise NotImplementedError

    # shared helper
    @staticmethod
    def advance(seq: Seq, num_new: int, st: StepStats) -> bool:
        """The forward pass computed ``num_new`` more tokens of ``seq``; sample if caught up.

        Returns True when the request has generated its last token.
        """
        seq.num_computed += num_new
        if seq.num_computed < seq.num_tokens:
            return False
        seq.num_output += 1
        if seq.first_token_s is None and seq.num_output == 1:
            st.first_token.append(seq)
        return seq.num_output >= seq.out_len


def _fail(msg: str) -> None:
    raise InvariantError(msg)


def check_common(manager: KVManager) -> None:
    """Invariants every manager obeys: the pool is never over-full."""
    used, cached = manager.kv_used_tokens(), manager.kv_cached_tokens()
    if used < 0 or cached < 0:
        _fail(f"{manager.engine}: negative KV accounting used={used} cached={cached}")
    if used + cached > manager.capacity_tokens:
        _fail(f"{manager.engine}: KV use {used}+{cached} exceeds capacity {manager.capacity_tokens}")


# --------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class RequestRecord:
    id: Any
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # generated (may be < max_new_tokens when truncated or rejected)
    cached_tokens: int
    computed_prompt_tokens: int
    recomputed_tokens: int
    preemptions: int
    queue_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    finish_s: float | None
    rejected: str | None = None
    truncated: bool = False


@dataclass(frozen=True)
class Run:
    """One simulation: ``summary`` (dict), ``requests`` (records), ``timeline`` (dict of lists),
    ``events`` (one :class:`~inferlab.kv.events.StepEvents` per step, with record_events)."""

    engine: str
    config: dict[str, Any]
    summary: dict[str, Any]
    requests: tuple[RequestRecord, ...]
    timeline: dict[str, Sequence[float]]
    events: tuple[StepEvents, ...] | None = None

    def __getitem__(self, key: str):  # the seed reads run["summary"]
        if key not in ("engine", "config", "summary", "requests", "timeline", "events"):
            raise KeyError(key)
        return getattr(self, key)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of already sorted values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _record(s: Seq) -> RequestRecord:
    r = s.req
    served = s.rejected is None
    ttft = s.first_token_s - r.arrival_s if s.first_token_s is not None else None
    tpot = None
    if served and s.num_output > 1 and s.first_token_s is not None and s.finish_s is not None:
        tpot = (s.finish_s - s.first_token_s) / (s.num_output - 1)
    return RequestRecord(
        id=r.id,
        arrival_s=r.arrival_s,
        prompt_tokens=s.prompt_len,
        output_tokens=s.num_output,
        cached_tokens=s.cached_tokens or 0,
        computed_prompt_tokens=s.computed_prompt_tokens,
        recomputed_tokens=s.recomputed_tokens,
        preemptions=s.preemptions,
        queue_s=s.admitted_s - r.arrival_s if s.admitted_s is not None else None,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=s.finish_s - r.arrival_s if served and s.finish_s is not None else None,
        finish_s=s.finish_s,
        rejected=s.rejected,
        truncated=s.truncated,
    )


def _summarize(manager: KVManager, records: Sequence[RequestRecord], *, duration_s: float, steps: int,
               peak_concurrency: int, kv_peak: int, kv_mean: float, prefill_total: int, timed: bool) -> dict:
    served = [r for r in records if r.rejected is None]
    prompt = sum(r.prompt_tokens for r in served)
    computed = sum(r.computed_prompt_tokens for r in served)
    out_tokens = sum(r.output_tokens for r in served)
    unit = "s" if timed else "steps"

    def pct(name: str) -> dict[str, float | None]:
        vals = sorted(getattr(r, name) for r in served if getattr(r, name) is not None)
        return {f"p{q}": percentile(vals, q) for q in (50, 90, 99)}

    return {
        "engine": manager.engine,
        "requests": len(records),
        "finished": len(served),
        "rejected": len(records) - len(served),
        "prompt_tokens": prompt,
        "prefill_computed": computed,
        "cached_tokens": prompt - computed,
        "prefill_saved_frac": (prompt - computed) / prompt if prompt else 0.0,
        "recomputed_tokens": sum(r.recomputed_tokens for r in served),
        "prefill_tokens_total": prefill_total,  # including recompute after preemption
        "output_tokens": out_tokens,
        "peak_concurrency": peak_concurrency,
        "preemptions": sum(r.preemptions for r in records),
        "hit_rate_name": manager.hit_rate_name,
        "hit_rate": manager.hit_rate(),
        "kv_capacity_tokens": manager.capacity_tokens,
        "kv_peak_tokens": kv_peak,
        "kv_mean_tokens": kv_mean,
        "steps": steps,
        "time_unit": unit,
        "duration": duration_s,
        "throughput_tok_per_unit": out_tokens / duration_s if duration_s > 0 else 0.0,
        "requests_per_unit": len(served) / duration_s if duration_s > 0 else 0.0,
        "ttft": pct("ttft_s"),
        "tpot": pct("tpot_s"),
        "e2e": pct("e2e_s"),
        "queue": pct("queue_s"),
        "truncated": sum(r.truncated for r in served),
    }


# --------------------------------------------------------------------------------------------
# the loop


def simulate(requests: Iterable[Request], manager: KVManager, time_model=None, *,
             check_invariants: bool = False, record_timeline: bool = True, fast_forward: bool = True,
             record_events: bool = False, progress: Callable[[int, int, float], None] | None = None) -> Run:
    """Serve ``requests`` (sorted by arrival) with ``manager``; return the :class:`Run`.

    ``time_model`` (see time_model.py) prices each step; without one a step lasts 1.0.
    ``check_invariants`` re-checks the manager's invariants after every step (tests).
    ``progress(done, total, now)`` is called every 2,000 steps and at the end.
    ``fast_forward`` lets stretches of pure decode steps (nothing arrives, finishes, is admitted
    or evicted) be applied at once; the result is the same as stepping one by one (tests
    compare both), it only saves time on long traces.
    ``record_events`` returns ``Run.events``: per step, what the manager did (admissions,
    allocations, prefix hits, cache registrations, evictions, preemptions, frees, first tokens,
    finishes; see events.py). It steps one by one (no fast-forward); results are the same.
    """
    reqs = list(requests)
    if not reqs:
        raise InvalidValueError("simulate needs at least one request")
    ids: set = set()
    for k, r in enumerate(reqs):
        if not isinstance(r, Request):
            raise InvalidValueError(f"requests[{k}] is {type(r).__name__}, expected Request")
        if k and r.arrival_s < reqs[k - 1].arrival_s:
            raise InvalidValueError(
                f"arrival times out of order: request {r.id!r} arrives at {r.arrival_s} "
                f"after request {reqs[k - 1].id!r} at {reqs[k - 1].arrival_s}; sort requests by arrival_s")
        if r.id in ids:
            raise InvalidValueError(f"duplicate request id {r.id!r}")
        ids.add(r.id)

    seq_type = manager.request_type
    seqs = [seq_type(r, k) for k, r in enumerate(reqs)]
    n, nxt, done, steps = len(seqs), 0, 0, 0
    now = 0.0
    peak_conc = kv_peak = 0
    kv_area = 0.0
    prefill_total = 0
    tl_t, tl_used, tl_cached, tl_run, tl_wait = (array("d") for _ in range(5))
    idle_steps = 0
    buf: list | None = None
    step_events: list[StepEvents] = []
    if record_events:
        buf = []
        fast_forward = False
        manager.set_events(buf)

    def observe(t: float) -> tuple[int, int]:
        """KV in use and cached after a step (or a fast-forwarded stretch) ending at ``t``; one
        timeline point."""
        used, cached = manager.kv_used_tokens(), manager.kv_cached_tokens()
        if record_timeline:
            tl_t.append(t)
            tl_used.append(used)
            tl_cached.append(cached)
            tl_run.append(manager.num_running)
            tl_wait.append(manager.num_waiting)
        return used, cached

    while done < n:
        while nxt < n and seqs[nxt].req.arrival_s <= now:
            s = seqs[nxt]
            nxt += 1
            reason = manager.add(s, now)
            if reason is not None:
                s.rejected, s.finish_s = reason, now
                done += 1
                if buf is not None:
                    buf.append(Reject(s.req.id, reason))
        if manager.num_running + manager.num_waiting == 0:
            if nxt < n:
                now = max(now, seqs[nxt].req.arrival_s)
                continue
            if done < n:
                raise SimulationStuckError(f"{manager.engine}: {n - done} requests neither finished nor rejected")
            break
        horizon = manager.decode_horizon() if fast_forward else None
        if horizon is not None and horizon[0] >= 2:
            k_max, batch, ctx = horizon
            limit = seqs[nxt].req.arrival_s if nxt < n else math.inf
            k, span, dts = 0, 0.0, []
            while k < k_max and (k == 0 or now + span < limit):
                dts.append(1.0 if time_model is None else time_model.step_time(0, batch, ctx + k * batch))
                span += dts[-1]
                k += 1
            if k >= 2:
                kv0 = manager.kv_used_tokens() + manager.kv_cached_tokens()
                after = manager.fast_forward(k)
                for j, dt in enumerate(dts):  # as stepping adds them: the KV after each step x its duration
                    now += dt
                    kv_area += (after[j] if after is not None else kv0 + (j + 1) * batch) * dt
                steps += k
                if check_invariants:
                    check_common(manager)
                    manager.check_invariants()
                used, cached = observe(now)
                peak_conc = max(peak_conc, batch)
                kv_peak = max(kv_peak, used + cached)
                if progress is not None and steps % 2000 < k:
                    progress(done, n, now)
                continue
        st = manager.step(now)
        for s in st.rejected:  # rejected during scheduling (e.g. context exceeded): time of the step
            s.finish_s = now
        done += len(st.rejected)
        if buf is not None:
            buf.extend(Reject(s.req.id, s.rejected or "") for s in st.rejected)
            buf.extend(FirstToken(s.req.id) for s in st.first_token)
            buf.extend(Finish(s.req.id, s.num_output, s.truncated) for s in st.finished)
        if st.prefill_tokens + st.decode_tokens == 0:
            if st.finished or st.rejected:  # e.g. generation stopped at the context limit
                for s in st.finished:
                    s.finish_s = now
                done += len(st.finished)
                if buf:
                    step_events.append(StepEvents(steps, now, 0, 0, manager.kv_used_tokens(),
                                                  manager.kv_cached_tokens(), tuple(buf)))
                    buf.clear()
                continue
            idle_steps += 1
            if nxt < n:  # nothing runnable until something arrives
                now = max(now, seqs[nxt].req.arrival_s)
                continue
            if idle_steps > 3:
                raise SimulationStuckError(
                    f"{manager.engine}: nothing scheduled with {manager.num_waiting} waiting and "
                    f"{manager.num_running} running and no arrivals left")
            continue
        idle_steps = 0
        dt = 1.0 if time_model is None else time_model.step_time(
            st.prefill_tokens, st.decode_tokens, st.context_tokens)
        now += dt
        steps += 1
        prefill_total += st.prefill_tokens
        for s in st.first_token:
            s.first_token_s = now
        for s in st.finished:
            s.finish_s = now
        done += len(st.finished)
        if check_invariants:
            check_common(manager)
            manager.check_invariants()
        used, cached = observe(now)
        if buf is not None:
            step_events.append(StepEvents(steps, now, st.prefill_tokens, st.decode_tokens, used, cached, tuple(buf)))
            buf.clear()
        peak_conc = max(peak_conc, st.num_running)
        kv_peak = max(kv_peak, used + cached)
        kv_area += (used + cached) * dt
        if progress is not None and steps % 2000 == 0:
            progress(done, n, now)
    if progress is not None:
        progress(done, n, now)
    if check_invariants:
        manager.check_drained()
    if buf is not None:
        manager.set_events(None)
        if buf:
            step_events.append(StepEvents(steps, now, 0, 0, manager.kv_used_tokens(), manager.kv_cached_tokens(),
                                          tuple(buf)))

    records = tuple(_record(s) for s in seqs)
    start = reqs[0].arrival_s
    duration = max(now - start, 0.0)
    summary = _summarize(manager, records, duration_s=duration, steps=steps, peak_concurrency=peak_conc,
                         kv_peak=kv_peak, kv_mean=kv_area / duration if duration > 0 else 0.0,
                         prefill_total=prefill_total, timed=time_model is not None)
    timeline: dict[str, Sequence[float]] = {"t": list(tl_t), "kv_used_tokens": list(tl_used), "kv_cached_tokens": list(tl_cached),
                "running": list(tl_run), "waiting": list(tl_wait)}
    return Run(engine=manager.engine, config=manager.config(), summary=summary, requests=records,
               timeline=timeline, events=tuple(step_events) if record_events else None)

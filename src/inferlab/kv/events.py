"""Per-step events of a simulation run: what each engine iteration did to the KV cache.

``simulate(..., record_events=True)`` returns ``Run.events``, one :class:`StepEvents` per step
(admissions, allocations, prefix hits, cache registrations, evictions, preemptions or
retractions, frees, first tokens, finishes), so a viewer (the web app's KV animation) can play
the simulator's own decisions instead of re-simulating them. Every record is a small frozen
dataclass with ``to_dict()`` (JSON-safe: ints, strings, lists). Recording is off by default; a
manager then holds ``events = None`` and each emit point costs one ``is None`` test.

Identifiers: ``request`` is the request's id; vLLM events name block ids and their block hashes
(64-bit ints, the simulator's chained keys, see ``kv/vllm/block_pool.py``); SGLang events name
radix-tree nodes by a per-tree integer id (``node``, its ``parent``) and count tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class Event:
    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        for k, v in asdict(self).items():
            d[k] = list(v) if isinstance(v, tuple) else v
        return d


@dataclass(frozen=True, slots=True)
class Admit(Event):
    """A waiting request joins the running batch; ``cached_tokens`` of it are a prefix hit,
    ``scheduled_tokens`` are computed in this step (less than the rest when chunked)."""

    kind: ClassVar[str] = "admit"
    request: Any
    num_tokens: int  # prompt plus tokens generated so far (more than the prompt when resumed)
    cached_tokens: int
    scheduled_tokens: int
    resumed: bool  # re-admitted after a preemption / retraction


@dataclass(frozen=True, slots=True)
class PrefixHit(Event):
    """The prefix lookup of an admitted request: vLLM's hit blocks with their hashes, or the
    SGLang tree node its match ends at (``node``; 0 = the root, nothing matched)."""

    kind: ClassVar[str] = "prefix_hit"
    request: Any
    tokens: int
    blocks: tuple[int, ...] = ()
    hashes: tuple[int, ...] = ()
    node: int | None = None


@dataclass(frozen=True, slots=True)
class Allocate(Event):
    """KV for new tokens: vLLM's block ids taken from the free queue (``blocks``), SGLang's
    token cells (``tokens``)."""

    kind: ClassVar[str] = "allocate"
    request: Any
    tokens: int
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Cache(Event):
    """Content becomes shareable: vLLM registers full blocks' hashes in the hash map; SGLang
    inserts ``tokens`` tokens into the tree, ending at ``node`` (``new_tokens`` were not there;
    ``from_request`` of the request's private cells pass to the tree or, duplicates, are freed)."""

    kind: ClassVar[str] = "cache"
    request: Any
    blocks: tuple[int, ...] = ()
    hashes: tuple[int, ...] = ()
    tokens: int = 0
    new_tokens: int = 0
    from_request: int = 0
    node: int | None = None


@dataclass(frozen=True, slots=True)
class Evict(Event):
    """Cached content dropped to make room: vLLM blocks (their hashes leave the map), or SGLang
    tree leaves (``nodes``) holding ``tokens`` tokens."""

    kind: ClassVar[str] = "evict"
    tokens: int
    blocks: tuple[int, ...] = ()
    hashes: tuple[int, ...] = ()
    nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Free(Event):
    """A request lets go of its KV (finish or preemption): vLLM's block table, tail first (the
    blocks nobody else holds return to the free queue), or SGLang's private tokens."""

    kind: ClassVar[str] = "free"
    request: Any
    tokens: int
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Preempt(Event):
    """vLLM preemption by recompute / SGLang retraction: back to the waiting queue."""

    kind: ClassVar[str] = "preempt"
    request: Any
    computed_tokens: int  # KV it had, to be recomputed (less what a later prefix hit saves)


@dataclass(frozen=True, slots=True)
class FirstToken(Event):
    kind: ClassVar[str] = "first_token"
    request: Any


@dataclass(frozen=True, slots=True)
class Finish(Event):
    kind: ClassVar[str] = "finish"
    request: Any
    output_tokens: int
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Reject(Event):
    kind: ClassVar[str] = "reject"
    request: Any
    reason: str


@dataclass(frozen=True, slots=True)
class StepEvents:
    """One engine iteration: its index, when it ended, its token counts and what happened.
    Arrival-time rejections are listed in the step they precede."""

    step: int
    t: float
    prefill_tokens: int
    decode_tokens: int
    kv_used_tokens: int
    kv_cached_tokens: int
    events: tuple[Event, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "t": self.t, "prefill_tokens": self.prefill_tokens,
                "decode_tokens": self.decode_tokens, "kv_used_tokens": self.kv_used_tokens,
                "kv_cached_tokens": self.kv_cached_tokens, "events": [e.to_dict() for e in self.events]}

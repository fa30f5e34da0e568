"""How long one engine step lasts.

A :class:`TimeModel` wraps a per-step cost function ``cost(prefill_tokens, decode_batch,
context_tokens) -> seconds``; the simulator calls :meth:`TimeModel.step_time` once per step.
:meth:`TimeModel.from_placement` builds the cost from the performance model on one placement
(``from_perf_model`` places a model on a machine first): a step costs the prefill of its prompt
tokens plus one decode step of its decode batch at the batch's mean context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import InvalidValueError

StepCost = Callable[[int, int, int], float]
CONTEXT_BUCKET_TOKENS = 256  # perf-model step costs are memoised per 256-token context bucket


@dataclass(frozen=True)
class TimeModel:
    """Seconds per engine step from a cost function of (prefill tokens, decode batch, context tokens)."""

    cost: StepCost
    name: str = "custom"

    def step_time(self, prefill_tokens: int, decode_tokens: int, context_tokens: int) -> float:
        s = self.cost(prefill_tokens, decode_tokens, context_tokens)
        if not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise InvalidValueError(
                f"time model {self.name!r} gave {s!r} s for a step of {prefill_tokens} prefill and "
                f"{decode_tokens} decode tokens; a step must take a finite time > 0")
        return float(s)

    @classmethod
    def linear(cls, *, prefill_tok_per_s: float, decode_step_s: float, per_seq_s: float = 0.0,
               per_context_token_s: float = 0.0) -> TimeModel:
        """A roofline-shaped toy: prefill at a rate, a fixed decode step, linear extras."""
        for name, v in (("prefill_tok_per_s", prefill_tok_per_s), ("decode_step_s", decode_step_s)):
            if not v > 0:
                raise InvalidValueError(f"{name} must be > 0, got {v!r}")

        def cost(p: int, b: int, c: int) -> float:
            s = p / prefill_tok_per_s  # prompt tokens at the prefill rate
            if b:
                s += decode_step_s + b * per_seq_s  # one weight pass, plus per-sequence work
            return s + c * per_context_token_s  # attention reads the context's KV

        return cls(cost, name="linear")

    @classmethod
    def from_placement(cls, placement: Any, machine: Any, speed: Any = "calibrated") -> TimeModel:
        """Step costs on one placement: ``prefill_time`` + batched ``decode_step_time``.

        A mixed step is priced as its prefill plus one decode step at the decode sequences' mean
        context (``context_tokens / sequences``), which counts the weight read twice; costs are
        memoised per 256-token context bucket. ``speed``: "calibrated" (fitted on published
        llama-bench results, as ``inferlab fit`` reports), "bandwidth-only" (fixed efficiencies)
        or a ``SpeedModel``.
        """
        from ..perf.calibration import speed_model
        from ..perf.speed import decode_step_time, prefill_time

        sm = speed_model(speed)

        @lru_cache(maxsize=65536)
        def prefill_s(p: int) -> float:
            return prefill_time(placement, machine, p, sm)["total_s"]

        @lru_cache(maxsize=65536)
        def decode_s(b: int, ctx_bucket: int) -> float:
            return decode_step_time(placement, machine, ctx_bucket, batch=b, model=sm)["total_s"]

        def cost(p: int, b: int, c: int) -> float:
            s = prefill_s(p) if p else 0.0
            if b:
                mean_ctx = c / b if not p else c / (b + 1)
                bucket = max(CONTEXT_BUCKET_TOKENS, -(-int(mean_ctx) // CONTEXT_BUCKET_TOKENS) * CONTEXT_BUCKET_TOKENS)
                s += decode_s(b, bucket)
            return s

        return cls(cost, name=f"{placement.model.name}@{machine.name}, -ngl {placement.n_gpu_layers} ({sm.name})")

    @classmethod
    def from_perf_model(cls, model: Any, machine: Any, quant: str = "Q4_K_M", *, kv_type: str = "f16",
                        n_ctx: int = 8192, n_gpu_layers: int | None = None, speed: Any = "calibrated") -> TimeModel:
        """Step costs of ``model`` on ``machine`` placed as llama.cpp places it (its layer order,
        ``--fit`` unless ``n_gpu_layers`` is given); see :meth:`from_placement`.

        ``model``/``machine`` are catalog names (``"llama-3.1-8b"``, ``"rtx4090"``) or objects.
        """
        from ..hardware.resolve import resolve_machine
        from ..models.resolve import resolve_model
        from ..perf.placement import place

        model, machine = resolve_model(model), resolve_machine(machine)
        placement = place(model, machine, quant, n_ctx, kv_type=kv_type, n_gpu_layers=n_gpu_layers)
        return cls.from_placement(placement, machine, speed)

"""llama.cpp server's slots: what one slot holds (``server_slot``) and the task it serves.

A slot owns one KV sequence (``seq_id = slot id``): the tokens of its last prompt and reply stay
there after the task, as that slot's prefix cache. The server loop (server.py) chooses slots,
launches tasks and batches tokens; this module is only the per-slot and per-task state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..simulator import Seq
from ..tokens import Run, slice_runs


class SlotState(enum.Enum):
    """``slot_state`` (tools/server/server-context.cpp)."""

    IDLE = "idle"
    STARTED = "started"  # task assigned; its prompt not looked at yet (n_past unknown)
    PROCESSING_PROMPT = "processing_prompt"
    DONE_PROMPT = "done_prompt"  # the whole prompt is in this iteration's batch
    GENERATING = "generating"


@dataclass(slots=True, eq=False)
class SlotTask:
    """The request a slot serves: the task and its ``server_slot_stats``."""

    seq: Seq
    id_slot: int
    n_prompt_cached: int = 0  # stats.n_prompt_cached: the response's timings.cache_n


@dataclass(slots=True, eq=False)
class Slot:
    """``server_slot``: its id, context, KV-resident tokens, last-use time, state and task.

    ``n_tokens`` is the number of KV cells the slot's sequence holds. While a task runs past
    ``STARTED`` these are the task's first ``seq.num_computed`` tokens (``runs`` is then unused);
    when idle (or STARTED) ``runs`` are the tokens themselves.
    """

    id: int
    n_ctx: int  # context of one slot (n_ctx_slot)
    runs: tuple[Run, ...] = ()
    n_tokens: int = 0
    t_last_used: int = -1  # ggml_time_us() at the last release; -1: never used
    state: SlotState = SlotState.IDLE
    task: SlotTask | None = field(default=None)

    def is_processing(self) -> bool:
        return self.state is not SlotState.IDLE

    def tokens(self) -> tuple[Run, ...]:
        """The slot's KV-resident tokens (``prompt.tokens``)."""
        if self.task is not None and self.state is not SlotState.STARTED:
            return slice_runs(self.task.seq.runs, 0, self.n_tokens)
        return self.runs

    def prompt_clear(self) -> None:
        """``prompt_clear``: drop the sequence's KV cells and tokens."""
        self.runs, self.n_tokens = (), 0

    def keep_first(self, n: int) -> None:
        """``prompt.tokens.keep_first(n)`` + ``seq_rm(id, n, -1)``."""
        self.runs, self.n_tokens = slice_runs(self.tokens(), 0, n), n

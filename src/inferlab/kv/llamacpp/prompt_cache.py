"""llama.cpp server's host-RAM prompt cache (``--cache-ram``), entry by entry as the server keeps it.

Follows ``server_prompt_cache`` (tools/server/server-task.cpp: ``alloc``, ``load``, ``update``) and
``llama_kv_cache::state_write`` (src/llama-kv-cache.cpp) for the size of one saved sequence, at the
llama.cpp commit llama-cpp-python 0.3.36 vendors (0c1e570). See docs/engines/llamacpp.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..tokens import Run, lcp

CELL_META_BYTES = 12  # per cell: pos (int32), n_seq_id (uint32), the one seq id (int32)
LAYER_HEADER_BYTES = 2 * 12  # per layer, K then V: type (int32) + row size (uint64), or type + el size + n_embd
STATE_HEADER_BYTES = 4 + 8  # n_stream (uint32); v_trans + n_layer (uint32 each) once per non-empty stream


def f32(x: float) -> float:
    """``x`` rounded to a C ``float`` (the server compares similarities in single precision)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def seq_state_bytes(n_tokens: int, *, kv_bytes_per_token: int, n_layers: int, n_stream: int) -> int:
    """``llama_state_seq_get_size`` of one sequence holding ``n_tokens`` cells.

    ``llama_kv_cache::state_write``: n_stream, one cell count per stream, then for the sequence's
    stream the cell metadata and each layer's K and V rows (``kv_bytes_per_token`` all layers
    together). With split KV every slot is its own stream, so the header grows with ``-np``.
    """
    size = 4 + 4 * n_stream  # n_stream + a cell count per stream
    if n_tokens:
        size += 8 + n_layers * LAYER_HEADER_BYTES  # v_trans, n_layer; per-layer K and V headers
        size += n_tokens * (CELL_META_BYTES + kv_bytes_per_token)
    return size


@dataclass(slots=True, eq=False)
class CachedPrompt:
    """One saved slot state: its tokens and the bytes the server allocated for it."""

    runs: tuple[Run, ...]
    n_tokens: int
    size_bytes: int


class PromptCache:
    """``server_prompt_cache``: saved slot states, oldest first, under a byte and a token limit."""

    def __init__(self, limit_bytes: int, limit_tokens: int):
        # server_prompt_cache(limit_size_mib, limit_tokens): 1024*1024*MiB, -1 MiB = no byte limit (0);
        # limit_tokens is the server's whole n_ctx
        self.limit_size = max(limit_bytes, 0)
        self.limit_tokens = limit_tokens
        self.states: list[CachedPrompt] = []

    def size(self) -> int:
        return sum(e.size_bytes for e in self.states)

    def n_tokens(self) -> int:
        return sum(e.n_tokens for e in self.states)

    def alloc(self, runs: tuple[Run, ...], n_tokens: int, size_bytes: int) -> bool:
        """``alloc``: save a slot's state; False when skipped (contained in an entry, or oversize)."""
        if any(lcp(e.runs, runs, n_tokens) == n_tokens for e in self.states):
            return False  # already in the cache: the new prompt is a prefix of an entry
        if self.limit_size > 0 and size_bytes > self.limit_size:
            return False  # "exceeds cache size limit, skipping": older entries stay
        # drop the entries this prompt contains
        self.states = [e for e in self.states if lcp(e.runs, runs, e.n_tokens) != e.n_tokens]
        if self.limit_size > 0:
            total = self.size()
            while self.states and total + size_bytes > self.limit_size:
                total -= self.states.pop(0).size_bytes  # make room: the oldest entry first
        self.states.append(CachedPrompt(runs, n_tokens, size_bytes))
        return True

    def best(self, slot_runs: tuple[Run, ...], slot_n: int, prompt_runs: tuple[Run, ...], prompt_len: int) -> int | None:
        """``load``'s choice: the entry keeping at least a quarter of itself whose kept fraction and
        similarity both beat the slot's own (an empty slot: any such entry); its index or None."""
        common = lcp(slot_runs, prompt_runs) if slot_n else 0
        f_keep_best = f32(common / slot_n) if slot_n else -1.0
        f_sim_best = f32(common / prompt_len)
        best = None
        for k, e in enumerate(self.states):
            c = lcp(e.runs, prompt_runs)
            f_keep, f_sim = f32(c / e.n_tokens), f32(c / prompt_len)
            if f_keep < 0.25:
                continue  # "don't trash large prompts"
            if f_keep_best < f_keep and f_sim_best < f_sim:
                f_keep_best, f_sim_best, best = f_keep, f_sim, k
        return best

    def update(self) -> None:
        """``update``: evict the oldest entries over the byte limit, then over the token limit
        (n_ctx, raised to what the byte limit holds at the average state size per token)."""
        if self.limit_size > 0:
            total = self.size()
            while self.states and total > self.limit_size:
                total -= self.states.pop(0).size_bytes
        n = self.n_tokens()
        size_per_token = max(1.0, f32(f32(self.size()) / f32(max(1, n))))
        limit_tokens_cur = self.limit_tokens
        if self.limit_size > 0:
            limit_tokens_cur = max(self.limit_tokens, int(f32(f32(self.limit_size) / size_per_token)))
        if self.limit_tokens > 0:
            while self.states and n > limit_tokens_cur:
                n -= self.states.pop(0).n_tokens

"""llama.cpp server (``tools/server``): slots, per-slot prompt reuse and the host-RAM prompt cache.

Semantics (../shared/reference/kv_managers.md section 3, llama.cpp server sources, 2026):
* ``-np`` slots (auto = 4 with one unified KV buffer of ``n_ctx`` cells; an explicit ``-np``
  splits the context: each slot gets ``n_ctx // np`` cells and never another slot's);
* a task goes to the idle slot whose tokens share the largest fraction of the new prompt
  (``--slot-prompt-similarity`` 0.10, strictly above), else to the least recently used idle
  slot; no idle slot: the task waits in a FIFO of deferred tasks;
* reuse is per slot: ``n_past = LCP(slot tokens, prompt)``, minus one if it covers the whole
  prompt (the last token is always evaluated); the slot's KV after ``n_past`` is dropped;
* after a task the slot stays idle with its KV (prompt + reply, the last sampled token excepted);
* the host-RAM prompt cache (``--cache-ram`` 8192 MiB): when a slot was chosen by LRU or keeps
  under half of its tokens, its prompt is saved to RAM and the best cached prompt (keeping at
  least a quarter of itself, beating the slot on both ratios) is loaded into it and leaves the
  cache; with ``--cache-idle-slots`` (default on) every other idle slot is saved when a task
  launches and, with unified KV, cleared from the device;
* each iteration: one token for every generating slot, then prompt tokens slot by slot in slot-id
  order up to ``n_batch`` (2048); with unified KV, when the batch finds no free cells idle slots
  are purged, then the batch is shrunk; with no cell left every processing slot fails with
  "context size exceeded";
* a prompt of ``n_ctx_slot`` tokens or more is rejected; generation stops (truncated) when the
  slot's context is full (``--context-shift`` is off by default).
Simplifications: split KV gives each slot ``n_ctx // np`` cells (llama.cpp pads the context to
256 first); an idle slot purged for room is the least recently used one; "halving the batch"
processes the largest ``n_batch / 2^k`` tokens that fit, decodes first.
Not modelled: ``--cache-reuse`` (KV shifting, default off), context shift, LoRA batching,
``id_slot`` requests.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..errors import InvalidValueError, NotSupportedError, UnknownNameError
from .simulator import InvariantError, KVManager, Seq, StepStats
from .tokens import lcp, slice_runs

LLAMACPP_VERSIONS = ("2026", "2024")  # 2024: one slot by default, split KV, no RAM prompt cache
AUTO_N_PARALLEL = 4  # -np auto resolves to 4 slots (with kv_unified)
# Bytes of KV per token used to turn --cache-ram MiB into tokens: Llama 3.1 8B, f16 K and V,
# 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 131072.
DEFAULT_KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2


class Slot:
    __slots__ = ("id", "runs", "n", "seq", "t_last_used", "generating")

    def __init__(self, sid: int):
        self.id = sid
        self.runs: tuple = ()  # tokens whose KV is resident (idle slot: its prefix cache)
        self.n = 0
        self.seq: Seq | None = None
        self.t_last_used = -1
        self.generating = False


class SlotManager(KVManager):
    """llama.cpp server's slots (default: 2026 builds, ``-np`` auto = 4 unified slots)."""

    engine = "llamacpp"
    hit_rate_name = "prompt_cached_frac"

    def __init__(self, capacity_tokens: int, *, n_parallel: int | None = None, kv_unified: bool | None = None,
                 slot_prompt_similarity: float = 0.10, cache_prompt: bool = True,
                 cache_ram_mib: float | None = None, kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN,
                 cache_idle_slots: bool | None = None, n_batch: int = 2048, cache_reuse: int = 0,
                 version: str = "2026"):
        super().__init__(capacity_tokens)
        if version not in LLAMACPP_VERSIONS:
            raise UnknownNameError("llama.cpp server version", version, LLAMACPP_VERSIONS)
        if cache_reuse:
            raise NotSupportedError("--cache-reuse (KV shifting) is not modelled; use cache_reuse=0")
        legacy = version == "2024"
        auto = n_parallel is None
        if auto:
            n_parallel = 1 if legacy else AUTO_N_PARALLEL
        if isinstance(n_parallel, bool) or not isinstance(n_parallel, int) or n_parallel < 1:
            raise InvalidValueError(f"n_parallel must be an integer >= 1, got {n_parallel!r}")
        if kv_unified is None:
            kv_unified = auto and not legacy
        if cache_ram_mib is None:
            cache_ram_mib = 0 if legacy else 8192
        if cache_idle_slots is None:
            cache_idle_slots = not legacy
        if not 0.0 <= slot_prompt_similarity <= 1.0:
            raise InvalidValueError(f"slot_prompt_similarity must be in [0, 1], got {slot_prompt_similarity!r}")
        if isinstance(n_batch, bool) or not isinstance(n_batch, int) or n_batch < 1:
            raise InvalidValueError(f"n_batch must be an integer >= 1, got {n_batch!r}")
        self.n_parallel = n_parallel
        self.kv_unified = kv_unified
        self.n_ctx_slot = capacity_tokens if kv_unified else capacity_tokens // n_parallel
        if self.n_ctx_slot < 2:
            raise InvalidValueError(f"capacity_tokens={capacity_tokens} leaves {self.n_ctx_slot} cells per slot")
        self.slot_prompt_similarity = slot_prompt_similarity
        self.cache_prompt = cache_prompt
        self.cache_ram_mib = cache_ram_mib
        if cache_ram_mib == -1:
            self.cache_ram_tokens: float = float("inf")
        else:
            if cache_ram_mib < 0:
                raise InvalidValueError(f"cache_ram_mib must be -1 (unlimited), 0 (off) or > 0, got {cache_ram_mib!r}")
            self.cache_ram_tokens = cache_ram_mib * 2**20 // kv_bytes_per_token
        self.cache_idle_slots = cache_idle_slots and self.cache_ram_tokens > 0
        self.n_batch = n_batch
        self.version = version
        self.slots = [Slot(i) for i in range(n_parallel)]
        self.deferred: deque[Seq] = deque()
        self.ram: list[tuple[tuple, int]] = []  # host prompt cache: (runs, tokens), oldest first
        self.ram_tokens = 0
        self.tick = 0
        self.n_prompt = self.n_prompt_cached = 0
        self.ram_loaded_tokens = 0

    def config(self) -> dict[str, Any]:
        return {"engine": "llamacpp", "version": self.version, "capacity_tokens": self.capacity_tokens,
                "n_parallel": self.n_parallel, "kv_unified": self.kv_unified, "n_ctx_slot": self.n_ctx_slot,
                "slot_prompt_similarity": self.slot_prompt_similarity, "cache_prompt": self.cache_prompt,
                "cache_ram_mib": self.cache_ram_mib, "cache_ram_tokens": self.cache_ram_tokens,
                "cache_idle_slots": self.cache_idle_slots, "n_batch": self.n_batch}

    # ---------------------------------------------------------------- accounting
    @property
    def num_running(self) -> int:
        return sum(1 for s in self.slots if s.seq is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.deferred)

    def kv_used_tokens(self) -> int:
        return sum(s.n for s in self.slots if s.seq is not None)

    def kv_cached_tokens(self) -> int:
        return sum(s.n for s in self.slots if s.seq is None)

    def hit_rate(self) -> float | None:
        return self.n_prompt_cached / self.n_prompt if self.n_prompt else None

    # ---------------------------------------------------------------- host-RAM prompt cache
    def _ram_save(self, runs: tuple, n: int) -> None:
        if n == 0 or self.cache_ram_tokens <= 0:
            return
        if any(lcp(e, runs, n) == n for e, _ in self.ram):
            return  # already contained in an entry
        kept = [(e, m) for e, m in self.ram if lcp(e, runs, m) != m]  # drop entries that prefix it
        kept.append((runs, n))
        total = sum(m for _, m in kept)
        while total > self.cache_ram_tokens and len(kept) > 1:
            total -= kept.pop(0)[1]  # oldest saved first
        self.ram, self.ram_tokens = kept, total

    def _ram_load(self, slot: Slot, prompt_runs: tuple, prompt_len: int) -> None:
        common = lcp(slot.runs, prompt_runs) if slot.n else 0
        best_keep = common / slot.n if slot.n else 0.0
        best_sim = common / prompt_len
        best = None
        for k, (e, m) in enumerate(self.ram):
            c = lcp(e, prompt_runs)
            f_keep, sim = c / m, c / prompt_len
            if f_keep < 0.25:
                continue
            if f_keep > best_keep and sim > best_sim:
                best, best_keep, best_sim = k, f_keep, sim
        if best is not None:
            e, m = self.ram.pop(best)
            self.ram_tokens -= m
            slot.runs, slot.n = e, m
            self.ram_loaded_tokens += m

    # ---------------------------------------------------------------- scheduling
    def add(self, seq: Seq, now: float) -> str | None:
        if seq.prompt_len >= self.n_ctx_slot:
            return (f"the request exceeds the available context size: prompt of {seq.prompt_len} tokens, "
                    f"slot context {self.n_ctx_slot}")
        self.deferred.append(seq)
        return None

    def _pick_slot(self, seq: Seq) -> tuple[Slot, bool]:
        idle = [s for s in self.slots if s.seq is None]
        best, best_sim = None, self.slot_prompt_similarity
        if self.slot_prompt_similarity != 0:
            for s in idle:
                if s.n:
                    sim = lcp(s.runs, seq.prompt_runs) / seq.prompt_len
                    if sim > best_sim:
                        best, best_sim = s, sim
        if best is not None:
            f_keep = lcp(best.runs, seq.prompt_runs) / best.n
            return best, f_keep < 0.5
        return min(idle, key=lambda s: (s.t_last_used, s.id)), True

    def _launch(self, seq: Seq, now: float) -> None:
        slot, update_cache = self._pick_slot(seq)
        if update_cache and self.cache_ram_tokens > 0:
            self._ram_save(slot.runs, slot.n)
            self._ram_load(slot, seq.prompt_runs, seq.prompt_len)
        if self.cache_idle_slots:
            for other in self.slots:
                if other.seq is None and other is not slot and other.n:
                    self._ram_save(other.runs, other.n)
                    if self.kv_unified:
                        other.runs, other.n = (), 0
        n_past = lcp(slot.runs, seq.prompt_runs) if self.cache_prompt and slot.n else 0
        if n_past >= seq.prompt_len:
            n_past = seq.prompt_len - 1  # at least one token is evaluated
        slot.runs, slot.n = slice_runs(slot.runs, 0, n_past), n_past
        slot.seq = seq
        slot.generating = False
        seq.num_computed = n_past
        seq.note_first_admission(n_past, now)
        self.n_prompt += seq.prompt_len
        self.n_prompt_cached += n_past

    def _release(self, slot: Slot) -> None:
        seq = slot.seq
        slot.runs = slice_runs(seq.runs, 0, seq.num_computed)
        slot.n = seq.num_computed
        slot.seq = None
        slot.generating = False
        self.tick += 1
        slot.t_last_used = self.tick

    def step(self, now: float) -> StepStats:
        st = StepStats()
        while self.deferred and any(s.seq is None for s in self.slots):
            self._launch(self.deferred.popleft(), now)
        # context limit of generating slots (no context shift): stop the generation
        for slot in self.slots:
            seq = slot.seq
            if seq is not None and slot.generating and seq.num_computed + 1 >= self.n_ctx_slot:
                seq.truncated = True
                st.finished.append(seq)
                self._release(slot)
        # the batch: one token per generating slot, then prompt tokens in slot-id order
        batch: list[tuple[Slot, int]] = [(s, 1) for s in self.slots if s.seq is not None and s.generating]
        room = self.n_batch - len(batch)
        for s in self.slots:
            if room <= 0:
                break
            if s.seq is not None and not s.generating:
                take = min(s.seq.prompt_len - s.seq.num_computed, room)
                batch.append((s, take))
                room -= take
        if not batch:
            return st
        if self.kv_unified:
            batch = self._fit_unified(batch, st)
        st.num_running = self.num_running
        for slot, n in batch:
            seq = slot.seq
            if slot.generating:
                st.decode_tokens += n
            else:
                st.prefill_tokens += n
            st.context_tokens += seq.num_computed + n
            slot.n += n
            done = self.advance(seq, n, st)
            if seq.num_output:
                slot.generating = True
            if done:
                st.finished.append(seq)
                self._release(slot)
        self.tick += 1
        return st

    def decode_horizon(self) -> tuple[int, int, int] | None:
        busy = [s for s in self.slots if s.seq is not None]
        if not busy or not all(s.generating for s in busy):
            return None
        if self.deferred and len(busy) < len(self.slots):
            return None  # a task would launch
        b = len(busy)
        k = min(min(s.seq.out_len - s.seq.num_output for s in busy) - 1,  # nobody finishes
                min(self.n_ctx_slot - 1 - s.seq.num_computed for s in busy))  # nor hits the context
        if self.kv_unified:
            k = min(k, (self.capacity_tokens - sum(s.n for s in self.slots)) // b)  # no purge
        return (k, b, sum(s.seq.num_computed + 1 for s in busy)) if k >= 2 else None

    def fast_forward(self, k: int) -> None:
        for s in self.slots:
            if s.seq is not None:
                s.n += k
                s.seq.num_computed += k
                s.seq.num_output += k
        self.tick += k

    def _fit_unified(self, batch: list[tuple[Slot, int]], st: StepStats) -> list[tuple[Slot, int]]:
        """Make the batch fit the unified buffer: purge idle slots, then shrink the batch."""
        need = sum(n for _, n in batch)
        free = self.capacity_tokens - sum(s.n for s in self.slots)
        while free < need:
            idle = [s for s in self.slots if s.seq is None and s.n]
            if not idle:
                break
            victim = min(idle, key=lambda s: (s.t_last_used, s.id))
            free += victim.n
            victim.runs, victim.n = (), 0
        if free >= need:
            return batch
        if free <= 0:  # not even one token: every processing slot fails
            for s in self.slots:
                if s.seq is not None:
                    seq = s.seq
                    seq.rejected = "context size exceeded (unified KV buffer full)"
                    st.rejected.append(seq)
                    s.seq, s.runs, s.n, s.generating = None, (), 0, False
            return []
        size = self.n_batch
        while size > free:
            size //= 2
        out, room = [], size
        for slot, n in batch:
            if room <= 0:
                break
            take = min(n, room)
            out.append((slot, take))
            room -= take
        return out

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        for s in self.slots:
            if s.n < 0 or s.n > self.n_ctx_slot:
                raise InvariantError(f"llamacpp: slot {s.id} holds {s.n} tokens (slot context {self.n_ctx_slot})")
            if s.seq is not None and s.n != s.seq.num_computed:
                raise InvariantError(f"llamacpp: slot {s.id} holds {s.n} tokens but its task computed "
                                     f"{s.seq.num_computed}")
            if s.seq is None and sum(n for _, n in s.runs) != s.n:
                raise InvariantError(f"llamacpp: slot {s.id} token count drifted")
        if self.ram_tokens != sum(m for _, m in self.ram):
            raise InvariantError("llamacpp: RAM cache token count drifted")
        if len(self.ram) > 1 and self.ram_tokens > self.cache_ram_tokens:
            raise InvariantError("llamacpp: RAM cache over its limit")

    def check_drained(self) -> None:
        self.check_invariants()
        if self.deferred or any(s.seq is not None for s in self.slots):
            raise InvariantError("llamacpp: tasks left in slots or deferred")

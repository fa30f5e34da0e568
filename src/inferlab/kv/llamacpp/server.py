"""llama.cpp server (``tools/server``): the loop that assigns tasks to slots and batches their tokens.

Rules of llama.cpp at the commit llama-cpp-python 0.3.36 vendors (0c1e570, 2026), function by
function; docs/engines/llamacpp.md cites each one and says how tests/conformance checks it
against a real ``llama-server``:

* context (``llama_context``): ``n_ctx = pad256(-c)``; unified KV (``--kv-unified``, and ``-np``
  auto = 4 slots): one buffer of ``n_ctx`` cells, each slot may use all of it; split KV (an
  explicit ``-np`` without ``-kvu``): each slot its own ``pad256(n_ctx / np)`` cells;
* ``get_available_slot``: the idle non-empty slot whose tokens cover the largest fraction of the
  prompt (> ``--slot-prompt-similarity`` 0.10, single precision); else the least recently used
  idle slot, the *last* one by id among ties (never-used slots: the highest id first). Chosen by
  LRU, or keeping under half of its tokens: its state is saved to the host-RAM cache and the best
  cached prompt loaded into it (prompt_cache.py). No idle slot: the task is deferred;
* after a launch, with ``--cache-idle-slots`` (default on, needs ``--cache-ram``), every idle slot
  is saved to RAM and, with unified KV, cleared;
* ``update_slots``: one token per generating slot, then prompt tokens slot by slot in id order up
  to ``n_batch``. A slot's prompt is looked at only when the batch reaches it: a prompt of
  ``n_ctx_slot`` tokens or more fails there (after the slot was chosen and touched); otherwise
  ``n_past = LCP(slot tokens, prompt)`` (``cache_prompt``), plus ``--cache-reuse N`` chunks, minus
  one if it covers the whole prompt;
* decoding: the batch goes in views of ``n_batch`` tokens; a view that finds no room in the unified
  buffer purges the first idle non-empty slot by id and retries, else halves; a one-token view with
  no room is "Context size has been exceeded": every processing slot is released (id order) and
  cleared;
* ``process_token``: generation stops when ``n_tokens + 1 >= n_ctx_slot`` (truncated, no context
  shift by default) or after ``n_predict`` tokens; the slot keeps prompt + reply minus the last
  sampled token. A released slot hands one deferred task back to the front of the queue.
Not modelled: context shift, LoRA batching, ``id_slot`` requests, multimodal, speculative decoding,
SWA/recurrent checkpoints.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ...errors import InvalidValueError, UnknownNameError
from ..simulator import InvariantError, KVManager, Seq, StepStats
from ..tokens import Run, expand, lcp
from .prompt_cache import PromptCache, f32, seq_state_bytes
from .slots import Slot, SlotState, SlotTask

LLAMACPP_VERSIONS = ("2026", "2024")  # 2024: one slot by default, split KV, no RAM prompt cache
AUTO_N_PARALLEL = 4  # -np auto (-1) resolves to 4 slots with kv_unified (tools/server/server.cpp main)
CTX_PAD = 256  # llama_context: GGML_PAD(n_ctx, 256), and n_ctx_seq likewise with split KV
# Bytes of KV per token used to size RAM-cache entries: Llama 3.1 8B, f16 K and V,
# 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 131072.
DEFAULT_KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
DEFAULT_N_LAYERS = 32
CONTEXT_EXCEEDED = "Context size has been exceeded."
STARTED, PROCESSING_PROMPT, GENERATING = SlotState.STARTED, SlotState.PROCESSING_PROMPT, SlotState.GENERATING


def _slot_id(s: Slot) -> int:
    return s.id


def pad(n: int, to: int = CTX_PAD) -> int:
    return (n + to - 1) // to * to


class SlotManager(KVManager):
    """llama.cpp server's slots (default: 2026 builds, ``-np`` auto = 4 unified slots).

    ``capacity_tokens`` is ``-c``; the server pads it to ``ctx_pad`` (256; ``capacity_tokens`` then
    holds the cells it allocates, ``n_ctx_requested`` the value given). ``ctx_pad=1`` keeps an
    exact pool size, for comparisons with other engines at one capacity.
    """

    engine = "llamacpp"
    hit_rate_name = "prompt_cached_frac"

    def __init__(self, capacity_tokens: int, *, n_parallel: int | None = None, kv_unified: bool | None = None,
                 slot_prompt_similarity: float = 0.10, cache_prompt: bool = True,
                 cache_ram_mib: float | None = None, kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN,
                 n_layers: int = DEFAULT_N_LAYERS, cache_idle_slots: bool | None = None, n_batch: int = 2048,
                 cache_reuse: int = 0, n_ctx_train: int | None = None, ctx_pad: int = CTX_PAD,
                 version: str = "2026"):
        super().__init__(capacity_tokens)
        if version not in LLAMACPP_VERSIONS:
            raise UnknownNameError("llama.cpp server version", version, LLAMACPP_VERSIONS)
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
        if cache_ram_mib != -1 and (isinstance(cache_ram_mib, bool) or cache_ram_mib < 0):
            raise InvalidValueError(f"cache_ram_mib must be -1 (unlimited), 0 (off) or > 0, got {cache_ram_mib!r}")
        if cache_idle_slots is None:
            cache_idle_slots = not legacy
        if not 0.0 <= slot_prompt_similarity <= 1.0:
            raise InvalidValueError(f"slot_prompt_similarity must be in [0, 1], got {slot_prompt_similarity!r}")
        for name, v, lo in (("n_batch", n_batch, 1), ("cache_reuse", cache_reuse, 0), ("ctx_pad", ctx_pad, 1),
                            ("kv_bytes_per_token", kv_bytes_per_token, 1), ("n_layers", n_layers, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InvalidValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        if n_ctx_train is not None and (isinstance(n_ctx_train, bool) or not isinstance(n_ctx_train, int)
                                        or n_ctx_train < 1):
            raise InvalidValueError(f"n_ctx_train must be an integer >= 1 or None, got {n_ctx_train!r}")
        self.n_parallel = n_parallel
        self.kv_unified = kv_unified
        self.n_ctx_requested = capacity_tokens
        self.ctx_pad = ctx_pad
        if legacy:  # 2024 builds: n_ctx_slot = n_ctx / n_parallel, no padding
            n_ctx = capacity_tokens
            n_ctx_seq = n_ctx if kv_unified else n_ctx // n_parallel
        else:  # llama_context::llama_context
            n_ctx = pad(capacity_tokens, ctx_pad)
            if kv_unified:
                n_ctx_seq = n_ctx
            else:
                n_ctx_seq = pad(n_ctx // n_parallel, ctx_pad)
                n_ctx = n_ctx_seq * n_parallel
        self.capacity_tokens = n_ctx if kv_unified else n_ctx_seq * n_parallel  # cells allocated
        # server_context::n_ctx_slot: capped by the model's training context
        self.n_ctx_slot = min(n_ctx_seq, n_ctx_train) if n_ctx_train else n_ctx_seq
        if self.n_ctx_slot < 2:
            raise InvalidValueError(f"capacity_tokens={capacity_tokens} leaves {self.n_ctx_slot} cells per slot")
        self.slot_prompt_similarity = slot_prompt_similarity
        self._sim_threshold = f32(slot_prompt_similarity)
        self.cache_prompt = cache_prompt
        self.cache_ram_mib = cache_ram_mib
        self.kv_bytes_per_token = kv_bytes_per_token
        self.n_layers = n_layers
        self.n_stream = 1 if kv_unified else n_parallel
        # the server's prompt cache: limit in whole MiB (an int32 flag), token limit = n_ctx
        self.cache: PromptCache | None = None
        if cache_ram_mib != 0:
            self.cache = PromptCache(0 if cache_ram_mib == -1 else int(cache_ram_mib * 2**20), n_ctx)
        self.cache_idle_slots = cache_idle_slots and self.cache is not None
        self.n_batch = n_batch
        self.cache_reuse = cache_reuse
        self.version = version
        self._lru_last_of_ties = not legacy
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(n_parallel)]
        self.queue: deque[Seq] = deque()  # queue_tasks: new tasks, and deferred ones handed back
        self.deferred: deque[Seq] = deque()  # queue_tasks_deferred: no idle slot when offered
        self.clock = 0  # stands for ggml_time_us() at releases: only the order matters
        self.n_prompt = self.n_prompt_cached = 0
        self.ram_loaded_tokens = 0
        self.launches: dict[Any, int] = {}  # request id -> the slot it was launched in, in launch order

    def config(self) -> dict[str, Any]:
        return {"engine": "llamacpp", "version": self.version, "capacity_tokens": self.capacity_tokens,
                "n_ctx_requested": self.n_ctx_requested, "ctx_pad": self.ctx_pad, "n_parallel": self.n_parallel,
                "kv_unified": self.kv_unified, "n_ctx_slot": self.n_ctx_slot,
                "slot_prompt_similarity": self.slot_prompt_similarity, "cache_prompt": self.cache_prompt,
                "cache_ram_mib": self.cache_ram_mib, "cache_ram_bytes": self.cache.limit_size if self.cache else 0,
                "kv_bytes_per_token": self.kv_bytes_per_token, "n_layers": self.n_layers,
                "cache_idle_slots": self.cache_idle_slots, "n_batch": self.n_batch, "cache_reuse": self.cache_reuse}

    # ---------------------------------------------------------------- accounting
    # (plain loops over the slots: these run after every step; a slot has a task iff it is busy)
    @property
    def num_running(self) -> int:
        n = 0
        for s in self.slots:
            if s.task is not None:
                n += 1
        return n

    @property
    def num_waiting(self) -> int:
        return len(self.queue) + len(self.deferred)

    def kv_used_tokens(self) -> int:
        n = 0
        for s in self.slots:
            if s.task is not None:
                n += s.n_tokens
        return n

    def kv_cached_tokens(self) -> int:
        n = 0
        for s in self.slots:
            if s.task is None:
                n += s.n_tokens
        return n

    def hit_rate(self) -> float | None:
        return self.n_prompt_cached / self.n_prompt if self.n_prompt else None

    def slot_of(self, request_id: Any) -> int | None:
        """The slot the request was launched in (the response's ``id_slot``)."""
        return self.launches.get(request_id)

    def _free_cells(self) -> int:
        free = self.capacity_tokens
        for s in self.slots:
            free -= s.n_tokens
        return free

    # ---------------------------------------------------------------- host-RAM prompt cache
    def _state_bytes(self, n_tokens: int) -> int:
        return seq_state_bytes(n_tokens, kv_bytes_per_token=self.kv_bytes_per_token, n_layers=self.n_layers,
                               n_stream=self.n_stream)

    def _prompt_save(self, slot: Slot) -> bool:
        """``server_slot::prompt_save``."""
        if slot.n_tokens == 0:
            return False
        assert self.cache is not None
        return self.cache.alloc(slot.tokens(), slot.n_tokens, self._state_bytes(slot.n_tokens))

    def _prompt_load(self, slot: Slot, seq: Seq) -> bool:
        """``server_prompt_cache::load`` into ``slot``; False when the restore finds no room."""
        assert self.cache is not None
        k = self.cache.best(slot.tokens(), slot.n_tokens, seq.prompt_runs, seq.prompt_len)
        if k is None:
            return True
        e = self.cache.states[k]
        if self.kv_unified:
            # state_read_meta: seq_rm(slot) then find_slot for the entry's cells
            room = self.capacity_tokens - sum(s.n_tokens for s in self.slots if s is not slot)
            if e.n_tokens > room:
                return False  # the entry stays cached; the caller clears the slot
        self.cache.states.pop(k)
        slot.runs, slot.n_tokens = e.runs, e.n_tokens
        self.ram_loaded_tokens += e.n_tokens
        return True

    # ---------------------------------------------------------------- tasks and slots
    def add(self, seq: Seq, now: float) -> str | None:
        self.queue.append(seq)  # prompts too long for a slot fail later, in update_slots
        return None

    def _get_available_slot(self, seq: Seq) -> Slot | None:
        """``server_context::get_available_slot`` (and its prompt-cache update)."""
        ret: Slot | None = None
        update_cache = False
        if self.slot_prompt_similarity != 0:
            f_sim_best = 0.0
            for s in self.slots:
                if s.is_processing() or s.n_tokens == 0:
                    continue
                f_sim = f32(lcp(s.runs, seq.prompt_runs) / seq.prompt_len)
                if f_sim > f_sim_best and f_sim > self._sim_threshold:
                    f_sim_best, ret = f_sim, s
            if ret is not None:
                f_keep = f32(f32(f_sim_best * seq.prompt_len) / ret.n_tokens)
                update_cache = f_keep < 0.5  # about to lose most of the slot: save it first
        if ret is None:
            t_last = -1
            for s in self.slots:
                if s.is_processing():
                    continue
                if self._lru_last_of_ties:
                    take = ret is None or s.t_last_used <= t_last  # ties: the last (highest id)
                else:
                    take = ret is None or s.t_last_used < t_last  # 2024 builds: the first
                if take:
                    t_last, ret = s.t_last_used, s
            update_cache = ret is not None
        if ret is not None and update_cache and self.cache is not None:
            self._prompt_save(ret)
            if not self._prompt_load(ret, seq):
                ret.prompt_clear()
            self.cache.update()
        return ret

    def _process_new_tasks(self) -> None:
        """``server_queue::process_new_tasks`` -> ``process_single_task`` for each queued task."""
        while self.queue:
            seq = self.queue.popleft()
            slot = self._get_available_slot(seq)
            if slot is None:
                self.deferred.append(seq)
                continue
            slot.task = SlotTask(seq, slot.id)  # launch_slot_with_task
            slot.state = SlotState.STARTED
            self.launches[seq.req.id] = slot.id
            if self.cache_idle_slots:
                for s in self.slots:
                    if not s.is_processing():
                        if self._prompt_save(s):
                            assert self.cache is not None
                            self.cache.update()
                        if self.kv_unified:
                            s.prompt_clear()  # [TAG_IDLE_SLOT_CLEAR]

    def _release(self, slot: Slot) -> None:
        """``server_slot::release``: idle, keeps its tokens; one deferred task goes back to the queue."""
        assert slot.task is not None
        slot.runs = slot.tokens()
        slot.task = None
        slot.state = SlotState.IDLE
        self.clock += 1
        slot.t_last_used = self.clock
        if self.deferred:  # queue_tasks.pop_deferred_task: emplace_front
            self.queue.appendleft(self.deferred.popleft())

    def _reuse_chunks(self, cached: tuple[Run, ...], prompt: tuple[Run, ...], n_past: int) -> int:
        """``--cache-reuse N``: after the common prefix, shift every matching chunk of at least N
        cached tokens to its place in the new prompt (update_slots, "reuse chunks")."""
        c, p = expand(cached), expand(prompt)
        head_c = head_p = n_past
        while head_c < len(c) and head_p < len(p):
            n_match = 0
            while head_c + n_match < len(c) and head_p + n_match < len(p) and c[head_c + n_match] == p[head_p + n_match]:
                n_match += 1
            if n_match >= self.cache_reuse:
                n_past += n_match
                head_c += n_match
                head_p += n_match
            else:
                head_c += 1
        return n_past

    def _start_prompt(self, slot: Slot, now: float, st: StepStats) -> bool:
        """The SLOT_STATE_STARTED branch of update_slots: check the size, find n_past."""
        assert slot.task is not None
        seq = slot.task.seq
        if seq.prompt_len >= slot.n_ctx:
            seq.rejected = (f"request ({seq.prompt_len} tokens) exceeds the available context size "
                            f"({slot.n_ctx} tokens), try increasing it")
            st.rejected.append(seq)
            self._release(slot)
            return False
        n_past = 0
        if self.cache_prompt:
            n_past = lcp(slot.runs, seq.prompt_runs) if slot.n_tokens else 0
            if self.cache_reuse > 0:
                n_past = self._reuse_chunks(slot.runs, seq.prompt_runs, n_past)
        if n_past == seq.prompt_len and n_past > 0:
            n_past -= 1  # [TAG_PROMPT_LOGITS]: at least one token is evaluated
        slot.task.n_prompt_cached = n_past
        self.n_prompt += seq.prompt_len
        self.n_prompt_cached += n_past
        seq.num_computed = n_past
        seq.note_first_admission(n_past, now)
        slot.state = SlotState.PROCESSING_PROMPT
        slot.runs, slot.n_tokens = (), n_past  # keep_first(n_past); tokens now come from the task
        return True

    # ---------------------------------------------------------------- the loop
    def step(self, now: float) -> StepStats:
        st = StepStats()
        if self.queue:
            self._process_new_tasks()
        # batch segments: [slot, first index in the batch, tokens, is_decode]
        batch: list[tuple[Slot, int, int, bool]] = []
        size = 0
        busy = 0
        for s in self.slots:  # one token per generating slot
            if s.task is not None:
                busy += 1
                if s.state is GENERATING:
                    batch.append((s, size, 1, True))
                    size += 1
        if not busy:
            return st
        for s in self.slots:  # then prompts, slot by slot in id order, up to n_batch
            if size >= self.n_batch:
                break
            if s.state is STARTED and not self._start_prompt(s, now, st):
                continue
            if s.state is PROCESSING_PROMPT:
                assert s.task is not None
                seq = s.task.seq
                take = min(seq.prompt_len - seq.num_computed, self.n_batch - size)
                batch.append((s, size, take, False))
                size += take
                if seq.num_computed + take == seq.prompt_len:
                    s.state = SlotState.DONE_PROMPT
        st.num_running = busy - len(st.rejected)
        off, n_batch = 0, self.n_batch
        while off < size:
            n = min(n_batch, size - off)
            if self.kv_unified and n > self._free_cells():  # llama_decode returns 1: no room
                if n_batch == 1:
                    self._context_exceeded(st)
                    break
                if not self._try_clear_idle_slots():
                    n_batch //= 2
                continue
            self._decode_view(batch, off, n, st)
            off += n
            n_batch = self.n_batch
        return st

    def _decode_view(self, batch: list[tuple[Slot, int, int, bool]], off: int, n: int, st: StepStats) -> None:
        """Decode batch tokens [off, off+n), then ``post_decode``: sample for the slots whose last
        batch token is in the view, in slot-id order; release those that stop."""
        sampled: list[Slot] = []
        whole = off == 0 and n == batch[-1][1] + batch[-1][2]  # the usual case: one view, all of it
        end = off + n
        for slot, first, cnt, is_decode in batch:
            if whole:
                k = hi = cnt
                first = 0
            else:
                lo, hi = max(first, off), min(first + cnt, end)
                if hi <= lo:
                    continue
                k = hi - lo
            assert slot.task is not None
            seq = slot.task.seq
            if is_decode:
                st.decode_tokens += k
            else:
                st.prefill_tokens += k
            st.context_tokens += seq.num_computed + k
            seq.num_computed += k
            slot.n_tokens += k
            if hi == first + cnt and (is_decode or slot.state is SlotState.DONE_PROMPT):
                sampled.append(slot)
        if len(sampled) > 1:
            sampled.sort(key=_slot_id)  # batch order is decodes first: sample in slot-id order
        for slot in sampled:
            assert slot.task is not None
            seq = slot.task.seq
            slot.state = SlotState.GENERATING
            seq.num_output += 1
            if seq.num_output == 1:
                st.first_token.append(seq)
            # process_token: out of context (no context shift) first, then the n_predict budget
            if seq.num_computed + 1 >= slot.n_ctx:
                seq.truncated = True
            if seq.truncated or seq.num_output >= seq.out_len:
                st.finished.append(seq)
                self._release(slot)

    def _try_clear_idle_slots(self) -> bool:
        """``try_clear_idle_slots``: purge the first idle non-empty slot by id (unified KV only)."""
        for s in self.slots:
            if not s.is_processing() and s.n_tokens > 0:
                s.prompt_clear()
                return True
        return False

    def _context_exceeded(self, st: StepStats) -> None:
        """``decode`` with a one-token view and no room: release every processing slot in id
        order (each gets a new t_last_used) and clear its context."""
        for s in self.slots:
            if s.is_processing():
                assert s.task is not None
                seq = s.task.seq
                seq.rejected = CONTEXT_EXCEEDED
                st.rejected.append(seq)
                self._release(s)
                s.prompt_clear()

    # ---------------------------------------------------------------- decode fast-forward
    def decode_horizon(self) -> tuple[int, int, int] | None:
        if self.queue:
            return None  # a task would be offered a slot
        # k pure steps: nobody reaches n_predict, nor n_tokens + 1 >= n_ctx at the k-th sample
        b = ctx = 0
        k = self.n_ctx_slot
        free = self.capacity_tokens
        for s in self.slots:
            free -= s.n_tokens
            if s.task is None:
                continue
            if s.state is not GENERATING:
                return None
            q = s.task.seq
            b += 1
            ctx += q.num_computed + 1
            k = min(k, q.out_len - q.num_output - 1, self.n_ctx_slot - 2 - q.num_computed)
        if not b:
            return None
        if self.kv_unified:
            k = min(k, free // b)  # every step's b tokens find room
        return (k, b, ctx) if k >= 2 else None

    def fast_forward(self, k: int) -> None:
        for s in self.slots:
            if s.task is not None:
                s.n_tokens += k
                s.task.seq.num_computed += k
                s.task.seq.num_output += k

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        for s in self.slots:
            if s.n_tokens < 0 or s.n_tokens > self.n_ctx_slot:
                raise InvariantError(f"llamacpp: slot {s.id} holds {s.n_tokens} tokens (slot context {self.n_ctx_slot})")
            if s.is_processing() != (s.task is not None):
                raise InvariantError(f"llamacpp: slot {s.id} is {s.state.value} with task {s.task!r}")
            if s.task is not None and s.state is not SlotState.STARTED and s.n_tokens != s.task.seq.num_computed:
                raise InvariantError(f"llamacpp: slot {s.id} holds {s.n_tokens} tokens but its task computed "
                                     f"{s.task.seq.num_computed}")
            if (s.task is None or s.state is SlotState.STARTED) and sum(n for _, n in s.runs) != s.n_tokens:
                raise InvariantError(f"llamacpp: slot {s.id} token count drifted")
        if self._free_cells() < 0:
            raise InvariantError(f"llamacpp: slots hold {self.capacity_tokens - self._free_cells()} cells, "
                                 f"the buffer has {self.capacity_tokens}")
        if self.cache is not None and self.cache.limit_size and self.cache.size() > self.cache.limit_size:
            raise InvariantError("llamacpp: RAM cache over its byte limit")
        if self.cache is not None and not self.cache.limit_size and self.cache.n_tokens() > self.cache.limit_tokens:
            raise InvariantError("llamacpp: RAM cache over its token limit")

    def check_drained(self) -> None:
        self.check_invariants()
        if self.queue or self.deferred or any(s.is_processing() for s in self.slots):
            raise InvariantError("llamacpp: tasks left in slots, queued or deferred")

"""vLLM v1's ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``) for the simulator: admission,
chunked prefill, preemption, and the decode batch on a shared clock.

Rules (docs/engines/vllm.md, "Scheduler loop", "Preemption"):
* each step: running requests first (decodes and partial prefills, in admission order), then
  waiting requests while budget (``max_num_batched_tokens``), ``max_num_seqs`` and blocks allow,
  new requests chunked to the leftover budget, head-of-line blocking on allocation failure;
* preemption by recompute of the most recently admitted request when a running request cannot
  get a block; no admission in a step that preempted; a preempted request goes to the front of
  the waiting queue.

Not modelled: ``enable_chunked_prefill=False``, the priority policy,
``long_prefill_token_threshold``, speculative decoding, LoRA / multimodal / cache-salt extra keys,
hybrid (sliding-window, Mamba) managers, hash granularity finer than a block (0.33).

Fast paths beside their plain paths: the decode clock (``decode_clock``; the plain path is the
per-request loop, ``decode_clock = False``, which tests/kv/test_properties.py compares with it)
and the decode fast-forward (``simulate(fast_forward=False)`` is its plain path).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ...errors import InvalidValueError, UnknownNameError
from ..events import Admit, Preempt
from ..simulator import InvariantError, KVManager, Seq, StepStats
from .kv_cache_manager import KVCacheManager, VllmRequest

VLLM_VERSIONS = ("0.11", "0.33")


class PagedManager(KVManager):
    """vLLM v1's scheduler over its KV-cache manager (default: vLLM 0.33 behaviour).

    The decode batch on a shared clock (a simulation device, not vLLM's): every step, each
    running request that only decodes gets one token, and only a token that starts a block
    (``allocate_slots`` takes one from the free queue) or fills one (``cache_blocks`` registers
    its hash) does block work. So the running requests that decode, a prefix of ``running``
    (``running[:num_lazy]``), are advanced lazily: such a request's ``num_computed`` is
    ``dbase + clock`` (``num_output`` follows), and ``decode_events[t % block_size]`` lists, in
    running order, the requests whose token starts (True) or fills (False) a block in step t;
    ``finish_at[t]`` those that sample their last token in step t. A step does that block work in
    running order, which is the order vLLM's per-request loop does it in, then schedules the
    other running requests and the waiting ones as vLLM does. The fields are written back
    (``_settle``) when a request stops decoding (finish, preemption). Only with
    ``max_model_len=None`` and ``max_num_seqs <= max_num_batched_tokens`` (every decode fits
    the token budget); otherwise (or with ``decode_clock = False``, for tests) every request is
    advanced one by one.
    """

    engine = "vllm"
    hit_rate_name = "prefix_cache_hit_rate"
    request_type = VllmRequest

    def __init__(self, capacity_tokens: int, *, block_size: int = 16, max_num_batched_tokens: int = 2048,
                 max_num_seqs: int = 256, enable_prefix_caching: bool = True, max_model_len: int | None = None,
                 watermark: float = 0.0, version: str = "0.33"):
        super().__init__(capacity_tokens)
        if version not in VLLM_VERSIONS:
            raise UnknownNameError("vLLM version", version, VLLM_VERSIONS)
        for name, v in (("block_size", block_size), ("max_num_batched_tokens", max_num_batched_tokens),
                        ("max_num_seqs", max_num_seqs)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValueError(f"{name} must be an integer >= 1, got {v!r}")
        num_blocks = capacity_tokens // block_size
        if num_blocks < 2:
            raise InvalidValueError(
                f"capacity_tokens={capacity_tokens} gives {num_blocks} blocks of {block_size}; vLLM needs >= 2 "
                f"(block 0 is the null block)")
        if not 0.0 <= watermark < 1.0:
            raise InvalidValueError(f"watermark must be in [0, 1), got {watermark!r}")
        if version == "0.11" and watermark:
            raise InvalidValueError("vLLM 0.11's v1 scheduler has no watermark; use version='0.33'")
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.enable_prefix_caching = enable_prefix_caching
        self.max_model_len = max_model_len
        self.watermark = watermark
        self.version = version
        self.num_gpu_blocks = num_blocks
        self.usable_blocks = num_blocks - 1  # block 0 = null block
        self.kv = KVCacheManager(num_blocks, block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                                 max_model_len=max_model_len, watermark_blocks=int(watermark * num_blocks),
                                 version=version)
        self.running: list[VllmRequest] = []
        self.waiting: deque[VllmRequest] = deque()
        # the decode batch on a shared clock (see the class docstring)
        self.decode_clock = max_model_len is None and max_num_seqs <= max_num_batched_tokens
        self.clock = 0  # steps so far
        self.num_lazy = 0  # running[:num_lazy] decode on the clock
        self.dbase_sum = 0  # sum of their dbase (context tokens of a step, summed at once)
        self.decode_events: list[list[tuple[VllmRequest, bool]]] = [[] for _ in range(block_size)]
        self.finish_at: dict[int, list[VllmRequest]] = {}

    def set_events(self, events: list | None) -> None:
        self.events = events
        self.kv.set_events(events)

    # ---------------------------------------------------------------- config / accounting
    def config(self) -> dict[str, Any]:
        return {"engine": "vllm", "version": self.version, "capacity_tokens": self.capacity_tokens,
                "block_size": self.block_size, "num_gpu_blocks": self.num_gpu_blocks,
                "max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs,
                "enable_prefix_caching": self.enable_prefix_caching, "max_model_len": self.max_model_len,
                "watermark": self.watermark}

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_used_tokens(self) -> int:
        return (self.usable_blocks - len(self.kv.pool.free)) * self.block_size

    def kv_cached_tokens(self) -> int:
        return self.kv.pool.num_hashed_free * self.block_size

    def hit_rate(self) -> float | None:
        kv = self.kv
        return kv.hits / kv.queries if kv.queries else None

    @property
    def num_free(self) -> int:
        return len(self.kv.pool.free)

    def free_queue(self) -> list[int]:
        """The free-block queue from head (next allocated) to tail."""
        return self.kv.pool.free_queue()

    # ---------------------------------------------------------------- scheduling
    def add(self, seq: VllmRequest, now: float) -> str | None:
        bs = self.block_size
        if self.max_model_len is not None and seq.prompt_len >= self.max_model_len:
            # InputProcessor._validate_model_input: room for the prompt and at least one output token
            return (f"prompt of {seq.prompt_len} tokens plus at least one output token exceeds "
                    f"max_model_len={self.max_model_len}")
        final = seq.prompt_len + seq.out_len - 1  # tokens with KV when the last token is sampled
        if self.max_model_len is not None:
            final = min(final, self.max_model_len - 1)  # check_stop ends it at num_tokens = max_model_len
        if -(-final // bs) > self.usable_blocks:
            return (f"needs {-(-final // bs)} KV blocks of {bs} tokens for {seq.prompt_len} prompt + "
                    f"{seq.out_len} new tokens; the pool has {self.usable_blocks} usable blocks")
        if not isinstance(seq, VllmRequest):
            raise InvalidValueError(f"vllm: add() takes a {VllmRequest.__name__} (PagedManager.request_type), "
                                    f"got {type(seq).__name__}")
        self.waiting.append(seq)
        return None

    def _preempt(self, victim: VllmRequest) -> None:
        if victim.dbase is not None:  # (a victim has not had its turn in this step yet)
            self._settle(victim, self.clock)
        if self.events is not None:
            self.events.append(Preempt(victim.req.id, victim.num_computed))
        self.kv.free(victim)
        victim.num_computed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)

    def _finish(self, seq: VllmRequest, st: StepStats) -> None:
        self.kv.free(seq)
        seq.block_hashes = seq.lookup_memo = None  # block keys are recomputed if ever needed; long traces keep memory flat
        st.finished.append(seq)

    def _forward(self, seq: VllmRequest, num_new: int, first: list[Seq], finished: list[VllmRequest]) -> bool:
        """The forward pass over ``num_new`` scheduled tokens of ``seq`` (KVManager.advance, plus
        the max_model_len stop); True when it was a decode token."""
        c = seq.num_computed + num_new
        seq.num_computed = c
        decode = num_new == 1 and seq.num_output > 0 and c > seq.prompt_len
        done = False
        if c >= seq.prompt_len + seq.num_output:  # caught up: sample a token
            seq.num_output += 1
            if seq.num_output == 1 and seq.first_token_s is None:
                first.append(seq)
            done = seq.num_output >= seq.out_len
            mml = self.max_model_len
            if not done and mml is not None and seq.num_tokens >= mml:  # check_stop: length capped
                seq.truncated = done = True
        if done:
            finished.append(seq)
        return decode

    def step(self, now: float) -> StepStats:
        # Each request's forward pass is applied as soon as it is scheduled: nothing the
        # scheduler reads later in the step (the budget, blocks, the hash map, the running
        # count) depends on it, preemption only takes requests not scheduled yet (the running
        # list's tail), and finished requests still leave after the step, in scheduling order.
        st = StepStats()
        budget = self.max_num_batched_tokens
        running = self.running
        bs, mml = self.block_size, self.max_model_len
        kv = self.kv
        first = st.first_token
        finished: list[VllmRequest] = []
        dec = pre = ctx = 0
        t = self.clock
        # running requests first: the decode batch on the clock (running[:num_lazy]), each one
        # token; its block work in running order, as the per-request loop below would do it
        preempted = self._decode_block_work(t)
        i = nd = self.num_lazy
        if nd:
            dec, ctx = nd, self.dbase_sum + nd * (t + 1)  # each one's num_computed after its token
            budget -= nd
            for seq in self.finish_at.pop(t, ()):  # sampled their last token
                self._settle(seq, t + 1)
                finished.append(seq)
        while i < len(running) and budget > 0:  # then the others, one by one
            seq = running[i]
            c = seq.num_computed
            o = seq.num_output
            if mml is None and seq.prompt_len + o - c == 1 and c % bs and (c + 1) % bs:
                # a decode inside its last block: no block work; its forward pass (_forward) samples
                c += 1
                seq.num_computed = c
                ctx += c
                if o:
                    dec += 1
                else:  # the last prompt token
                    pre += 1
                o += 1
                seq.num_output = o
                if o == 1 and seq.first_token_s is None:
                    first.append(seq)
                if o >= seq.out_len:
                    finished.append(seq)
                budget -= 1
                i += 1
                continue
            num_new = min(seq.num_tokens - c, budget)
            if mml is not None:  # the input position stays below max_model_len (one token is sampled)
                num_new = min(num_new, mml - c - 1)
            if num_new <= 0:
                i += 1
                continue
            scheduled, preempted_now = self._allocate_or_preempt(seq, kv.allocate_slots, seq, num_new)
            preempted |= preempted_now
            if scheduled:
                if self._forward(seq, num_new, first, finished):
                    dec += 1
                else:
                    pre += num_new
                ctx += seq.num_computed
                budget -= num_new
                i += 1
        waiting = self.waiting
        while not preempted and waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = waiting[0]
            hits = kv.get_computed_blocks(seq)
            hit_tokens = len(hits) * self.block_size
            num_new = seq.num_tokens - hit_tokens
            if num_new > budget:
                num_new = budget  # chunked prefill: clip to the leftover budget
            if not kv.allocate_slots(seq, num_new, hits, admitting=True, running=bool(running)):
                break  # head-of-line blocking
            waiting.popleft()
            seq.num_computed = hit_tokens
            running.append(seq)
            kv.record_admission(seq, hit_tokens)
            if self.events is not None:
                self.events.append(Admit(seq.req.id, seq.num_tokens, hit_tokens, num_new, seq.cached_tokens is not None))
            seq.note_first_admission(hit_tokens, now)
            if self._forward(seq, num_new, first, finished):
                dec += 1
            else:
                pre += num_new
            ctx += seq.num_computed
            budget -= num_new
        st.num_running = len(running)
        st.decode_tokens, st.prefill_tokens, st.context_tokens = dec, pre, ctx
        self.clock = t + 1
        if finished:
            gone = set(map(id, finished))
            self.running = [s for s in running if id(s) not in gone]
            for seq in finished:
                self._finish(seq, st)
        if self.decode_clock:
            self._join_decode_batch()
        return st

    # ---------------------------------------------------------------- the decode batch on a clock
    def _decode_block_work(self, t: int) -> bool:
        """Step ``t``'s block work for the decode batch on the clock: in running order, a token
        that starts a block takes one (preempting the newest admissions while the free queue is
        empty, as the per-request loop does) and a token that fills one registers its hash.
        Every other decode token needs no block work (_allocate returns at once). True when a
        request was preempted."""
        bucket = self.decode_events[t % self.block_size]
        if not bucket:
            return False
        preempted = False
        kv = self.kv
        for seq, starts in tuple(bucket):  # (a snapshot: preemption takes entries out)
            if seq.dbase is None:
                continue  # preempted in this step
            if not starts:
                kv.fill_block(seq)
                continue
            scheduled, preempted_now = self._allocate_or_preempt(seq, kv.pool.free.__len__)  # a free block?
            preempted |= preempted_now
            if scheduled:
                kv.start_block(seq)
        return preempted

    def _allocate_or_preempt(self, seq: VllmRequest, allocate, *args) -> tuple[bool, bool]:
        """``allocate(*args)`` for running ``seq``; while it fails, preempt the most recently
        admitted running request and retry. Returns (allocated, whether any was preempted); not
        allocated when ``seq`` itself was preempted."""
        preempted = False
        while not allocate(*args):
            victim = self.running.pop()
            self._preempt(victim)
            preempted = True
            if victim is seq:
                return False, True
        return True, preempted

    def _join_decode_batch(self) -> None:
        """Put the running requests after the decode batch on the clock while they only decode."""
        running = self.running
        while self.num_lazy < len(running) and self._decodes(running[self.num_lazy]):
            self._join(running[self.num_lazy])

    def _decodes(self, seq: VllmRequest) -> bool:
        """``seq`` (not on the clock) only decodes: its next token is its last sampled one, and
        it holds exactly the blocks of its computed tokens, all full ones registered (always so
        after a prefill; checked so that the clock's block work is exact)."""
        c, o, bs = seq.num_computed, seq.num_output, self.block_size
        return bool(o) and c == seq.prompt_len + o - 1 and len(seq.blocks) == -(-c // bs) and (
            not self.enable_prefix_caching or seq.num_cached_blocks == c // bs)

    def _join(self, seq: VllmRequest) -> None:
        if not self._decodes(seq):
            raise InvariantError(f"vllm: {seq!r} put on the decode clock while not decoding")
        bs = self.block_size
        base = seq.dbase = seq.num_computed - self.clock
        self.dbase_sum += base
        self.num_lazy += 1
        self.decode_events[-base % bs].append((seq, True))  # steps whose token starts a block
        if self.enable_prefix_caching:
            self.decode_events[(-base - 1) % bs].append((seq, False))  # ... fills one
        # its token in step t is number base + t - prompt_len + 2 (1 was sampled at prefill)
        self.finish_at.setdefault(seq.out_len + seq.prompt_len - 2 - base, []).append(seq)

    def _settle(self, seq: VllmRequest, t: int) -> None:
        """Take ``seq`` off the clock with its fields as of clock value ``t``."""
        bs, base = self.block_size, seq.dbase
        assert base is not None  # (on the clock)
        seq.num_computed = c = base + t
        seq.num_output = c - seq.prompt_len + 1
        self.decode_events[-base % bs].remove((seq, True))
        if self.enable_prefix_caching:
            self.decode_events[(-base - 1) % bs].remove((seq, False))
        tf = seq.out_len + seq.prompt_len - 2 - base
        fin = self.finish_at.get(tf)
        if fin is not None:  # (absent when it finished: the step took the list)
            fin.remove(seq)
            if not fin:
                del self.finish_at[tf]
        self.dbase_sum -= base
        self.num_lazy -= 1
        seq.dbase = None

    # ---------------------------------------------------------------- decode fast-forward
    def decode_horizon(self) -> tuple[int, int, int] | None:
        running = self.running
        if not running or len(running) > self.max_num_batched_tokens:
            return None
        nd = self.num_lazy
        for s in reversed(running[nd:]):  # the newest admissions are the likeliest to be prefilling
            if not s.num_output or s.prompt_len + s.num_output - s.num_computed != 1:
                return None  # a prefill (chunk) is still running
        if self.waiting and len(running) < self.max_num_seqs and len(running) < self.max_num_batched_tokens:
            if self.version == "0.11":
                return None  # 0.11 counts every lookup in its metrics
            head, kv = self.waiting[0], self.kv
            hits = kv.get_computed_blocks(head)
            num_new = min(head.num_tokens - len(hits) * self.block_size,
                          self.max_num_batched_tokens - len(running))
            if kv.allocate_slots(head, num_new, hits, admitting=True, dry_run=True, running=True):
                return None  # the head would be admitted; it stays blocked while blocks only shrink
        b = len(running)
        bs, t = self.block_size, self.clock
        c = [s.dbase + t for s in running[:nd]] + [s.num_computed for s in running[nd:]]  # type: ignore[operator]  # (running[:nd] are on the clock)
        # nobody finishes: out_len - num_output - 1 more tokens each, num_output = c - prompt_len + 1
        k = min(s.out_len + s.prompt_len - x for s, x in zip(running, c)) - 2
        if self.max_model_len is not None:
            k = min(k, self.max_model_len - max(c) - 2)  # nobody reaches num_tokens = max_model_len
        while k >= 2:  # enough free blocks for every new block in k steps: no preemption
            need = sum((x + k - 1) // bs - (x - 1) // bs for x in c)
            if need <= len(self.kv.pool.free):
                break
            k //= 2
        return (k, b, sum(c) + b) if k >= 2 else None

    def fast_forward(self, k: int) -> list[int]:
        """k decode steps: the block work of each step's tokens that start or fill a block, in
        running order within each step (as _decode_block_work, which never preempts here). Returns
        the KV tokens (in use + cached) after each step: blocks are taken a block at a time."""
        temporary = self.num_lazy < len(self.running)  # decode_clock off: on the clock meanwhile
        for s in self.running[self.num_lazy:]:
            self._join(s)
        t0 = self.clock
        bs, events, kv = self.block_size, self.decode_events, self.kv
        after = []
        for t in range(t0, t0 + k):
            for s, starts in events[t % bs]:
                if starts:
                    kv.start_block(s)
                else:
                    kv.fill_block(s)
            after.append((self.usable_blocks - len(kv.pool.free) + kv.pool.num_hashed_free) * bs)  # kv_used + kv_cached
        self.clock = t0 + k
        if temporary:
            for s in self.running:
                self._settle(s, self.clock)
        return after

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        self.kv.check_invariants(self.running)
        self._check_decode_clock()

    def _check_decode_clock(self) -> None:
        """The decode batch on the clock: running[:num_lazy], each decoding with exactly its
        blocks, listed once per block event and once at its finishing step."""
        nd, t, bs = self.num_lazy, self.clock, self.block_size
        lazy = self.running[:nd]
        if any(s.dbase is None for s in lazy) or any(s.dbase is not None for s in self.running[nd:]):
            raise InvariantError("vllm: the decode batch on the clock is not running[:num_lazy]")
        want: list[list[tuple[VllmRequest, bool]]] = [[] for _ in range(bs)]
        finish: dict[int, list[VllmRequest]] = {}
        for s in lazy:
            assert s.dbase is not None  # (checked above)
            c = s.dbase + t
            if c > s.prompt_len + s.out_len - 2 or len(s.blocks) != -(-c // bs) or (
                    self.enable_prefix_caching and s.num_cached_blocks != c // bs):
                raise InvariantError(f"vllm: {s!r} on the decode clock at {c} tokens holds "
                                     f"{len(s.blocks)} blocks ({s.num_cached_blocks} registered)")
            want[-s.dbase % bs].append((s, True))
            if self.enable_prefix_caching:
                want[(-s.dbase - 1) % bs].append((s, False))
            finish.setdefault(s.out_len + s.prompt_len - 2 - s.dbase, []).append(s)
        if want != self.decode_events or finish != self.finish_at or sum(s.dbase or 0 for s in lazy) != self.dbase_sum:
            raise InvariantError("vllm: the decode clock's event lists drifted")

    def check_drained(self) -> None:
        self.check_invariants()
        if self.running or self.waiting or self.num_lazy:
            raise InvariantError(f"vllm: {len(self.running)} running / {len(self.waiting)} waiting left")
        pool = self.kv.pool
        if pool.num_free != self.usable_blocks or any(pool.ref):
            raise InvariantError(f"vllm: {self.usable_blocks - pool.num_free} blocks leaked")

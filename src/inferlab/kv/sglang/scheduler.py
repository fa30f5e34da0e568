"""SGLang's ``Scheduler`` loop (``sglang/srt/managers/scheduler.py`` and ``schedule_batch.py``)
for the simulator: prefill-first rounds built by the :class:`PrefillAdder`, decode rounds, memory
checks and retraction, the new-token ratio.

Rules (docs/engines/sglang.md, "Decode and prefill interleaving, retraction, new-token ratio"):
* one token pool shared by the tree and the running requests;
* the prompt enters the tree after its prefill (and after each chunk of a chunked prefill),
  decoded tokens only when the request finishes (``input + output[:-1]``); duplicates are freed;
* rounds are prefill-first: if any waiting request can be admitted the round is a prefill round
  and decodes wait;
* the pool evicts for an allocation (0.5.2 asks the tree for the full allocation, 0.5.23 only
  the shortfall);
* when a decode step lacks memory the request with the fewest output tokens (ties: longest
  prompt) is retracted until the next decode step fits (``check_decode_mem``, which evicts:
  0.5.2 the whole need, 0.5.23 the shortfall); the last request is kept (0.5.23 aborts it if
  even it cannot decode; SGLang 0.5.2 then fails an assertion, and the simulator aborts it
  too); ``new_token_ratio`` then restarts from the remaining batch's progress (20 steps per
  request left), and decays by (init - min)/600 per decode step;
* a request whose KV (whole pages) or admission reservation can never fit the pool is rejected
  on arrival.

Not modelled: the overlap scheduler, HiCache, eviction strategies other than ``lru``;
``max_running_requests`` defaults to ``min(capacity // 2, 4096)`` (SGLang also caps it by its
request pool of 2048-4096). The batch-full flag set by a failed admission is cleared when a
request finishes or is retracted.

Token pool accounting is by counts: the tree's tokens plus each running request's private
tokens (those not yet in the tree) never exceed ``capacity_tokens``.

Fast paths beside their plain paths: the page-size-1 decode round without eviction (inlined
allocation and sampling; the general per-request loop follows it) and the decode fast-forward
(``simulate(fast_forward=False)`` is its plain path).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ...errors import InvalidValueError, UnknownNameError
from ..events import Admit, Allocate, Cache, Free, PrefixHit, Preempt
from ..simulator import InvariantError, KVManager, Request, Seq, StepStats
from .radix_cache import Node, RadixCache
from .schedule_policy import (ADDED, ADDED_CHUNKED, CLIP_MAX_NEW_TOKENS, NO_TOKEN, OTHER, SCHEDULE_POLICIES,
                              WAITING_PREFIX_REFRESH_INTERVAL, PrefillAdder, calc_priority, reserved_by_running,
                              touch_waiting_prefixes)

SGLANG_VERSIONS = ("0.5.2", "0.5.23")
RETRACT_DECODE_STEPS = 20  # global_config.retract_decode_steps
NEW_TOKEN_RATIO_INIT = 0.7  # times schedule_conservativeness
NEW_TOKEN_RATIO_MIN_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


class SglangRequest(Seq):
    """A request as SGLang's scheduler sees it, on top of :class:`Seq`."""

    __slots__ = ("private", "prefix_len", "last_node")

    def __init__(self, req: Request, index: int):
        super().__init__(req, index)
        self.private = 0  # KV cells it holds outside the tree (req_to_token beyond the prefix)
        self.prefix_len = 0  # tokens of its KV owned by the tree (up to last_node)
        self.last_node: Node = None  # type: ignore[assignment]  # the tree node it locks (the root: none); add() sets the root


class RadixManager(KVManager):
    """SGLang's scheduler with the radix cache (default: sglang 0.5.23 behaviour)."""

    engine = "sglang"
    hit_rate_name = "cache_hit_rate"
    request_type = SglangRequest

    def __init__(self, capacity_tokens: int, *, page_size: int = 1, schedule_policy: str = "fcfs",
                 chunked_prefill_size: int = 2048, max_prefill_tokens: int = 16384,
                 max_running_requests: int | None = None, schedule_conservativeness: float = 1.0,
                 disable_radix_cache: bool = False, version: str = "0.5.23"):
        super().__init__(capacity_tokens)
        if version not in SGLANG_VERSIONS:
            raise UnknownNameError("SGLang version", version, SGLANG_VERSIONS)
        if schedule_policy not in SCHEDULE_POLICIES:
            raise UnknownNameError("SGLang schedule policy", schedule_policy, SCHEDULE_POLICIES)
        for name, v in (("page_size", page_size), ("max_prefill_tokens", max_prefill_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValueError(f"{name} must be an integer >= 1, got {v!r}")
        if chunked_prefill_size != -1 and (not isinstance(chunked_prefill_size, int) or chunked_prefill_size < page_size):
            raise InvalidValueError(f"chunked_prefill_size must be -1 (off) or >= page_size, got {chunked_prefill_size!r}")
        if not schedule_conservativeness > 0:
            raise InvalidValueError(f"schedule_conservativeness must be > 0, got {schedule_conservativeness!r}")
        self.page_size = page_size
        self.schedule_policy = schedule_policy
        self.chunked_prefill_size = None if chunked_prefill_size == -1 else chunked_prefill_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_running_requests = max_running_requests or max(1, min(capacity_tokens // 2, 4096))
        self.disable_radix_cache = disable_radix_cache
        self.version = version
        self.tree = RadixCache(page_size)
        self.private_tokens = 0  # KV held by requests outside the tree
        self.running: list[SglangRequest] = []  # the decode batch
        self.waiting: deque[SglangRequest] = deque()
        self.chunked: SglangRequest | None = None
        self.batch_is_full = False
        self.init_ratio = min(NEW_TOKEN_RATIO_INIT * schedule_conservativeness, 1.0)
        self.min_ratio = self.init_ratio * NEW_TOKEN_RATIO_MIN_FACTOR
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_ratio
        self.log_hit_tokens = self.log_input_tokens = 0
        self.priority_calls = 0  # calc_priority calls (0.5.23's waiting-prefix refresh counts them)
        self.aborted: list[SglangRequest] = []  # 0.5.23: the last request, when even it cannot decode

    def set_events(self, events: list | None) -> None:
        self.events = self.tree.events = events

    def config(self) -> dict[str, Any]:
        return {"engine": "sglang", "version": self.version, "capacity_tokens": self.capacity_tokens,
                "page_size": self.page_size, "schedule_policy": self.schedule_policy,
                "chunked_prefill_size": self.chunked_prefill_size or -1,
                "max_prefill_tokens": self.max_prefill_tokens, "max_running_requests": self.max_running_requests,
                "disable_radix_cache": self.disable_radix_cache}

    # ---------------------------------------------------------------- accounting
    @property
    def num_running(self) -> int:
        return len(self.running) + (self.chunked is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def available(self) -> int:
        return self.capacity_tokens - self.tree.total_tokens - self.private_tokens

    def room(self) -> int:
        """Free plus evictable cells: what admission control sees."""
        return self.available() + self.tree.evictable_tokens

    def kv_used_tokens(self) -> int:
        return self.tree.total_tokens - self.tree.evictable_tokens + self.private_tokens

    def kv_cached_tokens(self) -> int:
        return self.tree.evictable_tokens

    def hit_rate(self) -> float | None:
        tot = self.log_hit_tokens + self.log_input_tokens
        return self.log_hit_tokens / tot if tot else None

    # ---------------------------------------------------------------- memory (token pool and tree)
    def _alloc(self, seq: SglangRequest, n: int) -> None:
        """``alloc_token_slots``: give ``seq`` n private tokens, evicting from the tree if the
        pool is short."""
        avail = self.available()
        if avail < n:
            want = n if self.version == "0.5.2" else n - avail
            self.tree.evict(want)
            if self.available() < n:
                raise InvariantError(f"sglang: cannot allocate {n} tokens (available {self.available()})")
        self.private_tokens += n
        seq.private += n
        if self.events is not None:
            self.events.append(Allocate(seq.req.id, n))

    def _evict_for_batch(self, demand: int) -> None:
        """A batch's allocation (``alloc_token_slots`` / ``alloc_paged_token_slots_*``) evicts
        before it allocates: 0.5.2 asks the tree for the whole ``demand`` when the pool is short,
        0.5.23 for the shortfall."""
        avail = self.available()
        if avail < demand:
            self.tree.evict(demand if self.version == "0.5.2" else demand - avail)

    def _release_private(self, seq: SglangRequest) -> None:
        if self.events is not None:
            self.events.append(Free(seq.req.id, seq.private))
        self.private_tokens -= seq.private
        seq.private = 0

    def _insert(self, seq: SglangRequest, length: int) -> tuple[int, Node]:
        """Put ``seq``'s first ``length`` tokens into the tree (``RadixCache.checkpoint``). 0.5.23
        inserts the page-aligned prompt again when the new leaf runs past it, so that the leaf
        splits at the prompt boundary (eviction can then drop the output and keep the prompt),
        and matches the whole key to find the node it locks (touching the path again)."""
        present, node = self.tree.insert(seq.runs, length)
        if self.version == "0.5.23":
            prompt = seq.prompt_len - seq.prompt_len % self.page_size
            if 0 < prompt < length:
                self.tree.insert(seq.runs, prompt)
                self.tree.match_prefix(seq.runs, length)
        return present, node

    def _cache_unfinished(self, seq: SglangRequest) -> None:
        """``cache_unfinished_req``: after a prefill (chunk), put the computed prompt into the
        tree (its duplicates freed); move the lock."""
        length = seq.num_computed - seq.num_computed % self.page_size
        if self.disable_radix_cache:
            return
        if length <= seq.prefix_len:
            if length > 0:  # nothing new, but the insert still touches the path (LRU)
                self._insert(seq, length)
            return
        present, node = self._insert(seq, length)
        moved = length - seq.prefix_len  # private tokens now owned by the tree (or duplicates)
        self.private_tokens -= moved
        seq.private -= moved
        self.tree.inc_lock(node)
        self.tree.dec_lock(seq.last_node)
        seq.last_node, seq.prefix_len = node, length
        if self.events is not None:
            self.events.append(Cache(seq.req.id, tokens=length, new_tokens=length - present, from_request=moved,
                                    node=node.id))

    def _cache_finished(self, seq: SglangRequest) -> None:
        """``cache_finished_req``: on finish, insert input + output[:-1] (page-aligned), free
        the rest, unlock."""
        if not self.disable_radix_cache:
            length = seq.num_computed - seq.num_computed % self.page_size
            if length > 0:  # also when nothing is new: the insert touches the path (LRU)
                present, node = self._insert(seq, length)
                if length > seq.prefix_len and self.events is not None:
                    self.events.append(Cache(seq.req.id, tokens=length, new_tokens=length - present, node=node.id))
        self._release_private(seq)
        self.tree.dec_lock(seq.last_node)
        seq.last_node, seq.prefix_len = self.tree.root, 0

    # ---------------------------------------------------------------- scheduling
    def add(self, seq: SglangRequest, now: float) -> str | None:
        p = self.page_size
        final = -(-(seq.prompt_len + seq.out_len - 1) // p) * p  # cells when the last token is sampled (whole pages)
        # the admission check an empty pool must pass: extend + future (+ one page in 0.5.23) < free
        reserve = seq.prompt_len + min(seq.out_len, CLIP_MAX_NEW_TOKENS) + (p if self.version == "0.5.23" else 0)
        if final > self.capacity_tokens or reserve >= self.capacity_tokens:
            return (f"prompt of {seq.prompt_len} + {seq.out_len} new tokens cannot fit the token pool of "
                    f"{self.capacity_tokens} (needs {max(final, reserve + 1)})")
        if not isinstance(seq, SglangRequest):
            raise InvalidValueError(f"sglang: add() takes a {SglangRequest.__name__} (RadixManager.request_type), "
                                    f"got {type(seq).__name__}")
        seq.last_node = self.tree.root
        self.waiting.append(seq)
        return None

    def _match(self, seq: SglangRequest) -> tuple[int, Node]:
        """The scheduler's prefix match: at most num_tokens - 1 tokens (the last is recomputed)."""
        if self.disable_radix_cache:
            return 0, self.tree.root
        return self.tree.match_prefix(seq.runs, seq.num_tokens - 1)

    def _prefill_round(self, now: float) -> list[tuple[SglangRequest, int]] | None:
        """``get_new_batch_prefill``: the requests (and their token counts) of a prefill round,
        or None when there is none."""
        if not self.running and self.chunked is None:
            self.batch_is_full = False  # nothing holds memory that a finish could return
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        v23 = self.version == "0.5.23"
        if v23 and self.chunked is None and len(self.running) >= self.max_running_requests:
            self.batch_is_full = True  # no request slot: no priority computation either
            return None
        ordered = self.waiting
        if not self.disable_radix_cache:
            ordered = calc_priority(self.schedule_policy, self.waiting, self.tree)
            if ordered is not self.waiting:
                self.waiting = ordered = deque(ordered)  # sorted in place, as SGLang's list.sort
            elif v23 and self.schedule_policy != "dfs-weight":  # FCFS is the active policy
                if self.priority_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0:
                    touch_waiting_prefixes(self.waiting, self.tree)
                self.priority_calls += 1
        adder = PrefillAdder(self.tree, self.room, self.page_size, max_prefill_tokens=self.max_prefill_tokens,
                             chunked_prefill_size=self.chunked_prefill_size,
                             reserved=reserved_by_running(self.running, self.new_token_ratio), budget_v2=v23)
        adds = adder.adds
        if self.chunked is not None and adder.add_chunked_req(self.chunked):  # the chunked request continues first
            self.chunked = None
        new_chunked = None
        admitted: list[SglangRequest] = []
        ev = self.events
        for seq in ordered:
            if v23 and adder.budget_state() == OTHER:  # a spent pass budget admits no one
                break
            if len(self.running) + len(adds) >= self.max_running_requests:
                self.batch_is_full = True
                break
            prefix_len, node = self._match(seq)
            outcome, chunk = adder.add_one_req(seq, prefix_len, node)
            if outcome == NO_TOKEN:
                self.batch_is_full = True
                break
            if outcome == OTHER:
                break
            seq.last_node, seq.prefix_len = node, prefix_len
            seq.num_computed = prefix_len
            if ev is not None:
                ev.append(PrefixHit(seq.req.id, prefix_len, node=node.id))
                ev.append(Admit(seq.req.id, seq.num_tokens, prefix_len, chunk, seq.cached_tokens is not None))
            seq.note_first_admission(prefix_len, now)
            self.log_hit_tokens += prefix_len
            admitted.append(seq)
            if outcome == ADDED_CHUNKED:
                new_chunked = seq
                break
            state = adder.budget_state()  # add_one_req returns budget_state() (both versions): an
            if state != ADDED:  # admission that spends a budget ends the round
                self.batch_is_full = self.batch_is_full or state == NO_TOKEN
                break
        if admitted:  # admitted requests are a prefix of the (ordered) queue
            for _ in admitted:
                self.waiting.popleft()
        if new_chunked is not None:
            self.chunked = new_chunked
        return adds or None

    def step(self, now: float) -> StepStats:
        st = StepStats()
        was_empty = not self.running
        if self.version == "0.5.2" and was_empty and self.chunked is None and self.waiting:
            self._reject_never_admissible(st)
        adds = self._prefill_round(now)
        if adds:
            p = self.page_size
            # prepare_for_extend allocates for the whole batch at once; with pages it first evicts
            # for an over-estimate: the extend tokens plus one new page per request
            self._evict_for_batch(sum(chunk for _, chunk in adds) + (len(adds) * p if p > 1 else 0))
            for seq, chunk in adds:
                c = seq.num_computed  # pages are allocated whole: cells = ceil(tokens / page) * page
                self._alloc(seq, -(-(c + chunk) // p) * p - -(-c // p) * p)
                self.log_input_tokens += chunk
                st.prefill_tokens += chunk
                st.context_tokens += seq.num_computed + chunk
            st.num_running = len(self.running) + len(adds)
            for seq, chunk in adds:
                finished = self.advance(seq, chunk, st)
                if seq is self.chunked:  # its chunk enters the tree after the others' results (below)
                    continue
                if finished:  # max_new_tokens == 1: done at prefill
                    self._cache_finished(seq)
                    st.finished.append(seq)
                    continue
                self._cache_unfinished(seq)
                self.running.append(seq)
            if self.chunked is not None:
                # stash_chunked_request, at the start of the next get_next_batch_to_run: after every
                # result of this batch was processed, so its nodes are the newest
                self._cache_unfinished(self.chunked)
            if st.finished or was_empty or self.chunked is not None:
                # the flag lives on SGLang's running batch: the next get_next_batch_to_run clears it
                # when the prefill batch shrinks as it is merged (a request finished at prefill, or the
                # chunked request kept out), or replaces an empty running batch with the prefill batch
                self.batch_is_full = False
            return st
        if not self.running:
            return st
        self._decode(st)
        return st

    def _reject_never_admissible(self, st: StepStats) -> None:
        """0.5.2 re-admits a retracted request only when its prompt, the tokens it had generated
        and its whole ``min(max_new_tokens, 4096)`` fit below the pool (``total_tokens >=
        rem_total_tokens``; its own cached prefix is locked, so this holds whatever the tree
        keeps). One that cannot would block the queue forever in SGLang 0.5.2; with nothing
        running the simulator rejects it instead."""
        cap = self.capacity_tokens
        stuck = [s for s in self.waiting if s.num_tokens + min(s.out_len, CLIP_MAX_NEW_TOKENS) >= cap]
        if not stuck:
            return
        gone = set(map(id, stuck))
        self.waiting = deque(s for s in self.waiting if id(s) not in gone)
        for s in stuck:
            s.rejected = (f"aborted: resumed with {s.num_tokens} tokens + {min(s.out_len, CLIP_MAX_NEW_TOKENS)} new "
                          f"cannot be re-admitted to a pool of {cap} (SGLang 0.5.2 would wait forever)")
            st.rejected.append(s)

    def _decode(self, st: StepStats) -> None:
        need = len(self.running)  # one new token slot per request (page_size 1)
        if self.page_size > 1:
            need = sum(self.page_size for s in self.running if s.num_computed % self.page_size == 0)
        if self.available() < need:
            short = need if self.version == "0.5.2" else need - self.available()
            self.tree.evict(short)
        if self.available() < need:
            self._retract()
            if self.aborted:
                st.rejected.extend(self.aborted)
                self.aborted.clear()
            if not self.running:
                return
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        if self.page_size > 1:  # alloc_paged_token_slots_decode evicts for one new page per request
            self._evict_for_batch(len(self.running) * self.page_size)
        st.num_running = len(self.running)
        done = []
        if self.page_size == 1 and self.available() >= len(self.running):
            # one token slot each, no eviction needed (_alloc and advance, per request, inlined)
            self.private_tokens += len(self.running)
            st.decode_tokens += len(self.running)
            ctx = 0
            first = st.first_token
            if self.events is not None:
                self.events.extend(Allocate(seq.req.id, 1) for seq in self.running)
            for seq in self.running:
                seq.private += 1
                c = seq.num_computed = seq.num_computed + 1
                ctx += c
                if c >= seq.prompt_len + seq.num_output:  # caught up: sample a token
                    seq.num_output += 1
                    if seq.num_output == 1 and seq.first_token_s is None:
                        first.append(seq)
                    if seq.num_output >= seq.out_len:
                        done.append(seq)
            st.context_tokens += ctx
        else:
            for seq in self.running:
                grow = 1 if self.page_size == 1 else (self.page_size if seq.num_computed % self.page_size == 0 else 0)
                if grow:
                    self._alloc(seq, grow)
                st.decode_tokens += 1
                st.context_tokens += seq.num_computed + 1
                if self.advance(seq, 1, st):
                    done.append(seq)
        if done:
            for seq in done:
                self._cache_finished(seq)
                st.finished.append(seq)
            gone = set(map(id, done))
            self.running = [s for s in self.running if id(s) not in gone]
            self.batch_is_full = False
        if not self.running and not self.waiting and self.chunked is None:
            self.new_token_ratio = self.init_ratio

    def decode_horizon(self) -> tuple[int, int, int] | None:
        if self.page_size != 1 or self.chunked is not None or not self.running:
            return None
        if self.waiting and not self.batch_is_full:
            return None  # a prefill round would be tried
        b = len(self.running)
        k = min(min(s.out_len - s.num_output for s in self.running) - 1,  # nobody finishes
                self.available() // b)  # no eviction, no retraction
        return (k, b, sum(s.num_computed + 1 for s in self.running)) if k >= 2 else None

    def fast_forward(self, k: int) -> None:
        for s in self.running:
            s.num_computed += k
            s.num_output += k
            s.private += k
        self.private_tokens += k * len(self.running)
        self.new_token_ratio = max(self.new_token_ratio - k * self.ratio_decay, self.min_ratio)

    def _decode_need(self, reqs) -> int:
        """Token cells the next decode step allocates (``new_tokens_required_next_decode``)."""
        if self.page_size == 1:
            return len(reqs)
        return sum(self.page_size for s in reqs if s.num_computed % self.page_size == 0)

    def _decode_fits(self, reqs) -> bool:
        """``check_decode_mem``: evict (0.5.2: the whole need, 0.5.23: the shortfall) when the
        pool is short, then whether the next decode step fits."""
        need = self._decode_need(reqs)
        avail = self.available()
        if avail < need:
            self.tree.evict(need if self.version == "0.5.2" else need - avail)
        return self.available() >= need

    def _retract_one(self, seq: SglangRequest) -> None:
        """``release_req``: free the request's own KV, unlock its prefix, back to the queue."""
        if self.events is not None:
            self.events.append(Preempt(seq.req.id, seq.num_computed))
        self._release_private(seq)
        self.tree.dec_lock(seq.last_node)
        seq.last_node, seq.prefix_len = self.tree.root, 0
        seq.num_computed = 0

    def _retract(self) -> None:
        """``retract_decode``: fewest outputs first (ties: longest prompt), until the next decode
        step fits (``while first_iter or not check_decode_mem(selected_indices)``; 20 steps enter
        only the new ratio). 0.5.23 evicts the shortfall of 20 steps for those left after each
        retraction and aborts the last request if even it alone cannot decode; 0.5.2 stops at
        the last request (SGLang 0.5.2 then fails an assertion, "No space left for only one
        request", where it cannot decode: the simulator aborts it instead)."""
        order = sorted(self.running, key=lambda s: (s.num_output, -s.prompt_len), reverse=True)
        v23 = self.version == "0.5.23"
        retracted = 0
        fits = False
        while True:
            if retracted:
                fits = self._decode_fits(order)
                if fits:
                    break
            if len(order) <= 1:  # "Corner case: only one request left"
                break
            seq = order.pop()
            self._retract_one(seq)
            seq.preemptions += 1
            self.waiting.append(seq)
            retracted += 1
            if v23:  # release_req uses the newly evictable memory at once
                want = len(order) * RETRACT_DECODE_STEPS
                if self.available() < want:
                    self.tree.evict(want - self.available())
        if not fits and (retracted or not self._decode_fits(order)):  # (after a retraction: checked above)
            seq = order.pop()  # "Out of memory even after retracting all other requests"
            self._retract_one(seq)
            seq.rejected = (f"aborted: out of KV memory even after retracting every other request (SGLang "
                            f"{self.version})")
            self.aborted.append(seq)
        # filter_batch(keep_indices=sorted_indices): the batch keeps the retraction order (most
        # outputs first, ties: shortest prompt), which orders later inserts and LRU touches
        self.running = order
        avail = self.available()
        need = len(order)
        if avail < need and not v23:
            self.tree.evict(need)
        decoded = sum(s.num_output for s in order)
        max_new = sum(s.out_len for s in order) + (1 if self.version == "0.5.23" else 0) or 1  # (0.5.2: none left)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / max_new)
        self.batch_is_full = False

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        tree = self.tree
        total = evictable = 0
        locks: dict[Node, int] = {}
        live = list(self.running) + ([self.chunked] if self.chunked else [])
        for s in live:
            node = s.last_node
            while node is not tree.root:
                locks[node] = locks.get(node, 0) + 1
                node = node.parent
        for node in tree.nodes():
            if node is tree.root:
                continue
            if node.lock_ref < 0:
                raise InvariantError(f"sglang: negative lock_ref {node.lock_ref}")
            if node.lock_ref != locks.get(node, 0):
                raise InvariantError(f"sglang: node lock_ref {node.lock_ref} but {locks.get(node, 0)} requests hold it")
            total += node.length
            if node.lock_ref == 0:
                evictable += node.length
            if (not node.children) != (node in tree.leaves):
                raise InvariantError("sglang: leaf set out of date")
        if total != tree.total_tokens or evictable != tree.evictable_tokens:
            raise InvariantError(f"sglang: tree counts {tree.total_tokens}/{tree.evictable_tokens} "
                                 f"but nodes hold {total}/{evictable}")
        priv = sum(s.private for s in live)
        if priv != self.private_tokens or any(s.private < 0 for s in live):
            raise InvariantError(f"sglang: private tokens {self.private_tokens} but requests hold {priv}")
        p = self.page_size
        for s in live:
            if s.prefix_len + s.private != -(-s.num_computed // p) * p:
                raise InvariantError(f"sglang: {s!r} holds {s.prefix_len}+{s.private} KV for {s.num_computed} tokens")

    def check_drained(self) -> None:
        self.check_invariants()
        if self.running or self.waiting or self.chunked:
            raise InvariantError("sglang: requests left behind")
        if self.private_tokens or self.tree.evictable_tokens != self.tree.total_tokens:
            raise InvariantError(f"sglang: leaked {self.private_tokens} private tokens or locked nodes")

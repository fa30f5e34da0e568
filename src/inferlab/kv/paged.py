"""vLLM v1: the block pool with automatic prefix caching, and the v1 scheduler.

Semantics (../shared/reference/kv_managers.md section 1, vllm 0.11.0 and 0.33.0):
* a pool of ``capacity_tokens // block_size`` blocks; block 0 is the null block, never used;
* chained block hashes over *full* blocks only; a block is registered in the hash map when it is
  scheduled (``allocate_slots`` -> ``cache_blocks``), so a request admitted later in the same step
  already hits it; decode blocks are registered as soon as they fill; no de-duplication;
* lookup only for waiting requests, at most ``num_tokens - 1`` tokens (the last token is always
  recomputed): an identical 32-token prompt hits 16 tokens;
* free-block queue: allocation pops the head (evicting the block's hash lazily); a request frees
  its blocks tail first; 0.11 appends every freed block at the tail, 0.33 puts unhashed blocks
  at the head;
* each step: running requests first (decodes and partial prefills, in admission order), then
  waiting requests while budget (``max_num_batched_tokens``), ``max_num_seqs`` and blocks allow,
  new requests chunked to the leftover budget, head-of-line blocking on allocation failure;
* preemption by recompute of the most recently admitted request when a running request cannot
  get a block; no admission in a step that preempted;
* 0.33 only admits a waiting request if its whole prompt (minus hits) fits
  (``scheduler_reserve_full_isl``) and records hit metrics at admission (0.11: at every lookup).

Not modelled: ``enable_chunked_prefill=False``, the priority policy,
``long_prefill_token_threshold``, speculative decoding, LoRA / multimodal / cache-salt extra keys,
hybrid (sliding-window, Mamba) managers, hash granularity finer than a block (0.33).

Block hashes: the key of a block inside one run of consecutive ids is
``hash((key of the block before the run, first id of the run's first full block)) + offset``;
a block that spans runs hashes ``(parent key, its ids as canonical runs)`` (a request's runs
are canonical, so equal ids give equal runs). Both are functions of the
whole prefix, like vLLM's chained hashes, and like vLLM's they are trusted not to collide
(64-bit; a stretch of a few thousand consecutive keys per run).
"""

from __future__ import annotations

from collections import deque
from itertools import islice, takewhile
from operator import itemgetter
from typing import Any

from ..errors import InvalidValueError, UnknownNameError
from .simulator import InvariantError, KVManager, Seq, StepStats
from .tokens import slice_runs

VLLM_VERSIONS = ("0.11", "0.33")
NONE_HASH = hash(("vllm-none-hash",))


def block_keys(runs, block_size: int) -> list[int]:
    """Chained keys of every full block of a run list (see module docstring)."""
    keys: list[int] = []
    pos = 0
    for start, n in runs:
        end = pos + n
        j = len(keys)  # next block to key
        while (j + 1) * block_size <= end:
            lo = j * block_size
            if lo >= pos:  # a stretch of blocks fully inside this run
                cnt = (end - lo) // block_size
                anchor = keys[j - 1] if j else NONE_HASH
                base = hash((anchor, start + lo - pos))  # (parent key, first id of the stretch)
                keys.extend(range(base, base + cnt))  # + offset within the stretch
                j += cnt
            else:  # a block that began in an earlier run
                parent = keys[j - 1] if j else NONE_HASH
                keys.append(hash((parent, slice_runs(runs, lo, lo + block_size))))  # (canonical runs)
                j += 1
        pos = end
    return keys


class FreeBlockQueue:
    """vLLM's ``FreeKVCacheBlockQueue``: the free blocks, head (allocated next) to tail, each with
    the block hash it still carries (None: no hash), which allocation evicts.

    vLLM keeps a doubly linked list: ``popleft`` at the head, ``append`` at the tail, removal
    from the middle when a hit touches a free block, and (0.33) unhashed blocks prepended at the
    head. Here: ``head`` is a stack (top = head of the queue) that only 0.33's unhashed blocks
    enter, then ``tail`` (with ``tail_keys`` beside it), lists read from index ``start`` on.
    Bulk pops and appends are slices. A touched block leaves lazily: ``stale[b]`` counts the
    copies of ``b`` still in ``tail`` that are no longer free. A block re-enters only at the
    tail, so its stale copies always precede its live one, and a pop that meets ``b`` while
    ``stale[b]`` > 0 has met a stale copy.
    """

    __slots__ = ("head", "tail", "tail_keys", "start", "stale", "num_stale")
    COMPACT_AT = 4096  # consumed front entries / stale copies tolerated before the lists are rebuilt

    def __init__(self, head: list[int], tail: list[int]):
        self.head = head[::-1]  # top of the stack = head of the queue
        self.tail = tail
        self.tail_keys: list[int | None] = [None] * len(tail)
        self.start = 0
        self.stale: dict[int, int] = {}
        self.num_stale = 0

    def __len__(self) -> int:
        return len(self.head) + len(self.tail) - self.start - self.num_stale

    def popleft_n(self, n: int) -> tuple[list[int], list[int | None]]:
        """``popleft`` n times (n <= len(self)): the blocks, head first, and their hashes."""
        head = self.head
        if len(head) >= n:
            out = head[-n:]
            del head[-n:]
            out.reverse()
            return out, [None] * n
        out = head[::-1]
        head.clear()
        keys: list[int | None] = [None] * len(out)
        tail, tail_keys, stale = self.tail, self.tail_keys, self.stale
        while len(out) < n:
            lo = self.start
            hi = self.start = lo + n - len(out)
            seg, kseg = tail[lo:hi], tail_keys[lo:hi]
            if stale and not stale.keys().isdisjoint(seg):  # skip the touched blocks' copies
                live, live_keys = [], []
                for b, k in zip(seg, kseg):
                    c = stale.get(b)
                    if c is None:
                        live.append(b)
                        live_keys.append(k)
                    elif c == 1:
                        del stale[b]
                    else:
                        stale[b] = c - 1
                self.num_stale -= len(seg) - len(live)
                seg, kseg = live, live_keys
            out += seg
            keys += kseg
        if self.start > self.COMPACT_AT and self.start * 2 > len(tail):  # drop the consumed front, amortised O(1)
            del tail[:self.start]
            del tail_keys[:self.start]
            self.start = 0
        return out, keys

    def popleft(self) -> tuple[int, int | None]:
        """``popleft`` once (the queue is not empty): the block and its hash (popleft_n(1) without
        the lists; a decode token that starts a block)."""
        if self.head:
            return self.head.pop(), None
        tail, stale = self.tail, self.stale
        i = self.start
        while True:
            b = tail[i]
            c = stale.get(b) if stale else None
            if c is None:
                break
            if c == 1:  # a touched block's stale copy: skip it
                del stale[b]
            else:
                stale[b] = c - 1
            self.num_stale -= 1
            i += 1
        tail_keys = self.tail_keys
        k = tail_keys[i]
        self.start = i + 1
        if self.start > self.COMPACT_AT and self.start * 2 > len(tail):  # as popleft_n
            del tail[:self.start]
            del tail_keys[:self.start]
            self.start = 0
        return b, k

    def append_n(self, blocks: list[int], keys: list[int | None]) -> None:
        """``append`` each block (with its hash) at the tail, in order."""
        self.tail += blocks
        self.tail_keys += keys

    def prepend_n(self, blocks: list[int]) -> None:
        """``appendleft`` each unhashed block at the head, in order (the last one ends up first)."""
        self.head += blocks

    def remove_n(self, blocks: list[int]) -> None:
        """``remove`` free blocks from wherever they sit (hits touching cached free blocks; only
        hashed blocks can be hit, and those sit in ``tail``)."""
        stale = self.stale
        for b in blocks:
            stale[b] = stale.get(b, 0) + 1
        self.num_stale += len(blocks)
        if self.num_stale > self.COMPACT_AT and self.num_stale * 2 > len(self.tail) - self.start:
            live = self.items()[len(self.head):]  # mostly stale: rebuild from the live copies
            self.tail = [b for b, _ in live]
            self.tail_keys = [k for _, k in live]
            self.start = 0
            self.stale.clear()
            self.num_stale = 0

    def items(self) -> list[tuple[int, int | None]]:
        """(block, hash) from head to tail."""
        stale = dict(self.stale)
        live = []
        for b, k in zip(islice(self.tail, self.start, None), islice(self.tail_keys, self.start, None)):
            c = stale.get(b)
            if c:
                stale[b] = c - 1
            else:
                live.append((b, k))
        return [(b, None) for b in reversed(self.head)] + live


class PagedManager(KVManager):
    """vLLM v1's KV-cache manager and scheduler (default: vLLM 0.33 behaviour).

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
        self.watermark_blocks = int(watermark * num_blocks)
        self.ref = [0] * num_blocks
        self.num_extra_refs = 0  # sum over blocks of ref_cnt - 1 where above 1 (blocks shared by requests)
        # The free-block queue: 0.11 appends every freed block at the tail; 0.33 prepends blocks
        # without a hash at the head and appends hashed ones. A hit on a free block takes it out.
        # A block's hash lives beside it in the queue while it is free; while requests hold it,
        # it is the holders' block hash at that position (blocks [0, num_cached_blocks) of a
        # request carry hashes: its hits, then the blocks it registered).
        # 0.33 initialises the queue in block-id order like 0.11, but every block is unhashed
        self.free = FreeBlockQueue(list(range(1, num_blocks)), []) if version == "0.33" \
            else FreeBlockQueue([], list(range(1, num_blocks)))
        self.num_hashed_free = 0  # free blocks that still carry a hash (reusable cache)
        self.cached: dict[int, int] = {}  # block hash -> first block holding it
        self.dups: dict[int, list[int]] = {}  # further blocks with the same hash (no dedup)
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()
        self.queries = self.hits = 0
        self.map_epoch = 0  # bumped whenever a hash enters or leaves the map (lookups memoised per epoch)
        self.preempted_queries = self.preempted_hits = 0
        # the decode batch on a shared clock (see the class docstring)
        self.decode_clock = max_model_len is None and max_num_seqs <= max_num_batched_tokens
        self.clock = 0  # steps so far
        self.num_lazy = 0  # running[:num_lazy] decode on the clock
        self.dbase_sum = 0  # sum of their dbase (context tokens of a step, summed at once)
        self.decode_events: list[list[tuple[Seq, bool]]] = [[] for _ in range(block_size)]
        self.finish_at: dict[int, list[Seq]] = {}

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
        return (self.usable_blocks - self.num_free) * self.block_size

    def kv_cached_tokens(self) -> int:
        return self.num_hashed_free * self.block_size

    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries else None

    @property
    def num_free(self) -> int:
        return len(self.free)

    def free_queue(self) -> list[int]:
        """The free-block queue from head (next allocated) to tail."""
        return [b for b, _ in self.free.items()]

    # ---------------------------------------------------------------- block pool
    def _keys(self, seq: Seq) -> list[int]:
        keys = getattr(seq, "bkeys", None)
        if keys is None:
            keys = seq.bkeys = block_keys(seq.runs, self.block_size)
        return keys

    def _lookup(self, seq: Seq) -> list[int]:
        """``get_computed_blocks``: hit blocks for a waiting request (at most num_tokens - 1 tokens)."""
        if not self.enable_prefix_caching:
            return []
        n = (seq.num_tokens - 1) // self.block_size
        memo = getattr(seq, "lookup_memo", None)  # a blocked head is looked up again every step
        if memo is not None and memo[0] == self.map_epoch and memo[1] == n:
            hits = memo[2]
        else:
            cached = self.cached
            hits = list(map(cached.__getitem__, takewhile(cached.__contains__, islice(self._keys(seq), n))))  # to the first miss
            seq.lookup_memo = (self.map_epoch, n, hits)
        if self.version == "0.11":  # 0.11 records every lookup, retries included
            self.queries += seq.num_tokens
            self.hits += len(hits) * self.block_size
        return hits

    def _evict(self, b: int, k: int) -> None:
        """Drop block ``b``'s entry for hash ``k`` from the hash map (no de-duplication: another
        block with the same hash becomes the one lookups return)."""
        d = self.dups.get(k)
        if self.cached.get(k) == b:
            if d:
                self.cached[k] = d.pop(0)
            else:
                del self.cached[k]
        elif d is not None:
            d.remove(b)
        if d is not None and not d:
            del self.dups[k]

    def _allocate(self, seq: Seq, num_new: int, hits: list[int] = (), admitting: bool = False,
                  dry_run: bool = False) -> bool:
        """``allocate_slots``: reserve blocks for ``num_new`` more tokens; register full blocks."""
        bs = self.block_size
        if num_new == 1 and not hits and not admitting:  # a decode step
            c = seq.num_computed
            if c % bs and (c + 1) % bs and (self.max_model_len is None or c < self.max_model_len):
                return True  # inside a block: nothing to do
            if self.max_model_len is None and -(-(c + 1) // bs) - len(seq.blocks) <= 1 and (
                    not self.enable_prefix_caching or (c + 1) // bs - seq.num_cached_blocks <= 1):
                return self._decode_block(seq)
        total = seq.num_computed + len(hits) * bs + num_new
        if self.max_model_len is not None:
            total = min(total, self.max_model_len)
        need = max(-(-total // bs) - len(seq.blocks) - len(hits), 0)
        ref = self.ref
        free_hits = list(map(ref.__getitem__, hits)).count(0) if hits else 0  # hit blocks still in the free queue
        avail = len(self.free)
        check = need
        if admitting and self.version == "0.33":
            check = max(-(-seq.num_tokens // bs) - len(hits), need)  # whole prompt must fit
            if self.running:
                avail -= self.watermark_blocks
        if check + free_hits > avail:
            return False
        if dry_run:
            return True
        blocks = seq.blocks
        if hits:
            if free_hits:  # touch: hit blocks nobody holds leave the free queue
                self.free.remove_n([b for b in hits if ref[b] == 0])
            self.num_hashed_free -= free_hits
            for b in hits:
                ref[b] += 1
            self.num_extra_refs += len(hits) - free_hits  # hits on blocks other requests hold
            blocks.extend(hits)
            seq.num_cached_blocks = len(blocks)  # hit blocks are cached already
        if need:
            new, old = self.free.popleft_n(need)
            unhashed = old.count(None)
            ks = old if not unhashed else [k for k in old if k is not None] if unhashed < need else []
            if ks:  # lazy eviction of the cached content those blocks held
                self.num_hashed_free -= len(ks)
                self.map_epoch += 1
                if self.dups and not self.dups.keys().isdisjoint(ks):
                    for b, k in zip(new, old):
                        if k is not None:
                            self._evict(b, k)
                else:
                    cached = self.cached
                    for k in ks:
                        del cached[k]
            for b in new:
                ref[b] = 1
            blocks.extend(new)
        if self.enable_prefix_caching:
            nfull = min(total, seq.num_tokens) // bs
            lo = seq.num_cached_blocks
            if nfull > lo:
                keys = self._keys(seq)[lo:nfull]
                seg = blocks[lo:nfull]
                cached = self.cached
                if cached.keys().isdisjoint(keys):  # the usual case: all new content
                    cached.update(zip(keys, seg))
                else:
                    dups = self.dups
                    for b, k in zip(seg, keys):
                        if k in cached:
                            dups.setdefault(k, []).append(b)
                        else:
                            cached[k] = b
                seq.num_cached_blocks = nfull
                self.map_epoch += 1
        return True

    def _decode_block(self, seq: Seq) -> bool:
        """``allocate_slots`` for one decode token at a block boundary (what _allocate does, one
        block at a time): a token that starts a block takes one from the free queue, a token
        that fills one registers its hash."""
        c = seq.num_computed
        if -(-(c + 1) // self.block_size) > len(seq.blocks):
            if not self.free:
                return False
            self._start_block(seq)
        # (the decode token is never past num_tokens)
        if self.enable_prefix_caching and (c + 1) // self.block_size > seq.num_cached_blocks:
            self._fill_block(seq)
        return True

    def _start_block(self, seq: Seq) -> None:
        """A decode token starts a block: one block from the head of the free queue (not empty)."""
        b = self._pop_free()
        self.ref[b] = 1
        seq.blocks.append(b)

    def _fill_block(self, seq: Seq) -> None:
        """A decode token fills the request's next block: ``cache_blocks`` registers its hash
        (no de-duplication: an equal hash already in the map makes it a duplicate)."""
        j = seq.num_cached_blocks
        k = self._keys(seq)[j]
        if k in self.cached:
            self.dups.setdefault(k, []).append(seq.blocks[j])
        else:
            self.cached[k] = seq.blocks[j]
        seq.num_cached_blocks = j + 1
        self.map_epoch += 1

    def _free_seq(self, seq: Seq) -> None:
        """``free``: drop the request's references, tail block first; blocks nobody else holds go
        back to the free queue (0.11: all at the tail; 0.33: unhashed ones at the head)."""
        ref, free = self.ref, self.free
        blocks, nc = seq.blocks, seq.num_cached_blocks
        keys = self._keys(seq) if nc else []
        # Usually the blocks other requests still use form a prefix (shared hits, a common system
        # prompt): those only lose a reference; every later block becomes free. When no block in
        # the pool is shared, that prefix is empty without looking; when the prefix's references
        # beyond the first are all the pool has (num_extra_refs), no later block is shared either
        # (a request holds a block once), so only the prefix is read.
        shared, bulk = 0, True
        if self.num_extra_refs:
            extra = 0
            for b in blocks:
                r = ref[b]
                if r == 1:
                    break
                extra += r - 1
                shared += 1
            if extra != self.num_extra_refs:  # shared blocks further on: read every count
                refs = itemgetter(*blocks)(ref) if len(blocks) > 1 else [ref[b] for b in blocks]  # (C loop)
                bulk = shared <= nc and refs.count(1) == len(refs) - shared  # (held blocks have ref >= 1)
            else:
                bulk = shared <= nc
        if bulk:
            if shared:
                for b in blocks[:shared]:
                    ref[b] -= 1
                self.num_extra_refs -= shared
            # blocks[shared:nc] carry hashes (hits and registered blocks), the rest (the partial
            # tail) not; tail block first (one reversed slice each)
            stop = shared - 1 if shared else None  # (index -1 would mean the end)
            hashed_rev = blocks[nc - 1:stop:-1] if nc > shared else []
            hashed_keys = keys[nc - 1:stop:-1] if nc > shared else []
            unhashed_rev = blocks[:nc - 1:-1] if nc else blocks[::-1]
            for b in hashed_rev:  # (the lists just built: their ids are still in the CPU cache)
                ref[b] = 0
            for b in unhashed_rev:
                ref[b] = 0
            if self.version == "0.33":
                free.prepend_n(unhashed_rev)
                free.append_n(hashed_rev, hashed_keys)
            else:
                free.append_n(unhashed_rev + hashed_rev, [None] * len(unhashed_rev) + hashed_keys)
            self.num_hashed_free += nc - shared
        else:
            for i in range(len(blocks) - 1, -1, -1):  # tail block first
                b = blocks[i]
                ref[b] -= 1
                if ref[b]:
                    self.num_extra_refs -= 1
                    continue
                if i < nc:
                    free.append_n([b], [keys[i]])
                    self.num_hashed_free += 1
                elif self.version == "0.33":  # 0.33: a block without a hash goes to the head
                    free.prepend_n([b])
                else:  # 0.11: every block to the tail
                    free.append_n([b], [None])
        seq.blocks = []
        seq.num_cached_blocks = 0

    # ---------------------------------------------------------------- scheduling
    def add(self, seq: Seq, now: float) -> str | None:
        bs = self.block_size
        if self.max_model_len is not None and seq.prompt_len > self.max_model_len:
            return f"prompt of {seq.prompt_len} tokens exceeds max_model_len={self.max_model_len}"
        final = seq.prompt_len + seq.out_len - 1  # tokens with KV when the last token is sampled
        if self.max_model_len is not None:
            final = min(final, self.max_model_len)
        if -(-final // bs) > self.usable_blocks:
            return (f"needs {-(-final // bs)} KV blocks of {bs} tokens for {seq.prompt_len} prompt + "
                    f"{seq.out_len} new tokens; the pool has {self.usable_blocks} usable blocks")
        seq.blocks = []
        seq.num_cached_blocks = 0
        seq.dbase = None  # not decoding on the clock
        self.waiting.append(seq)
        return None

    def _preempt(self, victim: Seq) -> None:
        if victim.dbase is not None:  # (a victim has not had its turn in this step yet)
            self._settle(victim, self.clock)
        self._free_seq(victim)
        victim.num_computed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)

    def _finish(self, seq: Seq, st: StepStats) -> None:
        self._free_seq(seq)
        seq.bkeys = seq.lookup_memo = None  # block keys are recomputed if ever needed; long traces keep memory flat
        st.finished.append(seq)

    def _forward(self, seq: Seq, num_new: int, first: list[Seq], finished: list[Seq]) -> bool:
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
        if not done and mml is not None and c >= mml and c >= seq.num_tokens - 1:
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
        first = st.first_token
        finished: list[Seq] = []
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
            if mml is not None:
                num_new = min(num_new, mml - c)
            if num_new <= 0:
                i += 1
                continue
            scheduled, preempted_now = self._allocate_or_preempt(seq, self._allocate, seq, num_new)
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
            hits = self._lookup(seq)
            hit_tokens = len(hits) * self.block_size
            num_new = seq.num_tokens - hit_tokens
            if num_new > budget:
                num_new = budget  # chunked prefill: clip to the leftover budget
            if not self._allocate(seq, num_new, hits, admitting=True):
                break  # head-of-line blocking
            waiting.popleft()
            seq.num_computed = hit_tokens
            running.append(seq)
            if self.version == "0.33":
                if seq.preemptions == 0:
                    self.queries += seq.num_tokens
                    self.hits += hit_tokens
                else:
                    self.preempted_queries += seq.num_tokens
                    self.preempted_hits += hit_tokens
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
        for seq, starts in tuple(bucket):  # (a snapshot: preemption takes entries out)
            if seq.dbase is None:
                continue  # preempted in this step
            if not starts:
                self._fill_block(seq)
                continue
            scheduled, preempted_now = self._allocate_or_preempt(seq, self.free.__len__)  # a free block?
            preempted |= preempted_now
            if scheduled:
                self._start_block(seq)
        return preempted

    def _allocate_or_preempt(self, seq: Seq, allocate, *args) -> tuple[bool, bool]:
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

    def _decodes(self, seq: Seq) -> bool:
        """``seq`` (not on the clock) only decodes: its next token is its last sampled one, and
        it holds exactly the blocks of its computed tokens, all full ones registered (always so
        after a prefill; checked so that the clock's block work is exact)."""
        c, o, bs = seq.num_computed, seq.num_output, self.block_size
        return bool(o) and c == seq.prompt_len + o - 1 and len(seq.blocks) == -(-c // bs) and (
            not self.enable_prefix_caching or seq.num_cached_blocks == c // bs)

    def _join(self, seq: Seq) -> None:
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

    def _settle(self, seq: Seq, t: int) -> None:
        """Take ``seq`` off the clock with its fields as of clock value ``t``."""
        bs, base = self.block_size, seq.dbase
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
            head = self.waiting[0]
            hits = self._lookup(head)
            num_new = min(head.num_tokens - len(hits) * self.block_size,
                          self.max_num_batched_tokens - len(running))
            if self._allocate(head, num_new, hits, admitting=True, dry_run=True):
                return None  # the head would be admitted; it stays blocked while blocks only shrink
        b = len(running)
        bs, t = self.block_size, self.clock
        c = [s.dbase + t for s in running[:nd]] + [s.num_computed for s in running[nd:]]
        # nobody finishes: out_len - num_output - 1 more tokens each, num_output = c - prompt_len + 1
        k = min(s.out_len + s.prompt_len - x for s, x in zip(running, c)) - 2
        if self.max_model_len is not None:
            k = min(k, self.max_model_len - max(c) - 1)
        while k >= 2:  # enough free blocks for every new block in k steps: no preemption
            need = sum((x + k - 1) // bs - (x - 1) // bs for x in c)
            if need <= self.num_free:
                break
            k //= 2
        return (k, b, sum(c) + b) if k >= 2 else None

    def fast_forward(self, k: int) -> None:
        """k decode steps: the block work of each step's tokens that start or fill a block, in
        running order within each step (as _decode_block_work, which never preempts here)."""
        temporary = self.num_lazy < len(self.running)  # decode_clock off: on the clock meanwhile
        for s in self.running[self.num_lazy:]:
            self._join(s)
        t0 = self.clock
        bs, events = self.block_size, self.decode_events
        for t in range(t0, t0 + k):
            for s, starts in events[t % bs]:
                if starts:
                    self._start_block(s)
                else:
                    self._fill_block(s)
        self.clock = t0 + k
        if temporary:
            for s in self.running:
                self._settle(s, self.clock)

    def _pop_free(self) -> int:
        """One block from the head of the free queue, its cached content evicted."""
        b, k = self.free.popleft()
        if k is not None:
            self.num_hashed_free -= 1
            self._evict(b, k)
            self.map_epoch += 1
        return b

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        ref = self.ref
        if any(r < 0 for r in ref):
            raise InvariantError(f"vllm: negative ref_cnt at blocks {[b for b, r in enumerate(ref) if r < 0]}")
        counts = [0] * self.num_gpu_blocks
        for seq in self.running:
            for b in seq.blocks:
                counts[b] += 1
        if counts != ref:
            bad = [b for b in range(self.num_gpu_blocks) if counts[b] != ref[b]][:5]
            raise InvariantError(f"vllm: ref_cnt disagrees with running block tables at blocks {bad}")
        if self.num_extra_refs != sum(r - 1 for r in ref if r > 1):
            raise InvariantError(f"vllm: shared-reference count {self.num_extra_refs} drifted")
        queue = self.free.items()
        free_ids = {b for b, _ in queue}
        if len(free_ids) != len(queue) or len(queue) != self.num_free:
            raise InvariantError("vllm: a block sits twice in the free queue")
        if any(c < 1 for c in self.free.stale.values()) or sum(self.free.stale.values()) != self.free.num_stale:
            raise InvariantError("vllm: the free queue's stale-copy counts drifted")
        # the hash each block carries: free blocks carry theirs in the queue; a held block carries
        # its holders' block hash at its position, which every holder must agree on
        bhash = dict(queue)
        for seq in self.running:
            keys = self._keys(seq) if seq.num_cached_blocks else []
            for i, b in enumerate(seq.blocks):
                k = keys[i] if i < seq.num_cached_blocks else None
                if bhash.setdefault(b, k) != k:
                    raise InvariantError(f"vllm: block {b} carries two hashes in two requests")
        if 0 in free_ids or ref[0]:
            raise InvariantError("vllm: the null block entered circulation")
        in_use = {b for b in range(1, self.num_gpu_blocks) if ref[b] > 0}
        if in_use & free_ids or len(in_use) + len(free_ids) != self.usable_blocks:
            raise InvariantError("vllm: free queue and in-use blocks do not partition the pool")
        if self.num_hashed_free != sum(1 for _, k in queue if k is not None):
            raise InvariantError("vllm: hashed-free counter drifted")
        for k, b in self.cached.items():
            if bhash.get(b) != k:
                raise InvariantError(f"vllm: hash map points at block {b} which holds another hash")
        for k, bs in self.dups.items():
            if not bs or k not in self.cached or any(bhash.get(b) != k for b in bs):
                raise InvariantError(f"vllm: duplicate blocks for hash {k} disagree with the map")
        if len(self.cached) + sum(map(len, self.dups.values())) != sum(1 for k in bhash.values() if k is not None):
            raise InvariantError("vllm: a hashed block is missing from the hash map")
        self._check_decode_clock()

    def _check_decode_clock(self) -> None:
        """The decode batch on the clock: running[:num_lazy], each decoding with exactly its
        blocks, listed once per block event and once at its finishing step."""
        nd, t, bs = self.num_lazy, self.clock, self.block_size
        lazy = self.running[:nd]
        if any(getattr(s, "dbase", None) is None for s in lazy) or any(
                getattr(s, "dbase", None) is not None for s in self.running[nd:]):
            raise InvariantError("vllm: the decode batch on the clock is not running[:num_lazy]")
        want: list[list[tuple[Seq, bool]]] = [[] for _ in range(bs)]
        finish: dict[int, list[Seq]] = {}
        for s in lazy:
            c = s.dbase + t
            if c > s.prompt_len + s.out_len - 2 or len(s.blocks) != -(-c // bs) or (
                    self.enable_prefix_caching and s.num_cached_blocks != c // bs):
                raise InvariantError(f"vllm: {s!r} on the decode clock at {c} tokens holds "
                                     f"{len(s.blocks)} blocks ({s.num_cached_blocks} registered)")
            want[-s.dbase % bs].append((s, True))
            if self.enable_prefix_caching:
                want[(-s.dbase - 1) % bs].append((s, False))
            finish.setdefault(s.out_len + s.prompt_len - 2 - s.dbase, []).append(s)
        if want != self.decode_events or finish != self.finish_at or sum(s.dbase for s in lazy) != self.dbase_sum:
            raise InvariantError("vllm: the decode clock's event lists drifted")

    def check_drained(self) -> None:
        self.check_invariants()
        if self.running or self.waiting or self.num_lazy:
            raise InvariantError(f"vllm: {len(self.running)} running / {len(self.waiting)} waiting left")
        if self.num_free != self.usable_blocks or any(self.ref):
            raise InvariantError(f"vllm: {self.usable_blocks - self.num_free} blocks leaked")

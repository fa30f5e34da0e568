"""vLLM v1's ``KVCacheManager`` for one full-attention group (``vllm/v1/core/kv_cache_manager.py``
and the single-type manager under it): per request, its block table and block hashes; the
prefix lookup (``get_computed_blocks``), ``allocate_slots`` and ``free`` over the
:class:`~inferlab.kv.vllm.block_pool.BlockPool`; the prefix-cache hit metrics.

Rules (docs/engines/vllm.md, "get_computed_blocks", "allocate_slots", "Prefix-cache hit metrics"):
* lookup only for waiting requests, at most ``num_tokens - 1`` tokens (the last token is always
  recomputed): an identical 32-token prompt hits 16 tokens;
* a block is registered in the hash map when it is scheduled (``allocate_slots`` ->
  ``cache_blocks``), so a request admitted later in the same step already hits it; decode
  blocks are registered as soon as they fill;
* 0.33 only admits a waiting request if its whole prompt (minus hits) fits
  (``scheduler_reserve_full_isl``), less the watermark while requests run, and records hit
  metrics at admission; 0.11 records them at every lookup.

Fast paths beside their plain paths: a memoised lookup (per hash-map epoch: a blocked head of
line is looked up again every step) beside :meth:`KVCacheManager.find_hits`; the one-token
decode path of :meth:`KVCacheManager.allocate_slots` (``decode_block``) beside its general path
(tests/kv/test_properties.py runs both).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..events import Allocate, Cache, Free, PrefixHit
from ..simulator import Request, Seq
from .block_pool import BlockPool, block_keys


class VllmRequest(Seq):
    """A request as vLLM's scheduler and KV-cache manager see it, on top of :class:`Seq`."""

    __slots__ = ("blocks", "block_hashes", "num_cached_blocks", "lookup_memo", "dbase")

    def __init__(self, req: Request, index: int):
        super().__init__(req, index)
        self.blocks: list[int] = []  # the block table (hits first, then allocated blocks)
        self.block_hashes: list[int] | None = None  # chained hashes of every full block of prompt + reply, computed once
        self.num_cached_blocks = 0  # blocks[:num_cached_blocks] are in the hash map (hits, then registered)
        self.lookup_memo: tuple[int, int, list[int]] | None = None  # (map epoch, blocks looked up, hits)
        self.dbase: int | None = None  # on the scheduler's decode clock: num_computed = dbase + clock


class KVCacheManager:
    """Blocks for requests: lookup, allocation, registration and free over one block pool."""

    def __init__(self, num_gpu_blocks: int, *, block_size: int, enable_prefix_caching: bool,
                 max_model_len: int | None, watermark_blocks: int, version: str):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.max_model_len = max_model_len
        self.watermark_blocks = watermark_blocks
        self.version = version
        self.full_isl_gate = version == "0.33"  # scheduler_reserve_full_isl
        self.pool = BlockPool(num_gpu_blocks, unhashed_to_head=version == "0.33", block_size=block_size)
        # PrefixCacheStats: 0.33 records at admission (preempted requests apart), 0.11 at every lookup
        self.queries = self.hits = 0
        self.preempted_queries = self.preempted_hits = 0
        self.events: list | None = None

    def set_events(self, events: list | None) -> None:
        self.events = self.pool.events = events

    # ---------------------------------------------------------------- hashes and lookup
    def block_hashes(self, req: VllmRequest) -> list[int]:
        """The request's chained block hashes (computed once, dropped when it finishes)."""
        keys = req.block_hashes
        if keys is None:
            keys = req.block_hashes = block_keys(req.runs, self.block_size)
        return keys

    def find_hits(self, req: VllmRequest) -> list[int]:
        """The plain lookup: hit blocks of ``req`` now (at most num_tokens - 1 tokens)."""
        return self.pool.find_longest_cache_hit(self.block_hashes(req), (req.num_tokens - 1) // self.block_size)

    def get_computed_blocks(self, req: VllmRequest) -> list[int]:
        """``get_computed_blocks`` for a waiting request, memoised per hash-map epoch."""
        if not self.enable_prefix_caching:
            return []
        n = (req.num_tokens - 1) // self.block_size
        memo = req.lookup_memo
        if memo is not None and memo[0] == self.pool.map_epoch and memo[1] == n:
            hits = memo[2]
        else:
            hits = self.pool.find_longest_cache_hit(self.block_hashes(req), n)  # to the first miss
            req.lookup_memo = (self.pool.map_epoch, n, hits)
        if self.version == "0.11":  # 0.11 records every lookup, retries included
            self.queries += req.num_tokens
            self.hits += len(hits) * self.block_size
        return hits

    def record_admission(self, req: VllmRequest, hit_tokens: int) -> None:
        """0.33's PrefixCacheStats at admission (previously preempted requests counted apart);
        nothing without prefix caching (vLLM then skips the lookup and its stats)."""
        if self.version == "0.33" and self.enable_prefix_caching:
            if req.preemptions == 0:
                self.queries += req.num_tokens
                self.hits += hit_tokens
            else:
                self.preempted_queries += req.num_tokens
                self.preempted_hits += hit_tokens

    # ---------------------------------------------------------------- allocate_slots
    def allocate_slots(self, req: VllmRequest, num_new: int, hits: Sequence[int] = (), admitting: bool = False,
                       dry_run: bool = False, running: bool = True) -> bool:
        """``allocate_slots``: reserve blocks for ``num_new`` more tokens (after ``hits``);
        register the blocks that will be full. ``running``: other requests are running (the
        watermark applies then)."""
        bs = self.block_size
        if num_new == 1 and not hits and not admitting:  # a decode step
            c = req.num_computed
            if c % bs and (c + 1) % bs and (self.max_model_len is None or c < self.max_model_len):
                return True  # inside a block: nothing to do
            if self.max_model_len is None and -(-(c + 1) // bs) - len(req.blocks) <= 1 and (
                    not self.enable_prefix_caching or (c + 1) // bs - req.num_cached_blocks <= 1):
                return self.decode_block(req)
        total = req.num_computed + len(hits) * bs + num_new
        if self.max_model_len is not None:
            total = min(total, self.max_model_len)
        need = max(-(-total // bs) - len(req.blocks) - len(hits), 0)
        pool = self.pool
        free_hits = pool.num_free_hits(hits)  # hit blocks still in the free queue
        avail = len(pool.free)
        check = need
        if admitting and self.full_isl_gate:
            check = max(-(-req.num_tokens // bs) - len(hits), need)  # whole prompt must fit
            if running:
                avail -= self.watermark_blocks
        if check + free_hits > avail:
            return False
        if dry_run:
            return True
        blocks = req.blocks
        ev = self.events
        if hits:
            pool.touch(hits, free_hits)
            if ev is not None:
                ev.append(PrefixHit(req.req.id, len(hits) * bs, tuple(hits),
                                    tuple(self.block_hashes(req)[:len(hits)])))
            blocks.extend(hits)
            req.num_cached_blocks = len(blocks)  # hit blocks are cached already
        if need:
            new = pool.get_new_blocks(need)
            blocks.extend(new)
            if ev is not None:
                ev.append(Allocate(req.req.id, num_new, tuple(new)))
        if self.enable_prefix_caching:
            nfull = min(total, req.num_tokens) // bs
            lo = req.num_cached_blocks
            if nfull > lo:
                keys = self.block_hashes(req)[lo:nfull]
                pool.cache_blocks(keys, blocks[lo:nfull])
                req.num_cached_blocks = nfull
                if ev is not None:
                    ev.append(Cache(req.req.id, tuple(blocks[lo:nfull]), tuple(keys)))
        return True

    def decode_block(self, req: VllmRequest) -> bool:
        """``allocate_slots`` for one decode token at a block boundary (what the general path
        does, one block at a time): a token that starts a block takes one from the free queue,
        a token that fills one registers its hash."""
        c = req.num_computed
        if -(-(c + 1) // self.block_size) > len(req.blocks):
            if not self.pool.free:
                return False
            self.start_block(req)
        # (the decode token is never past num_tokens)
        if self.enable_prefix_caching and (c + 1) // self.block_size > req.num_cached_blocks:
            self.fill_block(req)
        return True

    def start_block(self, req: VllmRequest) -> None:
        """A decode token starts a block: one block from the head of the free queue (not empty)."""
        b = self.pool.get_new_block()
        req.blocks.append(b)
        if self.events is not None:
            self.events.append(Allocate(req.req.id, 1, (b,)))

    def fill_block(self, req: VllmRequest) -> None:
        """A decode token fills the request's next block: ``cache_blocks`` registers its hash."""
        j = req.num_cached_blocks
        k = self.block_hashes(req)[j]
        self.pool.cache_block(k, req.blocks[j])
        req.num_cached_blocks = j + 1
        if self.events is not None:
            self.events.append(Cache(req.req.id, (req.blocks[j],), (k,)))

    # ---------------------------------------------------------------- free
    def free(self, req: VllmRequest) -> None:
        """``free``: the request's blocks back to the pool, tail block first."""
        nc = req.num_cached_blocks
        if self.events is not None:
            self.events.append(Free(req.req.id, req.num_computed, tuple(reversed(req.blocks))))
        self.pool.free_blocks(req.blocks, nc, self.block_hashes(req) if nc else [])
        req.blocks = []
        req.num_cached_blocks = 0

    def check_invariants(self, running) -> None:
        tables = [(s.blocks, self.block_hashes(s)[:s.num_cached_blocks] if s.num_cached_blocks else [])
                  for s in running]
        self.pool.check_invariants(tables)

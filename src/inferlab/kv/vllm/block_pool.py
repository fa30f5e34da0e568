"""vLLM v1's ``BlockPool``: the blocks, their reference counts, the free-block queue and the
block-hash map (``vllm/v1/core/block_pool.py``, ``kv_cache_utils.py``).

Rules (docs/engines/vllm.md, "Block size and pool", "Block hashes", "Free-block queue"):
* ``num_gpu_blocks`` blocks; block 0 is the null block, never handed out;
* a free block keeps its hash until allocation pops it (lazy eviction); allocation pops the
  head of the free queue; a prefix hit on a free block takes it out of the queue (``touch``);
* no de-duplication: two blocks may carry one hash, lookups return the first registered;
* freeing a request's blocks goes tail block first; 0.11 appends every freed block at the tail,
  0.33 puts blocks without a hash at the head.

Block hashes: the key of a block inside one run of consecutive ids is
``hash((key of the block before the run, first id of the run's first full block)) + offset``;
a block that spans runs hashes ``(parent key, its ids as canonical runs)`` (a request's runs
are canonical, so equal ids give equal runs). Both are functions of the whole prefix, like
vLLM's chained hashes, and like vLLM's they are trusted not to collide (64-bit; a stretch of a
few thousand consecutive keys per run).

Fast paths, each beside the plain path its tests compare it with: :class:`FreeBlockQueue`
(slices and lazily dropped copies; the reference is a plain list, tests/kv/test_paged.py) and
:meth:`BlockPool.free_blocks` (bulk; the reference is :meth:`BlockPool.free_blocks_one_by_one`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice, takewhile
from operator import itemgetter

from ..events import Evict
from ..simulator import InvariantError
from ..tokens import slice_runs

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

    def append_n(self, blocks: list[int], keys: Sequence[int | None]) -> None:
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
        live: list[tuple[int, int | None]] = []
        for b, k in zip(islice(self.tail, self.start, None), islice(self.tail_keys, self.start, None)):
            c = stale.get(b)
            if c:
                stale[b] = c - 1
            else:
                live.append((b, k))
        head: list[tuple[int, int | None]] = [(b, None) for b in reversed(self.head)]
        return head + live


class BlockPool:
    """The pool: ``ref[b]`` (requests holding block b), the free queue (with the hash each free
    block still carries) and the hash map ``cached`` (hash -> first block holding it; further
    blocks with that hash in ``dups``). A held block's hash is its holders' block hash at its
    position (blocks ``[0, num_cached_blocks)`` of a request carry hashes: its hits, then the
    blocks it registered); the pool does not store it twice.

    ``map_epoch`` is bumped whenever a hash enters or leaves the map, so a lookup can be
    memoised per epoch. ``events`` is a list while a run records events (else None).
    """

    def __init__(self, num_gpu_blocks: int, unhashed_to_head: bool, block_size: int = 16):
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size  # (tokens per block: only the evict events count tokens)
        self.usable_blocks = num_gpu_blocks - 1  # block 0 = null block
        self.unhashed_to_head = unhashed_to_head  # 0.33: free blocks without a hash go to the head
        self.ref = [0] * num_gpu_blocks
        self.num_extra_refs = 0  # sum over blocks of ref_cnt - 1 where above 1 (blocks shared by requests)
        # 0.33 initialises the queue in block-id order like 0.11, but every block is unhashed
        self.free = FreeBlockQueue(list(range(1, num_gpu_blocks)), []) if unhashed_to_head \
            else FreeBlockQueue([], list(range(1, num_gpu_blocks)))
        self.num_hashed_free = 0  # free blocks that still carry a hash (reusable cache)
        self.cached: dict[int, int] = {}
        self.dups: dict[int, list[int]] = {}
        self.map_epoch = 0
        self.events: list | None = None

    @property
    def num_free(self) -> int:
        return len(self.free)

    def free_queue(self) -> list[int]:
        """The free-block queue from head (next allocated) to tail."""
        return [b for b, _ in self.free.items()]

    # ---------------------------------------------------------------- lookup
    def find_longest_cache_hit(self, keys, n: int) -> list[int]:
        """The blocks holding ``keys[:n]``, up to the first miss (chained hashes: nothing after
        a miss can hit)."""
        cached = self.cached
        return list(map(cached.__getitem__, takewhile(cached.__contains__, islice(keys, n))))

    # ---------------------------------------------------------------- allocate / evict / touch
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

    def get_new_blocks(self, n: int) -> list[int]:
        """``get_new_blocks``: n blocks from the head of the free queue (n <= num_free), the
        cached content they still held evicted, each held once."""
        new, old = self.free.popleft_n(n)
        unhashed = old.count(None)
        ks: list = old if not unhashed else [k for k in old if k is not None] if unhashed < n else []
        if ks:  # lazy eviction of the cached content those blocks held
            self.num_hashed_free -= len(ks)
            self.map_epoch += 1
            if self.events is not None:
                gone = [b for b, k in zip(new, old) if k is not None]
                self.events.append(Evict(tokens=len(gone) * self.block_size, blocks=tuple(gone), hashes=tuple(ks)))
            if self.dups and not self.dups.keys().isdisjoint(ks):
                for b, k in zip(new, old):
                    if k is not None:
                        self._evict(b, k)
            else:
                cached = self.cached
                for k in ks:
                    del cached[k]
        ref = self.ref
        for b in new:
            ref[b] = 1
        return new

    def get_new_block(self) -> int:
        """``get_new_blocks(1)`` without the lists (a decode token that starts a block)."""
        b, k = self.free.popleft()
        if k is not None:
            self.num_hashed_free -= 1
            self._evict(b, k)
            self.map_epoch += 1
            if self.events is not None:
                self.events.append(Evict(tokens=self.block_size, blocks=(b,), hashes=(k,)))
        self.ref[b] = 1
        return b

    def num_free_hits(self, hits: Sequence[int]) -> int:
        """Hit blocks nobody holds (they sit in the free queue: touching them uses free room)."""
        return list(map(self.ref.__getitem__, hits)).count(0) if hits else 0

    def touch(self, hits: Sequence[int], free_hits: int) -> None:
        """``touch``: one more reference on each hit block; those nobody held leave the queue."""
        ref = self.ref
        if free_hits:
            self.free.remove_n([b for b in hits if ref[b] == 0])
        self.num_hashed_free -= free_hits
        for b in hits:
            ref[b] += 1
        self.num_extra_refs += len(hits) - free_hits  # hits on blocks other requests hold

    # ---------------------------------------------------------------- cache (register hashes)
    def cache_blocks(self, keys: list[int], blocks: list[int]) -> None:
        """``cache_full_blocks``: register each block under its hash (an equal hash already in
        the map makes it a duplicate)."""
        cached = self.cached
        if cached.keys().isdisjoint(keys):  # the usual case: all new content
            cached.update(zip(keys, blocks))
        else:
            dups = self.dups
            for b, k in zip(blocks, keys):
                if k in cached:
                    dups.setdefault(k, []).append(b)
                else:
                    cached[k] = b
        self.map_epoch += 1

    def cache_block(self, k: int, b: int) -> None:
        """cache_blocks for one block (a decode token that fills it)."""
        if k in self.cached:
            self.dups.setdefault(k, []).append(b)
        else:
            self.cached[k] = b
        self.map_epoch += 1

    # ---------------------------------------------------------------- free
    def free_blocks(self, blocks: list[int], nc: int, keys: list[int]) -> None:
        """``free_blocks`` of one request's block table, tail block first: drop one reference
        each; blocks nobody else holds go back to the free queue (0.11: all at the tail; 0.33:
        unhashed ones at the head). ``blocks[:nc]`` carry the hashes ``keys[:nc]``.

        Usually the blocks other requests still use form a prefix (shared hits, a common system
        prompt): those only lose a reference; every later block becomes free. When no block in
        the pool is shared, that prefix is empty without looking; when the prefix's references
        beyond the first are all the pool has (num_extra_refs), no later block is shared either
        (a request holds a block once), so only the prefix is read. Otherwise, and as the
        reference the tests compare with: :meth:`free_blocks_one_by_one`.
        """
        ref, free = self.ref, self.free
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
        if not bulk:
            self.free_blocks_one_by_one(blocks, nc, keys)
            return
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
        if self.unhashed_to_head:
            free.prepend_n(unhashed_rev)
            free.append_n(hashed_rev, hashed_keys)
        else:
            free.append_n(unhashed_rev + hashed_rev, [None] * len(unhashed_rev) + hashed_keys)
        self.num_hashed_free += nc - shared

    def free_blocks_one_by_one(self, blocks: list[int], nc: int, keys: list[int]) -> None:
        """vLLM's ``free_blocks`` block by block, tail first (the plain path; free_blocks'
        bulk slices must give the same queue)."""
        ref, free = self.ref, self.free
        for i in range(len(blocks) - 1, -1, -1):
            b = blocks[i]
            ref[b] -= 1
            if ref[b]:  # another request still holds it
                self.num_extra_refs -= 1
                continue
            if i < nc:  # hits, then the blocks it registered
                free.append_n([b], [keys[i]])
                self.num_hashed_free += 1
            elif self.unhashed_to_head:  # 0.33: a block without a hash goes to the head
                free.prepend_n([b])
            else:  # 0.11: every block to the tail
                free.append_n([b], [None])

    # ---------------------------------------------------------------- invariants
    def check_invariants(self, tables) -> None:
        """``tables``: (block table, its hashes up to num_cached_blocks) of every running request."""
        ref, nb = self.ref, self.num_gpu_blocks
        if any(r < 0 for r in ref):
            raise InvariantError(f"vllm: negative ref_cnt at blocks {[b for b, r in enumerate(ref) if r < 0]}")
        counts = [0] * nb
        for blocks, _ in tables:
            for b in blocks:
                counts[b] += 1
        if counts != ref:
            bad = [b for b in range(nb) if counts[b] != ref[b]][:5]
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
        for blocks, keys in tables:
            for i, b in enumerate(blocks):
                k = keys[i] if i < len(keys) else None
                if bhash.setdefault(b, k) != k:
                    raise InvariantError(f"vllm: block {b} carries two hashes in two requests")
        if 0 in free_ids or ref[0]:
            raise InvariantError("vllm: the null block entered circulation")
        in_use = {b for b in range(1, nb) if ref[b] > 0}
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

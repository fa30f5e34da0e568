"""vLLM v1 hand-worked cases; each expected figure is derived in a comment from vLLM's rules."""

import pytest

from inferlab.kv_managers import PagedManager, Request, simulate


def ids(start, n):
    return list(range(start, start + n))


def by_id(run):
    return {r.id: r for r in run.requests}


def test_identical_32_token_prompt_hits_16():
    # max_cache_hit_length = 32 - 1 = 31 -> whole blocks only: 16 * (31 // 16) = 16 tokens.
    reqs = [Request("a", 0, ids(0, 32), 1), Request("b", 10, ids(0, 32), 1)]
    run = simulate(reqs, PagedManager(capacity_tokens=1024), check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 16
    assert by_id(run)["b"].computed_prompt_tokens == 16


def test_33_token_prompt_hits_32():
    # 33 - 1 = 32 -> two full blocks hit; the 33rd token is computed.
    reqs = [Request("a", 0, ids(0, 33), 1), Request("b", 10, ids(0, 33), 1)]
    run = simulate(reqs, PagedManager(capacity_tokens=1024), check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 32


def test_blocks_hittable_in_the_step_they_are_scheduled():
    # Both arrive together; "a" is admitted first and cache_blocks registers its 3 full blocks at
    # scheduling time, so "b" (admitted later in the same step) hits 16 * ((48 - 1) // 16) = 32.
    reqs = [Request("a", 0, ids(0, 48), 4), Request("b", 0, ids(0, 48), 4)]
    run = simulate(reqs, PagedManager(capacity_tokens=1024), check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 32
    assert run.summary["peak_concurrency"] == 2


def test_partial_prefix_hits_whole_blocks_only():
    # b shares 40 tokens with a: blocks 0 and 1 (tokens 0..31) match, block 2 differs -> 32.
    reqs = [Request("a", 0, ids(0, 64), 1), Request("b", 10, ids(0, 40) + ids(1000, 24), 1)]
    run = simulate(reqs, PagedManager(capacity_tokens=1024), check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 32


def test_eviction_takes_a_requests_tail_blocks_first():
    # capacity 96 -> 6 blocks, block 0 is the null block: 5 usable, free queue [1,2,3,4,5].
    # a (64 tokens) takes blocks 1-4 (chain positions 0-3) and finishes; freeing is tail first,
    # appended at the tail: queue [5, 4, 3, 2, 1]. b (40 unrelated tokens) needs 3 blocks: pops
    # 5, 4, 3 -> evicts a's positions 3 and 2. a's positions 0 and 1 survive: c (a's prompt
    # again) hits 32 tokens. (Plain "LRU by last use" with ties in block order would evict 1, 2.)
    reqs = [Request("a", 0, ids(0, 64), 1), Request("b", 10, ids(500, 40), 1),
            Request("c", 20, ids(0, 64), 1)]
    for version in ("0.11", "0.33"):
        run = simulate(reqs, PagedManager(capacity_tokens=96, version=version), check_invariants=True)
        assert by_id(run)["c"].cached_tokens == 32, version


def test_unhashed_block_goes_to_head_in_0_33_only():
    # capacity 96: 5 usable blocks, free queue [1,2,3,4,5]. a: 20-token prompt, 1 new token ->
    # pops blocks 1 (full, hashed at scheduling) and 2 (partial, never hashed). Freed tail first:
    # 0.11 appends both at the tail: [3,4,5,2,1]; 0.33 puts the unhashed block 2 at the head and
    # the hashed block 1 at the tail: [2,3,4,5,1].
    m11 = PagedManager(capacity_tokens=96, version="0.11")
    m33 = PagedManager(capacity_tokens=96, version="0.33")
    for m in (m11, m33):
        simulate([Request("a", 0, ids(0, 20), 1)], m, check_invariants=True)
    assert m11.free_queue() == [3, 4, 5, 2, 1]
    assert m33.free_queue() == [2, 3, 4, 5, 1]


def test_preemption_takes_the_newest_admission():
    # capacity 80 -> 5 blocks, 4 usable. a and b: 16-token prompts, 30 new tokens each (final KV
    # 45 tokens = 3 blocks each, 6 > 4). Both admitted in step 1 with one block; in lockstep each
    # takes a second block at token 16; at token 32 a (first in running) needs a third block,
    # none is free -> running.pop() preempts b (the most recently admitted); a finishes untouched.
    reqs = [Request("a", 0, ids(0, 16), 30), Request("b", 0, ids(100, 16), 30)]
    run = simulate(reqs, PagedManager(capacity_tokens=80), check_invariants=True)
    r = by_id(run)
    assert r["a"].preemptions == 0
    assert r["b"].preemptions >= 1
    assert r["b"].output_tokens == 30 and r["b"].rejected is None
    assert r["b"].recomputed_tokens > 0


def test_chunked_prefill_under_the_token_budget():
    # 5000 prompt tokens with max_num_batched_tokens 2048: chunks 2048, 2048, 904 -> the first
    # token is sampled at the end of step 3.
    run = simulate([Request("a", 0, ids(0, 5000), 2)], PagedManager(capacity_tokens=8192),
                   check_invariants=True)
    assert run.requests[0].ttft_s == 3.0
    assert run.summary["steps"] == 4


def test_request_larger_than_the_pool_is_rejected_with_reason():
    run = simulate([Request("big", 0, ids(0, 400), 10), Request("ok", 0, ids(0, 10), 2)],
                   PagedManager(capacity_tokens=256))
    r = by_id(run)
    assert r["big"].rejected and "blocks" in r["big"].rejected
    assert r["ok"].rejected is None and r["ok"].output_tokens == 2


def test_bad_options():
    from inferlab.errors import InvalidValueError, UnknownNameError
    with pytest.raises(UnknownNameError):
        PagedManager(capacity_tokens=256, version="0.7")
    with pytest.raises(InvalidValueError):
        PagedManager(capacity_tokens=16)
    with pytest.raises(InvalidValueError):
        PagedManager(capacity_tokens=-5)


def per_block(m):
    """The manager with vLLM's ``free`` block by block, tail first (BlockPool.free_blocks_one_by_one:
    0.11 appends every freed block, 0.33 pushes unhashed blocks to the head), the plain path
    BlockPool.free_blocks' bulk slices must agree with."""
    m.kv.pool.free_blocks = m.kv.pool.free_blocks_one_by_one
    return m


@pytest.mark.slow
def test_bulk_free_matches_the_per_block_rule_on_a_mooncake_slice():
    # BlockPool.free_blocks frees in bulk; this reference frees block by block, tail first: 0.11 appends
    # every freed block, 0.33 pushes unhashed blocks to the head. Same records under eviction.
    from inferlab.kv.traces import load_mooncake

    from _paths import CONVERSATION_TRACE as trace
    if not trace.exists():
        pytest.skip("traces not present")

    reqs = load_mooncake(trace, limit=120)
    for version in ("0.33", "0.11"):
        bulk = simulate(reqs, PagedManager(capacity_tokens=40000, version=version), record_timeline=False)
        m = per_block(PagedManager(capacity_tokens=40000, version=version))
        ref = simulate(reqs, m, record_timeline=False, check_invariants=True)
        assert bulk.requests == ref.requests
        assert bulk.summary["preemptions"] > 0  # the pool was tight enough to evict and preempt


def test_bulk_free_matches_the_per_block_rule_with_sharing_elsewhere():
    # Prompts drawn from a few shared stems, chunked by a tiny budget: requests are often freed
    # while other requests share blocks outside the freed one's table, so free_blocks' prefix
    # shortcut does not apply (about a third of the frees) and it reads every count; the result
    # must equal vLLM's block-by-block free.
    import random

    for seed in range(30):
        rng = random.Random(seed)
        stems = [ids(1000 * k, rng.randint(4, 24)) for k in range(3)]
        reqs = []
        for n in range(14):
            prompt = [t for k in rng.sample(range(3), rng.randint(1, 3)) for t in stems[k]]
            reqs.append(Request(f"r{n}", n // 3, prompt + ids(50_000 + 100 * n, rng.randint(0, 6)), rng.randint(1, 9)))
        for version in ("0.33", "0.11"):
            kw = dict(capacity_tokens=rng.choice((96, 160, 400)), block_size=4, max_num_batched_tokens=6,
                      version=version)
            bulk = simulate(reqs, PagedManager(**kw), check_invariants=True, record_timeline=False)
            m = per_block(PagedManager(**kw))
            ref = simulate(reqs, m, check_invariants=True, record_timeline=False)
            assert bulk.requests == ref.requests


def test_free_keeps_shared_blocks_that_are_not_a_prefix():
    # No de-duplication: "a" and "a2" compute the same 3 blocks; with the map pointing at a2's
    # first block and a's second, "b" hits [a2[0], a[1]]. Freeing "a" must keep a[1] (b holds
    # it) although a[0] is not shared: free_blocks' prefix shortcut does not apply, and the
    # result must be vLLM's block-by-block free.
    from inferlab.kv.vllm import VllmRequest

    def build(one_by_one):
        m = PagedManager(capacity_tokens=64 * 16)
        if one_by_one:
            per_block(m)
        kv, pool = m.kv, m.kv.pool
        a, a2, b = (VllmRequest(Request(n, 0, ids(0, 48), 4), k) for k, n in enumerate(("a", "a2", "b")))
        for s in (a, a2):
            assert kv.allocate_slots(s, 48, admitting=True)
            s.num_computed = 48
        k0 = kv.block_hashes(a)[0]
        assert pool.cached[k0] == a.blocks[0] and pool.dups[k0] == [a2.blocks[0]]
        pool.cached[k0], pool.dups[k0] = a2.blocks[0], [a.blocks[0]]  # a2's copy registered first
        assert kv.get_computed_blocks(b) == [a2.blocks[0], a.blocks[1]]  # 47 // 16 = 2 blocks looked up
        assert kv.allocate_slots(b, 16, kv.get_computed_blocks(b), admitting=True)
        b.num_computed = 48
        m.running = [a, a2, b]
        m.check_invariants()
        held = a.blocks[1]
        kv.free(a)
        m.running.remove(a)
        m.check_invariants()
        return m, held

    bulk, held = build(False)
    ref, _ = build(True)
    assert bulk.kv.pool.ref[held] == 1 and held not in bulk.free_queue()
    assert bulk.kv.pool.free.items() == ref.kv.pool.free.items() and bulk.kv.pool.ref == ref.kv.pool.ref


def test_free_block_queue_matches_a_plain_list_under_random_operations():
    # FreeBlockQueue keeps vLLM's doubly linked free list as slices with lazily dropped copies;
    # this reference is the list itself: popleft (one or n) from the front, append at the back, appendleft
    # at the front, remove from anywhere. A tiny COMPACT_AT exercises the rebuild paths.
    import random

    from inferlab.kv.vllm.block_pool import FreeBlockQueue

    class Small(FreeBlockQueue):
        __slots__ = ()
        COMPACT_AT = 2

    for seed in range(40):
        rng = random.Random(seed)
        n = rng.randint(4, 40)
        v033 = rng.random() < 0.5
        ref = [(b, None) for b in range(1, n)]
        q = Small(list(range(1, n)), []) if v033 else Small([], list(range(1, n)))
        held: list[int] = []
        for _ in range(300):
            op = rng.random()
            if op < 0.1 and ref:  # one decode block from the head
                got = [q.popleft()]
                assert got[0] == ref[0]
                del ref[:1]
                held += [b for b, _ in got]
            elif op < 0.35 and ref:  # allocate a few blocks from the head
                k = rng.randint(1, len(ref))
                got, keys = q.popleft_n(k)
                assert list(zip(got, keys)) == ref[:k]
                del ref[:k]
                held += got
            elif op < 0.7 and held:  # free some held blocks, hashed to the tail, unhashed (0.33) to the head
                rng.shuffle(held)
                k = rng.randint(1, len(held))
                gone, held = held[:k], held[k:]
                hashed = [b for b in gone if not v033 or rng.random() < 0.6]
                unhashed = [b for b in gone if b not in hashed]
                keys = [None if rng.random() < 0.2 and not v033 else 1000 + b for b in hashed]
                q.append_n(hashed, keys)
                ref += list(zip(hashed, keys))
                q.prepend_n(unhashed)
                ref = [(b, None) for b in reversed(unhashed)] + ref
            elif ref:  # touch: hits take hashed free blocks out of the middle
                tail = [b for b, k in ref if k is not None]
                touched = rng.sample(tail, rng.randint(0, min(3, len(tail))))
                q.remove_n(touched)
                ref = [(b, k) for b, k in ref if b not in touched]
                held += touched
            assert q.items() == ref
            assert len(q) == len(ref)


def test_memoised_lookup_equals_the_plain_lookup_on_a_mooncake_slice():
    # get_computed_blocks memoises a head-of-line request's lookup per hash-map epoch; every
    # call must return what find_hits (the plain walk over the hash map) returns at that moment,
    # under eviction (a tight pool) and for both versions.
    from inferlab.kv.traces import load_mooncake

    from _paths import CONVERSATION_TRACE as trace
    if not trace.exists():
        pytest.skip("traces not present")
    reqs = load_mooncake(trace, limit=80)
    for version in ("0.33", "0.11"):
        m = PagedManager(capacity_tokens=30000, version=version)
        kv, calls = m.kv, []
        memoised = kv.get_computed_blocks

        def checked(req, memoised=memoised, kv=kv, calls=calls):
            hits = memoised(req)
            assert hits == kv.find_hits(req)
            calls.append(req.lookup_memo is not None)
            return hits

        kv.get_computed_blocks = checked
        run = simulate(reqs, m, record_timeline=False)
        assert len(calls) > len(reqs) and run.summary["preemptions"] > 0  # retried lookups, under pressure

"""inferlab's radix tree against SGLang's own ``RadixCache`` (the wheel named in SGLANG_VERSION,
installed without its dependencies by scripts/test; see _sglang_engine.py), call by call.

Every call inferlab's RadixManager makes on its tree while it serves a workload (prefix matches
with the scheduler's limits, inserts after prefills, chunks and finishes, lock moves, evictions
for allocations and retractions, 0.5.23's waiting-prefix refresh, lpm's sorting matches) is made
again on SGLang's RadixCache; both must answer alike: tokens matched, tokens already present,
tokens evicted, and the tree's total and evictable (unlocked) sizes after each call. Hand-made
cases aim at one rule each (edge splits, lock protection, LRU order, pages, chunked prefill,
retraction, the lpm and fcfs policies, 0.5.2's eviction size); two windows of 1,000 Mooncake
conversation requests evict over ten million tokens.

SGLang's whole scheduler loop (its Scheduler's get_next_batch_to_run, PrefillAdder over its
ScheduleBatch and Req objects, retract_decode, the result processors) is compared request by
request in test_sglang_loop.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferlab.kv_managers import RadixManager, Request, simulate  # noqa: E402

SGLANG_VERSION = "0.5.23"  # the release compared with (its RadixCache; inferlab's tree is one for both versions)
from _engine_import import engine_or_skip  # noqa: E402

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

eng = engine_or_skip("_sglang_engine", reason=f"SGLang {SGLANG_VERSION} is not installed: "
                          f"pip install --no-deps sglang=={SGLANG_VERSION} (scripts/test does)")


def ids(start, n):
    return list(range(start, start + n))


S = ids(0, 40)  # a shared stem
CASES = {
    # b diverges inside a's edge: the tree splits at 40 (match) and adds b's leaf (insert)
    "split_on_partial_match": ([Request("a", 0, S + ids(900, 20), 2), Request("b", 10, S + ids(950, 20), 2)], {}),
    # c needs room while b runs: only unlocked leaves (a's) may go; b's path is locked
    "lock_protects_running": ([Request("a", 0, ids(0, 60), 1), Request("b", 5, ids(1000, 60), 30),
                               Request("c", 6, ids(2000, 50), 2)], {"capacity_tokens": 170}),
    # three cached prompts, then a large one: the least recently used leaves go first
    "lru_order": ([Request(n, k, ids(1000 * k, 50), 1) for k, n in enumerate("abc")]
                  + [Request("a2", 4, ids(0, 50), 1), Request("big", 6, ids(9000, 120), 1)],
                  {"capacity_tokens": 220}),
    # page_size 16: page-aligned keys, partial pages never enter the tree
    "page_16": ([Request("a", 0, ids(0, 50), 5), Request("b", 10, ids(0, 37) + ids(700, 20), 5)],
                {"page_size": 16, "capacity_tokens": 1024}),
    # chunked prefill: each chunk is inserted and the lock moves along
    "chunked_prefill": ([Request("a", 0, ids(0, 300), 3), Request("b", 1, ids(0, 200) + ids(800, 30), 3)],
                        {"chunked_prefill_size": 64}),
    # retraction: the retracted request unlocks its path, its prompt stays cached
    "retraction": ([Request(f"r{k}", k, ids(100 * k, 10), 40) for k in range(3)],
                   {"capacity_tokens": 100, "schedule_conservativeness": 0.3}),
    # lpm: matches for sorting (whole tokens), in-batch deprioritisation of a shared uncached stem
    "lpm_policy": ([Request(f"r{k}", 0, S + ids(5000 + 50 * k, 10), 3) for k in range(5)]
                   + [Request("x", 1, ids(0, 45), 2)], {"schedule_policy": "lpm", "capacity_tokens": 300}),
    # fcfs with a long queue: 0.5.23 touches the waiting prefixes every 32nd round
    "fcfs_refresh": ([Request(f"r{k}", 0, S + ids(6000 + 10 * k, 8), 6) for k in range(40)],
                     {"capacity_tokens": 400, "max_running_requests": 2}),
    "dfs_weight": ([Request(f"r{k}", k // 3, (S if k % 2 else ids(3000, 40)) + ids(7000 + 10 * k, 5), 3)
                    for k in range(8)], {"schedule_policy": "dfs-weight", "capacity_tokens": 400}),
    # 0.5.2 asks the tree for the whole allocation, not the shortfall
    "version_0_5_2": ([Request("a", 0, ids(0, 60), 1), Request("b", 2, ids(500, 60), 1),
                       Request("c", 4, ids(900, 90), 1)], {"capacity_tokens": 160, "version": "0.5.2"}),
}


def _replay(reqs, opts, **kw):
    opts = {"capacity_tokens": 4096, **opts}
    m = RadixManager(**opts)
    calls = eng.record_tree_calls(m)
    run = simulate(reqs, m, check_invariants=True, **kw)
    n, diffs = eng.replay(calls, opts.get("page_size", 1))
    return run, calls, n, diffs


@pytest.mark.parametrize("name", sorted(CASES))
def test_sglang_radix_cache_case(name):
    reqs, opts = CASES[name]
    run, calls, n, diffs = _replay(reqs, opts)
    assert n > 0 and diffs == []
    ops = {c[0] for c in calls}
    assert {"match", "insert", "inc_lock", "dec_lock"} <= ops
    if name in ("lock_protects_running", "lru_order", "version_0_5_2", "retraction"):
        assert any(c[0] == "evict" and c[2] > 0 for c in calls)  # the case evicts
    if name == "retraction":
        assert run.summary["preemptions"] > 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_sglang_radix_cache_on_a_mooncake_window(page_size):
    # 1,000 conversation requests through a 131,072-token pool: ~62,000 tree calls, 13.4 M
    # tokens evicted, retractions included.
    from inferlab.kv.traces import load_mooncake

    from _paths import CONVERSATION_TRACE
    reqs = load_mooncake(CONVERSATION_TRACE, limit=1000)
    m = RadixManager(capacity_tokens=131072, page_size=page_size)
    calls = eng.record_tree_calls(m)
    run = simulate(reqs, m, record_timeline=False)
    n, diffs = eng.replay(calls, page_size)
    assert diffs == [], f"{len(diffs)} of {n} calls differ, first {diffs[:3]}"
    assert n > 50_000 and sum(c[2] for c in calls if c[0] == "evict") > 10_000_000
    assert run.summary["preemptions"] > 0


def _random_round(rng):
    """A random scheduler state: cached prompts in the tree, running requests with reserved
    futures, waiting requests (some resumed after a retraction) that share cached prefixes."""
    stems = [ids(10_000 * (k + 1), rng.randint(8, 300)) for k in range(rng.randint(0, 3))]
    running = [(f"run{k}", ids(500_000 + 1000 * k, rng.randint(1, 50)), rng.randint(2, 6000)) for k in range(rng.randint(0, 4))]
    running = [(rid, p, out, rng.randint(1, out - 1)) for rid, p, out in running]
    waiting = []
    for k in range(rng.randint(1, 6)):
        base = rng.choice(stems)[:rng.randint(1, 300)] if stems and rng.random() < 0.7 else []
        prompt = base + ids(900_000 + 1000 * k, rng.randint(1, 400))
        out = rng.randint(1, 200) if rng.random() < 0.6 else rng.randint(1, 6000)
        done = rng.randint(1, out - 1) if out > 1 and rng.random() < 0.2 else 0  # resumed after a retraction
        waiting.append((f"w{k}", prompt, out, done))
    return stems, running, waiting, dict(
        free=rng.randint(0, 8000), new_token_ratio=rng.choice([0.098, 0.3, 0.7, 1.0]),
        max_prefill_tokens=rng.choice([16384, 500, 150]), chunked_prefill_size=rng.choice([None, 64, 2048]))


def _inferlab_round(stems, running, waiting, free, new_token_ratio, max_prefill_tokens, chunked_prefill_size):
    from inferlab.kv.sglang import SglangRequest
    from inferlab.kv.tokens import runs_of_list
    private = sum(len(p) + done - 1 for _, p, _, done in running)
    cached = sum(len(s) for s in stems)  # (stems share no tokens: each is its own leaf)
    m = RadixManager(capacity_tokens=free + cached + private, version="0.5.23", max_running_requests=1000,
                     chunked_prefill_size=chunked_prefill_size or -1, max_prefill_tokens=max_prefill_tokens)
    for s in stems:
        m.tree.insert(runs_of_list(s), len(s))
    seqs = {}
    for k, (rid, prompt, out, done) in enumerate(running + waiting):
        s = seqs[rid] = SglangRequest(Request(rid, 0, prompt, out), k)
        s.last_node, s.num_output = m.tree.root, done
        if rid.startswith("run"):
            s.num_computed = s.private = len(prompt) + done - 1
            m.running.append(s)
        else:
            m.waiting.append(s)
    m.private_tokens = private
    m.new_token_ratio = new_token_ratio
    assert m.available() == free
    adds = m._prefill_round(0.0) or []
    admitted = [(s.req.id, s.prefix_len, n) for s, n in adds]
    return admitted, m.chunked.req.id if m.chunked is not None else None, m.batch_is_full and bool(adds or running), seqs


def test_prefill_adder_agrees_with_sglangs_own_on_random_states():
    # 300 random states (cached stems, running requests' reserved futures at several new-token
    # ratios, waiting requests sharing prefixes, some resumed after a retraction, budgets that bind):
    # SGLang's own PrefillAdder (in the scheduler's waiting-queue loop) and inferlab's 0.5.23 round
    # admit the same requests with the same prefix and extend, chunk the same one, and agree on
    # whether the batch is full.
    import random

    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    outcomes = {"admitted": 0, "chunked": 0, "full": 0}
    for seed in range(300):
        rng = random.Random(seed)
        stems, running, waiting, kw = _random_round(rng)
        tree = RadixCache.create_simulated(mock_allocator=eng.CountingAllocator(0), page_size=1)
        for s in stems:
            tree.insert(InsertParams(key=RadixKey(token_ids=eng.array("q", s)), value=torch.zeros(len(s), dtype=torch.int64)))
        ours = _inferlab_round(stems, running, waiting, **kw)
        seqs = ours[3]

        def out_ids(rid, done, seqs=seqs):
            return [t for a, n in seqs[rid].runs for t in range(a, a + n)][len(seqs[rid].req.prompt):][:done]

        theirs = eng.sglang_prefill_round(
            tree, kw["free"], [eng.sglang_req(r, p, o, out_ids(r, d)) for r, p, o, d in running],
            [eng.sglang_req(r, p, o, out_ids(r, d)) for r, p, o, d in waiting],
            new_token_ratio=kw["new_token_ratio"], max_prefill_tokens=kw["max_prefill_tokens"],
            chunked_prefill_size=kw["chunked_prefill_size"])
        assert ours[:3] == theirs, f"seed {seed}: inferlab {ours[:3]} vs SGLang {theirs}"
        outcomes["admitted"] += len(theirs[0])
        outcomes["chunked"] += theirs[1] is not None
        outcomes["full"] += theirs[2]
    assert min(outcomes.values()) > 20  # the states exercise admission, chunking and NO_TOKEN


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_waiting_queue_order_agrees_with_sglangs_own_schedule_policy(policy):
    # SGLang's SchedulePolicy.calc_priority sorts the waiting queue in place (lpm: longest match
    # first with in-batch deprioritisation of a shared uncached 32+-token prefix; dfs-weight:
    # heavier subtrees first); inferlab's calc_priority must give the same order on 200 random
    # queues over a tree of cached stems (both trees built alike, the matches split them alike).
    import random

    import torch
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    from inferlab.kv.sglang import RadixCache as OurTree
    from inferlab.kv.sglang import SglangRequest, calc_priority
    from inferlab.kv.tokens import runs_of_list
    moved = 0
    for seed in range(200):
        rng = random.Random(seed)
        stems = [ids(10_000 * (k + 1), rng.randint(20, 120)) for k in range(rng.randint(1, 3))]
        theirs_tree = RadixCache.create_simulated(mock_allocator=eng.CountingAllocator(0), page_size=1)
        ours_tree = OurTree(1)
        for s in stems:
            theirs_tree.insert(InsertParams(key=RadixKey(token_ids=eng.array("q", s)), value=torch.zeros(len(s), dtype=torch.int64)))
            ours_tree.insert(runs_of_list(s), len(s))
        shared = ids(700_000, rng.randint(20, 60))  # an uncached stem several waiting requests share
        waiting = []
        for k in range(rng.randint(2, 10)):
            r = rng.random()
            head = rng.choice(stems)[:rng.randint(1, 120)] if r < 0.5 else shared if r < 0.8 else []
            waiting.append((f"w{k}", head + ids(900_000 + 1000 * k, rng.randint(1, 40))))
        ours = [SglangRequest(Request(rid, 0, p, 4), k) for k, (rid, p) in enumerate(waiting)]
        ours_order = [s.req.id for s in calc_priority(policy, ours, ours_tree)]
        queue = [eng.sglang_req(rid, p, 4) for rid, p in waiting]
        SchedulePolicy(policy, theirs_tree, enable_hierarchical_cache=False, enable_priority_scheduling=False,
                       schedule_low_priority_values_first=False).calc_priority(queue)
        assert ours_order == [r.rid for r in queue], f"seed {seed}"
        moved += ours_order != [rid for rid, _ in waiting]
    assert moved > 50  # the policy reorders most queues

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

Not compared here: SGLang's scheduler loop itself (PrefillAdder over its ScheduleBatch and
Req objects); its 0.5.23 rules are ported from the code and hand-tested in tests/kv/test_radix.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferlab.kv_managers import RadixManager, Request, simulate  # noqa: E402

SGLANG_VERSION = "0.5.23"  # the release compared with (its RadixCache; inferlab's tree is one for both versions)
pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

eng = pytest.importorskip("_sglang_engine", reason=f"SGLang {SGLANG_VERSION} is not installed: "
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

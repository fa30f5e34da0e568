"""inferlab's PagedManager against vLLM's own Scheduler / KVCacheManager / BlockPool (the wheel
named in VLLM_VERSION, installed without its dependencies by scripts/test; see _vllm_engine.py).

Both serve the same requests on the same clock (one step per unit); per request they must agree
on the prompt tokens hit at first admission, the tokens recomputed after preemptions, the number
of preemptions, the first-token and finish steps and the tokens generated; per run on the
prefix-cache counters (0.33 counts queries and hits at admission, as inferlab's 0.33 mode).
Hand-made cases cover each rule PagedManager's docstrings claim; a window of 1,000 Mooncake
conversation requests with a pool tight enough to evict and preempt covers them together.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferlab.kv_managers import PagedManager, Request, simulate  # noqa: E402

VLLM_VERSION = "0.33.0"  # the release compared with; inferlab's version="0.33" models it
from _engine_import import engine_or_skip  # noqa: E402

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

eng = engine_or_skip("_vllm_engine", reason=f"vLLM {VLLM_VERSION} is not installed: "
                          f"pip install --no-deps vllm=={VLLM_VERSION} (scripts/test does)")


def ids(start, n):
    return list(range(start, start + n))


# name -> (requests, PagedManager / VllmEngine options, capacity in tokens); each rule in a comment
CASES = {
    # max_cache_hit_length = 32 - 1 -> one full block: 16 tokens hit
    "last_token_recomputed": ([Request("a", 0, ids(0, 32), 1), Request("b", 10, ids(0, 32), 1)], {}, 1024),
    # 33 - 1 = 32 -> two blocks hit
    "two_blocks_hit": ([Request("a", 0, ids(0, 33), 1), Request("b", 10, ids(0, 33), 1)], {}, 1024),
    # blocks registered at scheduling: b, admitted later in the same step, hits a's 2 blocks
    "hit_in_the_same_step": ([Request("a", 0, ids(0, 48), 4), Request("b", 0, ids(0, 48), 4)], {}, 1024),
    # only whole blocks before the first difference hit
    "partial_prefix": ([Request("a", 0, ids(0, 64), 1), Request("b", 10, ids(0, 40) + ids(1000, 24), 1)], {}, 1024),
    # freed tail block first: b evicts a's tail blocks, c still hits a's first two
    "eviction_tail_first": ([Request("a", 0, ids(0, 64), 1), Request("b", 10, ids(500, 40), 1),
                             Request("c", 20, ids(0, 64), 1)], {}, 96),
    # 0.33: an unhashed block goes to the head of the free queue (checked on the queue below too)
    "unhashed_to_head": ([Request("a", 0, ids(0, 20), 1), Request("b", 5, ids(300, 40), 1),
                          Request("c", 9, ids(0, 20), 1)], {}, 96),
    # decode tokens: a block registered as soon as it fills; turn 2 (prompt + reply) hits them
    "decode_blocks_cached": ([Request("t1", 0, ids(0, 20), 30, output=ids(5000, 30)),
                              Request("t2", 40, ids(0, 20) + ids(5000, 30) + ids(7000, 5), 2)], {}, 1024),
    # a running request lacking a block preempts the newest admission, which re-hits its blocks
    "preempt_newest": ([Request("a", 0, ids(0, 16), 30), Request("b", 0, ids(100, 16), 30)], {}, 80),
    "preempt_three": ([Request(f"r{k}", 0, ids(100 * k, 24), 40) for k in range(3)], {}, 160),
    # chunked prefill: 5000 tokens under a 2048-token budget, decodes of others scheduled first
    "chunked_prefill": ([Request("d", 0, ids(9000, 10), 8), Request("a", 1, ids(0, 5000), 2)], {}, 8192),
    # a new request chunked to the leftover budget, two prefills at once
    "leftover_budget": ([Request("a", 0, ids(0, 100), 3), Request("b", 0, ids(1000, 100), 3)],
                        {"max_num_batched_tokens": 64, "max_num_seqs": 8}, 1024),
    # 0.33's full-prompt admission gate: b waits until a's blocks are back although its first chunk fits
    "full_isl_gate": ([Request("a", 0, ids(0, 64), 20), Request("b", 1, ids(1000, 64), 2)],
                      {"max_num_batched_tokens": 32, "max_num_seqs": 8}, 144),
    # head-of-line blocking and max_num_seqs
    "max_num_seqs": ([Request(f"r{k}", 0, ids(100 * k, 20), 5) for k in range(5)], {"max_num_seqs": 2}, 1024),
    # the watermark keeps blocks for running requests while others wait
    "watermark": ([Request(f"r{k}", k, ids(100 * k, 40), 12) for k in range(4)], {"watermark": 0.2}, 256),
    "no_prefix_caching": ([Request("a", 0, ids(0, 48), 2), Request("b", 5, ids(0, 48), 2)],
                          {"enable_prefix_caching": False}, 1024),
    "block_size_4": ([Request("a", 0, ids(0, 18), 6), Request("b", 3, ids(0, 18), 6),
                      Request("c", 4, ids(0, 9) + ids(50, 9), 6)], {"block_size": 4}, 64),
}


def _compare(reqs, opts, capacity):
    m = PagedManager(capacity_tokens=capacity, **opts)
    ours = eng.inferlab_outcomes(simulate(reqs, m, check_invariants=True))
    bs = opts.get("block_size", 16)
    engine = eng.VllmEngine(capacity // bs, **opts)
    theirs = engine.run(reqs)
    return m, engine, ours, theirs


@pytest.mark.parametrize("name", sorted(CASES))
def test_vllm_case(name):
    reqs, opts, capacity = CASES[name]
    m, engine, ours, theirs = _compare(reqs, opts, capacity)
    assert eng.differences(theirs, ours) == []
    assert (engine.queries, engine.hits) == (m.kv.queries, m.kv.hits)
    assert engine.free_queue() == m.free_queue()  # the free queue, head to tail, at the end


def test_the_cases_exercise_their_rules():
    # the hand-made cases are not vacuous: preemption, hits and recompute happen where claimed
    runs = {n: eng.inferlab_outcomes(simulate(r, PagedManager(capacity_tokens=c, **o))) for n, (r, o, c) in CASES.items()}
    assert runs["last_token_recomputed"]["b"].cached_tokens == 16 and runs["two_blocks_hit"]["b"].cached_tokens == 32
    assert runs["eviction_tail_first"]["c"].cached_tokens == 32
    assert runs["decode_blocks_cached"]["t2"].cached_tokens == 48  # 20 + 28 of 30 reply tokens: 3 full blocks
    assert runs["preempt_newest"]["b"].preemptions >= 1 and runs["preempt_newest"]["b"].recomputed_tokens > 0
    assert runs["chunked_prefill"]["a"].first_token_s == 1 + 3  # chunks of 2047 (one decode rides along), 2048, 905


def test_vllm_mooncake_window_with_eviction_and_preemption():
    # 1,000 conversation requests (13.7 M prompt tokens) through 8,192 blocks of 16: every request
    # is admissible (none needs more than the pool), and the pool evicts and preempts.
    from inferlab.kv.traces import load_mooncake

    from _paths import CONVERSATION_TRACE
    reqs = load_mooncake(CONVERSATION_TRACE, limit=1000)
    m = PagedManager(capacity_tokens=131072)
    ours = eng.inferlab_outcomes(simulate(reqs, m, record_timeline=False))
    engine = eng.VllmEngine(131072 // 16)
    theirs = engine.run(reqs)
    diff = eng.differences(theirs, ours)
    assert diff == [], f"{len(diff)} differences, first {diff[:5]}"
    assert (engine.queries, engine.hits) == (m.kv.queries, m.kv.hits)
    assert sum(o.preemptions for o in theirs.values()) > 10 and engine.evictions > 1000
    assert sum(o.cached_tokens for o in theirs.values()) > 100_000

"""SGLang hand-worked cases; each expected figure is derived in a comment from SGLang's rules."""

import pytest

from inferlab.kv.radix import RadixManager, RadixTree
from inferlab.kv.tokens import runs_of_list
from inferlab.kv_managers import Request, simulate


def ids(start, n):
    return list(range(start, start + n))


def by_id(run):
    return {r.id: r for r in run.requests}


def test_identical_32_token_prompt_hits_31():
    # max_prefix_len = len(input) - 1 = 31, token-granular (page_size 1) -> 31.
    reqs = [Request("a", 0, ids(0, 32), 1), Request("b", 10, ids(0, 32), 1)]
    run = simulate(reqs, RadixManager(capacity_tokens=1024), check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 31


def test_page_size_16_floors_the_hit():
    # page_size 16: key truncated to pages: 16 * ((32 - 1) // 16) = 16, like vLLM.
    reqs = [Request("a", 0, ids(0, 32), 1), Request("b", 10, ids(0, 32), 1)]
    run = simulate(reqs, RadixManager(capacity_tokens=1024, page_size=16), check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 16


def test_partial_match_splits_the_edge():
    # a inserts one 40-token edge. b shares 20 tokens: match splits the edge at 20 and hits 20.
    # c = a's prompt again walks both halves: min(40, 40 - 1) = 39.
    reqs = [Request("a", 0, ids(0, 40), 1), Request("b", 10, ids(0, 20) + ids(900, 10), 1),
            Request("c", 20, ids(0, 40), 1)]
    m = RadixManager(capacity_tokens=1024)
    run = simulate(reqs, m, check_invariants=True)
    r = by_id(run)
    assert r["b"].cached_tokens == 20
    assert r["c"].cached_tokens == 39
    # c's match (39 tokens) splits [20..39] again at 19: root -> [0..19] -> {[900..909],
    # [20..38] -> [39]}
    (upper,) = m.tree.root.children.values()
    assert upper.length == 20 and sorted(c.length for c in upper.children.values()) == [10, 19]


def test_decoded_tokens_enter_the_tree_only_at_finish():
    # a: 20-token prompt, reply of 10 known tokens. The prompt is inserted after a's prefill
    # (step 1); the reply only when a finishes (input + output[:-1] = 29 tokens).
    # b arrives at 5 (a still decoding) with a's prompt + reply[:5] + 3 new: hits the prompt, 20.
    # c arrives after a finished with a's prompt + full reply + 3 new: hits 20 + 9 = 29.
    reply = ids(500, 10)
    a = Request("a", 0, ids(0, 20), 10, output=reply)
    b = Request("b", 5, ids(0, 20) + reply[:5] + ids(700, 3), 1)
    c = Request("c", 50, ids(0, 20) + reply + ids(800, 3), 1)
    run = simulate([a, b, c], RadixManager(capacity_tokens=1024), check_invariants=True)
    r = by_id(run)
    assert r["b"].cached_tokens == 20
    assert r["c"].cached_tokens == 29


def test_same_round_requests_do_not_share():
    # Both arrive at 0 and are admitted in the same prefill round; the tree is empty when both are
    # matched (insertion happens after the prefill), so both compute all 48 tokens.
    reqs = [Request("a", 0, ids(0, 48), 2), Request("b", 0, ids(0, 48), 2)]
    run = simulate(reqs, RadixManager(capacity_tokens=1024), check_invariants=True)
    assert [x.cached_tokens for x in run.requests] == [0, 0]


def test_lru_evicts_whole_least_recent_leaf():
    # capacity 100. a (30 tokens) then b (30 other tokens) finish: the tree holds both (input +
    # output[:-1] = 30 each). c resends a's prompt (hits 29) and touches a's path. d (45 new
    # tokens) needs 45 while 100 - 60 = 40 are free: the least recently used unlocked leaf is b's
    # -> b's whole 30-token node is freed although 5 tokens were short. f (a's prompt) then still
    # hits 29 and e (b's prompt) hits 0.
    reqs = [Request("a", 0, ids(0, 30), 1), Request("b", 5, ids(200, 30), 1), Request("c", 10, ids(0, 30), 1),
            Request("d", 15, ids(400, 45), 1), Request("f", 20, ids(0, 30), 1), Request("e", 25, ids(200, 30), 1)]
    m = RadixManager(capacity_tokens=100)
    run = simulate(reqs[:4], m, check_invariants=True)
    assert m.tree.total_tokens == 30 + 45  # b's node went whole
    run = simulate(reqs, RadixManager(capacity_tokens=100), check_invariants=True)
    r = by_id(run)
    assert r["c"].cached_tokens == 29
    assert r["f"].cached_tokens == 29
    assert r["e"].cached_tokens == 0


def test_retraction_takes_fewest_outputs_first():
    # capacity 1200. a: prompt 100, 1000 new tokens. b (prompt 100, 350 new) arrives at 400:
    # new_token_ratio has decayed to about 0.7 - 400 * (0.7 - 0.098) / 600 = 0.30, so a reserves
    # (1000 - 400) * 0.30 = 180 tokens and b's 100 + 350 fits in 1200 - 500 - 180. Both decode; at
    # about t = 700 a holds 800 and b 400 tokens: the pool is full and retract_decode removes the
    # request with the fewest output tokens, b. a is never retracted and both finish.
    reqs = [Request("a", 0, ids(0, 100), 1000), Request("b", 400, ids(3000, 100), 350)]
    run = simulate(reqs, RadixManager(capacity_tokens=1200))
    r = by_id(run)
    assert r["a"].preemptions == 0
    assert r["b"].preemptions >= 1
    assert r["b"].output_tokens == 350 and r["a"].output_tokens == 1000
    assert r["b"].queue_s == 0


def test_lpm_orders_by_longest_prefix():
    # The tree holds w's 40 tokens. x (no match) and y (matches 40) wait together while z runs
    # alone (max_running_requests=1): fcfs admits x first, lpm admits y first.
    def order(policy):
        reqs = [Request("w", 0, ids(0, 40), 1), Request("z", 5, ids(5000, 8), 30),
                Request("x", 6, ids(900, 40), 1), Request("y", 6, ids(0, 40) + ids(950, 5), 1)]
        run = simulate(reqs, RadixManager(capacity_tokens=1024, schedule_policy=policy,
                                          max_running_requests=1), check_invariants=True)
        r = by_id(run)
        return "x" if r["x"].finish_s < r["y"].finish_s else "y"
    assert order("fcfs") == "x"
    assert order("lpm") == "y"


def test_tree_insert_dedups():
    t = RadixTree()
    assert t.insert(runs_of_list(ids(0, 10)), 10)[0] == 0
    assert t.insert(runs_of_list(ids(0, 15)), 15)[0] == 10
    assert t.total_tokens == 15


def test_request_larger_than_the_pool_is_rejected_with_reason():
    run = simulate([Request("big", 0, ids(0, 300), 10)], RadixManager(capacity_tokens=256))
    assert "pool" in run.requests[0].rejected


def test_bad_options():
    from inferlab.errors import UnknownNameError
    with pytest.raises(UnknownNameError):
        RadixManager(capacity_tokens=256, schedule_policy="lpn")
    with pytest.raises(UnknownNameError):
        RadixManager(capacity_tokens=256, version="0.4")

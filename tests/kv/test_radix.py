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


# ------------------------------------------------------------------ issue 17: SGLang 0.5.23's rules

def _running(m, spec):
    """Put decoding requests straight into ``m``'s batch: spec = [(id, prompt, outputs)], each
    holding prompt + outputs - 1 private cells (nothing in the tree)."""
    from inferlab.kv.sglang import SglangRequest
    seqs = []
    for k, (rid, prompt, outputs) in enumerate(spec):
        s = SglangRequest(Request(rid, 0, ids(1000 * k, prompt), 100), k)
        s.last_node = m.tree.root
        s.num_output, s.num_computed = outputs, prompt + outputs - 1
        s.private = s.num_computed
        m.private_tokens += s.private
        m.running.append(s)
        seqs.append(s)
    return seqs


@pytest.mark.parametrize("version,retracted", [("0.5.2", ["r2"]), ("0.5.23", ["r2"])])
def test_retraction_stops_when_the_next_decode_fits_in_0_5_23(version, retracted):
    # 74 cells; r0 / r1 / r2 hold 10 + 20 - 1 = 29, 24 and 19 -> 72 used, 2 free < 3 for the
    # next decode step. Fewest outputs go first: r2 (frees 19 -> 21 free). Both versions stop:
    # the two left need 2 <= 21 (0.5.2's schedule_batch.py line 1428, retract_decode: `while
    # first_iter or not check_decode_mem(selected_indices=sorted_indices)`; the 20 steps of
    # retract_decode_steps enter only the new ratio). A 20-step rule (40 > 21) would retract r1.
    m = RadixManager(capacity_tokens=74, version=version)
    _running(m, [("r0", 10, 20), ("r1", 10, 15), ("r2", 10, 10)])
    m._retract()
    assert [s.req.id for s in m.waiting] == retracted
    assert [s.req.id for s in m.running] == [r for r in ("r0", "r1", "r2") if r not in retracted]
    m.check_invariants()


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_0_5_23_aborts_the_last_request_when_even_it_cannot_decode(version):
    # one request holding all 30 cells: nothing to retract, the next token has no cell ->
    # "Out of memory even after retracting all other requests": aborted, its cells freed.
    # (0.5.2's retract_decode breaks at one request and asserts available_size() > 0, line
    # 1446: it would stop there; the simulator aborts the request in both versions.)
    m = RadixManager(capacity_tokens=30, version=version)
    (s,) = _running(m, [("r0", 10, 21)])
    m._retract()
    assert m.running == [] and m.aborted == [s] and s.rejected and m.private_tokens == 0


@pytest.mark.parametrize("version,admitted", [("0.5.2", True), ("0.5.23", False)])
def test_admission_reserves_one_more_page_in_0_5_23(version, admitted):
    # 100 free cells, prompt 50, max_new 49: 0.5.2 needs 50 + 49 < 100 (fits); 0.5.23's
    # PrefillBudget needs 50 + 49 + page_size(1) < 100 (100 does not): the request can never
    # be admitted, so add() rejects it; with max_new 48 (99 < 100) it is served.
    run = simulate([Request("a", 0, ids(0, 50), 49), Request("b", 1, ids(500, 50), 48)],
                   RadixManager(capacity_tokens=100, version=version))
    r = by_id(run)
    assert (r["a"].rejected is None) == admitted and r["b"].rejected is None


@pytest.mark.parametrize("version,first", [("0.5.2", {"a": 1.0, "b": 2.0}), ("0.5.23", {"a": 1.0, "b": 1.0})])
def test_max_prefill_tokens_binds_only_without_chunking_in_0_5_23(version, first):
    # two 100-token prompts, max_prefill_tokens 150, chunked prefill on (2048). a is admitted
    # (150 - 100 = 50 left). 0.5.2 stops before b, whose extend 100 >= 50: b prefills in round 2.
    # 0.5.23 compares an extend with the input budget only when chunked prefill is off; b is
    # admitted while the budget is positive (50 > 0), then budget_state ends the round (-50).
    run = simulate([Request("a", 0, ids(0, 100), 3), Request("b", 0, ids(500, 100), 3)],
                   RadixManager(capacity_tokens=4096, max_prefill_tokens=150, version=version))
    assert {r.id: r.ttft_s for r in run.requests} == first


def test_0_5_23_reserves_a_resumed_requests_whole_max_new_tokens():
    # A request retracted after 60 of 100 tokens asks, on re-admission, for its remaining 40 in
    # the fit check but reserves its whole max_new_tokens (100) plus its page-ceiled extend and one
    # page; 0.5.2 reserves extend + the whole 100 too (schedule_policy.py line 543:
    # `_update_prefill_budget(prefix_len, input_tokens, min(req.sampling_params.max_new_tokens,
    # CLIP_MAX_NEW_TOKENS))`; reset_for_retract keeps sampling_params), without the page.
    from inferlab.kv.sglang import PrefillAdder, RadixCache, SglangRequest
    for v2, want in ((True, 70 + 1 + 100), (False, 70 + 100)):
        tree = RadixCache(1)
        s = SglangRequest(Request("r", 0, ids(0, 10), 100), 0)
        s.num_output = 60  # prompt 10 + 60 generated: 70 tokens to recompute, nothing cached
        adder = PrefillAdder(tree, lambda: 10_000, 1, max_prefill_tokens=16384, chunked_prefill_size=2048,
                             reserved=0.0, budget_v2=v2)
        assert adder.add_one_req(s, 0, tree.root) == ("added", 70)
        assert adder.offset == want


def test_lpm_sorts_requests_sharing_an_uncached_prefix_last():
    # Empty tree: every match is 0 <= 32, so each is checked against the waiting requests seen
    # before it: a (S + x) joins the scratch tree; b (S + y) shares |S| = 40 >= 32 with a -> sorted
    # last; c (unrelated) joins. lpm's order (longest match first, stable): a, c, then b.
    from inferlab.kv.sglang import RadixCache, SglangRequest, calc_priority
    S = ids(0, 40)
    reqs = [SglangRequest(Request(n, 0, p, 4), k) for k, (n, p) in
            enumerate((("a", S + ids(900, 5)), ("b", S + ids(950, 5)), ("c", ids(5000, 20))))]
    assert [s.req.id for s in calc_priority("lpm", reqs, RadixCache(1))] == ["a", "c", "b"]


def test_0_5_23_fcfs_refreshes_the_waiting_prefixes_every_32nd_round():
    # touch_waiting_prefixes walks the first 128 waiting requests' tokens (head last), so their
    # cached prefixes become the newest leaves: of two cached leaves X (older) and Y (newer), a
    # waiting request on X makes Y the one evicted first.
    from inferlab.kv.sglang import RadixCache, SglangRequest
    from inferlab.kv.sglang.schedule_policy import touch_waiting_prefixes
    tree = RadixCache(1)
    X, Y = ids(0, 30), ids(1000, 30)
    tree.insert(runs_of_list(X), 30)
    tree.insert(runs_of_list(Y), 30)
    waiting = [SglangRequest(Request("w", 0, X + ids(7000, 5), 4), 0)]
    touch_waiting_prefixes(waiting, tree)
    assert tree.evict(1) == 30 and tree.match_prefix(runs_of_list(X), 30)[0] == 30  # Y went, X stayed
    # the manager refreshes on its 1st, 33rd, 65th ... priority computation (fcfs, 0.5.23 only)
    m = RadixManager(capacity_tokens=1000, version="0.5.23")
    calls = []
    import inferlab.kv.sglang.scheduler as sched
    real = sched.touch_waiting_prefixes
    sched.touch_waiting_prefixes = lambda w, t: calls.append(m.priority_calls)
    try:
        simulate([Request(f"r{k}", k, ids(100 * k, 8), 1) for k in range(70)], m)
    finally:
        sched.touch_waiting_prefixes = real
    assert calls == [0, 32, 64]


def test_a_new_leaf_is_newer_than_the_edge_it_split():
    # insert splits an edge: the old lower half keeps the walk's access time, the new leaf is
    # strictly newer (SGLang stamps TreeNode() at creation), so evicting one leaf takes the
    # lower half, every run (before: a tie broken by set order).
    for _ in range(5):
        tree = RadixTree(1)
        tree.insert(runs_of_list(ids(0, 40)), 40)
        tree.insert(runs_of_list(ids(0, 20) + ids(500, 20)), 40)  # splits at 20: lower half 20..39, leaf 500..
        assert tree.evict(1) == 20
        assert tree.match_prefix(runs_of_list(ids(0, 20) + ids(500, 20)), 40)[0] == 40

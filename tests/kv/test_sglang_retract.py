"""SGLang's scheduler loop by hand: retraction (both versions: until the next decode step fits),
the new-token ratio, eviction for allocations (0.5.2 asks the tree for the whole allocation, 0.5.23 for the shortfall), the decode fast-forward, admission
limits and the hit-rate metric. Expected figures are derived in the comments from SGLang's code
(schedule_batch.retract_decode / release_req / check_decode_mem, scheduler_components/
new_token_ratio_tracker.py, mem_cache/allocator/base.evict_to_free_tokens) and
docs/engines/sglang.md, not copied from inferlab's output."""

import pytest

from inferlab.errors import InvalidValueError
from inferlab.kv.sglang import RadixManager, SglangRequest
from inferlab.kv.simulator import Request, StepStats, simulate
from inferlab.kv.time_model import TimeModel
from inferlab.kv.tokens import runs_of_list


def ids(start, n):
    return list(range(start, start + n))


def running(m, spec, out_len=100):
    """Decoding requests straight into ``m``'s batch: spec = [(id, prompt, outputs)], each holding
    prompt + outputs - 1 private cells (nothing of it in the tree)."""
    seqs = []
    for k, (rid, prompt, outputs) in enumerate(spec):
        s = SglangRequest(Request(rid, 0, ids(1000 * (k + 1), prompt), out_len), k)
        s.last_node = m.tree.root
        s.num_output, s.num_computed = outputs, prompt + outputs - 1
        s.private = s.num_computed
        m.private_tokens += s.private
        m.running.append(s)
        seqs.append(s)
    return seqs


def cache(m, *prompts):
    """Unlocked prompts in ``m``'s tree (oldest first)."""
    for p in prompts:
        m.tree.insert(runs_of_list(p), len(p))


# ------------------------------------------------------------------ retraction

@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_retraction_ties_on_outputs_take_the_longest_prompt_first(version):
    # retraction order: sort by (len(output_ids), -len(origin_input_ids)) descending, pop from the
    # end. All have 10 outputs; prompts 10, 30, 20 -> keys (10,-10) > (10,-20) > (10,-30): r1
    # (prompt 30, 39 cells) goes first. 88 cells, 19 + 39 + 29 = 87 used, 1 free < 3.
    # After r1: 40 free, and the next decode step of the two left needs 2 <= 40 -> stop (both
    # versions' retract_decode loop on `not check_decode_mem(selected_indices)`).
    m = RadixManager(capacity_tokens=88, version=version)
    running(m, [("r0", 10, 10), ("r1", 30, 10), ("r2", 20, 10)])
    m._retract()
    assert [s.req.id for s in m.waiting] == ["r1"]
    assert [s.req.id for s in m.running] == ["r0", "r2"]
    # new_token_ratio after a retraction: (decoded + 20 * remaining) / (sum max_new [+ 1 in 0.5.23])
    # = (10 + 10 + 40) / (200 + 1) in 0.5.23, / 200 in 0.5.2
    assert m.new_token_ratio == pytest.approx(60 / 201 if version == "0.5.23" else 60 / 200)
    m.check_invariants()


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_retraction_stops_when_the_next_decode_step_fits(version):
    # As above with 87 cells (0 free): after r1, 39 free >= 2 for the next step of the two
    # left -> stop, r2 stays (a 20-step rule would retract r2 too: 39 < 40). Both versions:
    # 0.5.2's schedule_batch.py line 1428 loops `while first_iter or not check_decode_mem(...)`.
    m = RadixManager(capacity_tokens=87, version=version)
    running(m, [("r0", 10, 10), ("r1", 30, 10), ("r2", 20, 10)])
    m._retract()
    assert [s.req.id for s in m.waiting] == ["r1"]


def test_the_retraction_ratio_is_capped_at_one():
    # one request left with 90 of 100 outputs: (90 + 20) / 101 > 1 -> 1.0
    m = RadixManager(capacity_tokens=200, version="0.5.23")
    running(m, [("r0", 10, 90), ("r1", 10, 1)])  # 99 + 10 = 109 cells
    m._retract()
    assert [s.req.id for s in m.running] == ["r0"] and m.new_token_ratio == 1.0


def test_0_5_23_evicts_the_20_step_shortfall_after_each_retraction():
    # release_req: `evict_from_tree_cache(tree, remaining * RETRACT_DECODE_STEPS)`, which evicts
    # num_tokens - available when short. The tree caches L (50 tokens, unlocked); r0/r1/r2 hold
    # 29 + 24 + 19 = 72; 124 cells -> 2 free. _retract: r2 (fewest outputs) goes -> 21 free;
    # 2 left want 40 > 21 -> evict 19 -> L goes whole: tree empty, 71 free. 0.5.2 evicts nothing
    # on a retraction; its check_decode_mem for the two left finds 21 >= 2 free: L stays.
    for version, tree_left in (("0.5.23", 0), ("0.5.2", 50)):
        m = RadixManager(capacity_tokens=124, version=version)
        cache(m, ids(50_000, 50))
        running(m, [("r0", 10, 20), ("r1", 10, 15), ("r2", 10, 10)])
        m._retract()
        assert [s.req.id for s in m.waiting] == ["r2"]
        assert m.tree.total_tokens == tree_left
        assert m.available() == 124 - 29 - 24 - tree_left
        m.check_invariants()


def test_0_5_2_rejects_a_resumed_request_that_can_never_be_readmitted():
    # 0.5.2's add_one_req: total_tokens = extend + min(max_new, 4096) >= rem_total_tokens ->
    # NO_TOKEN, with the whole max_new even after a retraction. 100 cells, empty pool: a resumed
    # request with prompt 10 and 35 of 60 outputs asks 45 + 60 = 105 >= 100 and can never be
    # admitted (SGLang 0.5.2 would wait forever): rejected. One with 29 outputs asks 39 + 60 =
    # 99 < 100: admitted, its 39 tokens prefilled. 0.5.23 asks for what is left (45 + 25 + 1).
    for version, rejected in (("0.5.2", ["a"]), ("0.5.23", [])):
        m = RadixManager(capacity_tokens=100, version=version)
        seqs = []
        for k, (rid, outputs) in enumerate((("a", 35), ("b", 29))):
            s = SglangRequest(Request(rid, 0, ids(1000 * (k + 1), 10), 60), k)
            assert m.add(s, 0.0) is None
            s.num_output, s.preemptions = outputs, 1
            seqs.append(s)
        m.waiting.rotate(-1)  # b first: a's rejection does not depend on its place in the queue
        st = m.step(0.0)
        assert [s.req.id for s in st.rejected] == rejected
        if version == "0.5.2":
            assert seqs[0].rejected and "wait forever" in seqs[0].rejected
            assert [s.req.id for s in m.running] == ["b"] and st.prefill_tokens == 39
        m.check_invariants()


def test_a_retracted_request_keeps_its_place_nothing_else():
    # release_req frees the request's own cells and unlocks its prefix; it is reset (nothing
    # computed) and appended to the back of the queue, its preemption counted.
    m = RadixManager(capacity_tokens=74)
    r0, r1, r2 = running(m, [("r0", 10, 20), ("r1", 10, 15), ("r2", 10, 10)])
    m.waiting.append(SglangRequest(Request("w", 0, ids(90_000, 5), 3), 9))
    m._retract()
    assert [s.req.id for s in m.waiting] == ["w", "r2"]
    assert (r2.num_computed, r2.private, r2.preemptions, r2.prefix_len) == (0, 0, 1, 0)
    assert m.private_tokens == 29 + 24 and m.batch_is_full is False


def test_decode_retracts_when_eviction_cannot_make_room():
    # _decode: 3 requests need 3 cells, 74 - 72 = 2 free, nothing to evict -> retract r2 (0.5.23
    # stops there) and decode the other two: r0 and r1 each get one cell (29 + 1, 24 + 1).
    m = RadixManager(capacity_tokens=74)
    r0, r1, r2 = running(m, [("r0", 10, 20), ("r1", 10, 15), ("r2", 10, 10)])
    st = m.step(0.0)
    assert st.decode_tokens == 2 and r2.preemptions == 1
    assert (r0.private, r1.private) == (30, 25) and (r0.num_output, r1.num_output) == (21, 16)
    m.check_invariants()


# ------------------------------------------------------------------ eviction for allocations

@pytest.mark.parametrize("version,tree_left", [("0.5.23", 4), ("0.5.2", 2)])
def test_decode_evicts_the_shortfall_in_0_5_23_the_whole_need_in_0_5_2(version, tree_left):
    # Three unlocked 2-token leaves A, B, C (A oldest); three decoding requests hold 29 + 24 +
    # 19 = 72 cells; 80 cells -> 2 free, the step needs 3. 0.5.23 evicts 3 - 2 = 1: A (2 tokens,
    # whole node). 0.5.2's _evict_tree_cache_if_needed evicts the full 3: A and B (4).
    m = RadixManager(capacity_tokens=80, version=version)
    cache(m, [70_000, 70_001], [71_000, 71_001], [72_000, 72_001])
    running(m, [("r0", 10, 20), ("r1", 10, 15), ("r2", 10, 10)])
    st = m.step(0.0)
    assert st.decode_tokens == 3 and m.tree.total_tokens == tree_left
    m.check_invariants()


@pytest.mark.parametrize("version,tree_left", [("0.5.23", 4 + 5), ("0.5.2", 5)])
def test_prefill_allocation_evicts_the_shortfall_in_0_5_23(version, tree_left):
    # alloc_token_slots: 10 cells, leaves A, B, C (2 each) cached -> 4 free. A 5-token prompt
    # (max_new 1) is admitted (5 + 1 [+ 1] < 4 + 6 evictable) and allocates 5: 0.5.23 evicts
    # 5 - 4 = 1 -> A; 0.5.2 evicts 5 -> A, B, C. It finishes at prefill and its 5 tokens enter
    # the tree: 4 + 5 left in 0.5.23, 0 + 5 in 0.5.2.
    m = RadixManager(capacity_tokens=10, version=version)
    cache(m, [70_000, 70_001], [71_000, 71_001], [72_000, 72_001])
    run = simulate([Request("a", 0, ids(0, 5), 1)], m, check_invariants=True)
    assert run.requests[0].rejected is None and m.tree.total_tokens == tree_left


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_an_allocation_that_fits_the_free_cells_evicts_nothing(version):
    # `if available_size() < num_tokens: evict(...)`: 11 cells, a cached 3-token leaf, 8 free;
    # an 8-token prompt (max_new 1: 8 + 1 [+ 1] < 11) allocates exactly the 8 free cells, so
    # the leaf stays; the prompt then enters the tree beside it: 3 + 8.
    m = RadixManager(capacity_tokens=11, version=version)
    cache(m, [70_000, 70_001, 70_002])
    run = simulate([Request("a", 0, ids(0, 8), 1)], m, check_invariants=True)
    assert run.requests[0].rejected is None and m.tree.total_tokens == 11


# ------------------------------------------------------------------ the new-token ratio

@pytest.mark.parametrize("conservativeness,init", [(1.0, 0.7), (0.5, 0.35), (2.0, 1.0)])
def test_new_token_ratio_init_min_and_decay(conservativeness, init):
    # init = min(0.7 * conservativeness, 1); min = init * 0.14; decay = (init - min) / 600 per
    # decode step without retraction.
    m = RadixManager(capacity_tokens=10_000, schedule_conservativeness=conservativeness)
    lo = init * 0.14
    assert (m.init_ratio, m.min_ratio) == (pytest.approx(init), pytest.approx(lo))
    assert m.ratio_decay == pytest.approx((init - lo) / 600)
    running(m, [("r0", 10, 3), ("r1", 10, 3)])
    m.step(0.0)
    assert m.new_token_ratio == pytest.approx(init - (init - lo) / 600)
    m.fast_forward(10)  # ten more decode steps at once
    assert m.new_token_ratio == pytest.approx(init - 11 * (init - lo) / 600)
    m.fast_forward(95)  # never below the minimum: 11 + 95 + ... steps
    m.fast_forward(600)
    assert m.new_token_ratio == pytest.approx(lo)


def test_the_ratio_resets_when_the_server_goes_idle():
    # decayed while a decodes; when the last request finishes with nothing waiting -> init (0.7)
    m = RadixManager(capacity_tokens=1000)
    (a,) = running(m, [("a", 10, 98)])  # 2 tokens left
    m.step(0.0)
    assert m.new_token_ratio == pytest.approx(0.7 - 0.602 / 600)
    st = m.step(1.0)
    assert st.finished == [a] and m.new_token_ratio == 0.7


def test_a_retraction_lowers_what_running_requests_reserve():
    # The reservation a prefill round sees: sum(min(max_new - out, 4096)) * ratio. Two running
    # (100 max_new, 10 and 20 out): (90 + 80) * 0.7 = 119 before anything decays.
    from inferlab.kv.sglang.schedule_policy import reserved_by_running
    m = RadixManager(capacity_tokens=10_000)
    running(m, [("r0", 10, 10), ("r1", 10, 20)])
    assert reserved_by_running(m.running, m.new_token_ratio) == pytest.approx(119.0)


# ------------------------------------------------------------------ decode fast-forward

def test_decode_horizon_counts_the_steps_nothing_happens():
    # Two running: r0 (prompt 10, 3 out -> 12 computed), r1 (20, 5 -> 24), max_new 100. Nobody
    # finishes for min(97, 95) - 1 = 94 steps; 1000 - 36 = 964 free cells last 964 // 2 = 482
    # steps; the first step attends to 13 + 25 = 38 tokens.
    m = RadixManager(capacity_tokens=1000)
    running(m, [("r0", 10, 3), ("r1", 20, 5)])
    assert m.decode_horizon() == (94, 2, 38)
    # 40 cells: 4 free -> 2 steps; 39: 3 free -> 1 step, not worth a shortcut
    m = RadixManager(capacity_tokens=40)
    running(m, [("r0", 10, 3), ("r1", 20, 5)])
    assert m.decode_horizon() == (2, 2, 38)
    m = RadixManager(capacity_tokens=39)
    running(m, [("r0", 10, 3), ("r1", 20, 5)])
    assert m.decode_horizon() is None


def test_decode_horizon_is_none_when_a_round_could_differ():
    m = RadixManager(capacity_tokens=1000)
    assert m.decode_horizon() is None  # nothing running
    running(m, [("r0", 10, 97)])  # 3 left: finishes in 3 steps -> 3 - 1 = 2 safe steps
    assert m.decode_horizon() == (2, 1, 107)
    m.running[0].num_output = 98  # 2 left -> 1 step: none
    assert m.decode_horizon() is None
    m.running[0].num_output = 97
    m.waiting.append(SglangRequest(Request("w", 0, ids(90_000, 5), 3), 9))
    assert m.decode_horizon() is None  # a prefill round would be tried first
    m.batch_is_full = True
    assert m.decode_horizon() == (2, 1, 107)  # ... unless the batch is full
    m = RadixManager(capacity_tokens=1000, page_size=16)
    running(m, [("r0", 10, 3)])
    assert m.decode_horizon() is None  # pages: not modelled by the shortcut


def test_fast_forward_applies_k_decode_steps():
    m = RadixManager(capacity_tokens=1000)
    r0, r1 = running(m, [("r0", 10, 3), ("r1", 20, 5)])
    m.fast_forward(7)
    assert (r0.num_computed, r0.num_output, r0.private) == (19, 10, 19)
    assert (r1.num_computed, r1.num_output, r1.private) == (31, 12, 31)
    assert m.private_tokens == 50 and m.available() == 950
    m.check_invariants()


def test_fast_forward_prices_each_step_at_its_context():
    # A step costs p / 10 + (1.0 if decoding) + 0.01 * context tokens. One request, prompt 10,
    # 4 new tokens: prefill 10 tokens at context 10: 1.0 + 0.1 = 1.1 (first token). Decodes at
    # context 11, 12, 13: 1.11 + 1.12 + 1.13 (the first two fast-forwarded: 4 - 1 - 1 = 2 safe
    # steps). Finish at 1.1 + 1.11 + 1.12 + 1.13 = 4.46; stepping one by one gives the same.
    tm = TimeModel.linear(prefill_tok_per_s=10, decode_step_s=1.0, per_context_token_s=0.01)
    for ff in (True, False):
        run = simulate([Request("a", 0, ids(0, 10), 4)], RadixManager(capacity_tokens=1000), tm, fast_forward=ff)
        (r,) = run.requests
        assert r.ttft_s == pytest.approx(1.1) and r.finish_s == pytest.approx(4.46)


def test_prefill_rounds_come_first_and_decodes_wait():
    # a (prompt 10, 5 new) at 0; b (prompt 10, 2 new) at 2. Steps of 1.0: t0 prefill a (first
    # token at 1), t1 decode a (2nd), t2 b arrives: the round is a prefill round, a waits; t3, t4,
    # t5 decode both: a's 3rd, 4th, 5th -> finish 6 (5 without the stall); b's 2nd at 4.
    run = simulate([Request("a", 0, ids(0, 10), 5), Request("b", 2, ids(100, 10), 2)],
                   RadixManager(capacity_tokens=1000), check_invariants=True)
    r = {x.id: x for x in run.requests}
    assert (r["a"].ttft_s, r["a"].finish_s) == (1.0, 6.0)
    assert (r["b"].ttft_s, r["b"].finish_s) == (3.0 - 2, 4.0)  # b's first token at 3


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_a_long_prompt_is_chunked_and_one_chunked_request_at_a_time(version):
    # chunked_prefill_size 2048: a (5000 tokens) takes 2048 in round 1 (it becomes the chunked
    # request: the round ends), 2048 in round 2 (the chunk budget is spent: b, 10 tokens, waits),
    # 904 in round 3, where b (10 <= 2048 - 904) joins. Both sample their first token at 3.
    run = simulate([Request("a", 0, ids(0, 5000), 2), Request("b", 0, ids(9000, 10), 2)],
                   RadixManager(capacity_tokens=20_000, version=version), check_invariants=True)
    r = {x.id: x for x in run.requests}
    assert r["a"].ttft_s == 3.0 and r["b"].ttft_s == 3.0
    assert run.summary["steps"] == 4


# ------------------------------------------------------------------ admission limits, metrics

@pytest.mark.parametrize("version,page,capacity,fits", [
    ("0.5.23", 1, 5009, True), ("0.5.23", 1, 5008, False),  # 10 + 5000 - 1 = 5009 cells at the last token
    ("0.5.23", 16, 5024, True), ("0.5.23", 16, 5023, False),  # whole pages: ceil(5009 / 16) * 16 = 5024
    ("0.5.2", 1, 5009, True), ("0.5.2", 1, 5008, False)])
def test_a_request_whose_last_token_cannot_fit_is_rejected(version, page, capacity, fits):
    # prompt 10, max_new 5000: the admission check (10 + min(5000, 4096) [+ page] < capacity)
    # passes at these sizes; what binds is the KV at the last sampled token, prompt + 4999.
    m = RadixManager(capacity_tokens=capacity, page_size=page, version=version)
    s = SglangRequest(Request("r", 0, ids(0, 10), 5000), 0)
    assert (m.add(s, 0.0) is None) == fits


@pytest.mark.parametrize("capacity,default", [(100, 50), (8190, 4095), (8192, 4096), (100_000, 4096), (1, 1)])
def test_max_running_requests_default(capacity, default):
    # min(capacity // 2, 4096), at least 1
    assert RadixManager(capacity_tokens=capacity).max_running_requests == default
    assert RadixManager(capacity_tokens=capacity, max_running_requests=7).max_running_requests == 7


def test_config_and_bad_options():
    m = RadixManager(capacity_tokens=1000, chunked_prefill_size=-1, page_size=16)
    assert m.chunked_prefill_size is None and m.config()["chunked_prefill_size"] == -1
    assert RadixManager(capacity_tokens=1000, chunked_prefill_size=16, page_size=16).chunked_prefill_size == 16
    for bad in (dict(page_size=0), dict(page_size=True), dict(max_prefill_tokens=0),
                dict(chunked_prefill_size=15, page_size=16), dict(chunked_prefill_size=0),
                dict(schedule_conservativeness=0.0)):
        with pytest.raises(InvalidValueError):
            RadixManager(capacity_tokens=1000, **bad)
    assert RadixManager(capacity_tokens=1000, max_prefill_tokens=1).max_prefill_tokens == 1


def test_cache_hit_rate_is_hits_over_hits_plus_computed():
    # cache_hit_rate = log_hit_tokens / (log_input_tokens + log_hit_tokens). a (20 tokens)
    # computes 20; b (the same prompt, later) hits min(20, 20 - 1) = 19 and computes 1:
    # 19 / (19 + 21) = 0.475. Before any prefill: None.
    m = RadixManager(capacity_tokens=1000)
    assert m.hit_rate() is None
    run = simulate([Request("a", 0, ids(0, 20), 1), Request("b", 5, ids(0, 20), 1)], m)
    assert run.summary["hit_rate"] == pytest.approx(0.475)
    assert (m.log_hit_tokens, m.log_input_tokens) == (19, 21)


def test_page_aligned_prompt_enters_the_tree_after_prefill():
    # page 16, a 40-token prompt: cache_unfinished_req inserts 32 (whole pages); the request
    # holds ceil(40 / 16) * 16 - 32 = 16 private cells (its third, partial page).
    # A cached 20-token prompt beside it keeps its whole page: 16 evictable cells. In use: the
    # tree's 48 - 16 evictable + 16 private = 48; cached: 16.
    m = RadixManager(capacity_tokens=1000, page_size=16)
    cache(m, ids(50_000, 20))
    s = SglangRequest(Request("a", 0, ids(0, 40), 5), 0)
    assert m.add(s, 0.0) is None
    st = m.step(0.0)
    assert isinstance(st, StepStats) and st.prefill_tokens == 40
    assert m.tree.total_tokens == 16 + 32 and s.private == 16 and s.prefix_len == 32
    assert m.kv_used_tokens() == 48 and m.kv_cached_tokens() == 16 and m.num_running == 1
    m.check_invariants()


def test_an_empty_batch_reserves_nothing_even_at_ratio_one():
    # schedule_conservativeness 2 -> new_token_ratio = min(0.7 * 2, 1) = 1.0. With nothing
    # running the reservation is 0 (not 1 x the ratio): a 50-token prompt with max_new 48 fits
    # 100 cells at the boundary (50 + 48 + 1 = 99 < 100 - 0) and prefills in the first step.
    m = RadixManager(capacity_tokens=100, schedule_conservativeness=2.0)
    assert m.new_token_ratio == 1.0
    run = simulate([Request("a", 0, ids(0, 50), 48)], m)
    (r,) = run.requests
    assert r.rejected is None and r.ttft_s == 1.0 and r.output_tokens == 48


# ------------------------------------------------------------------ more of the loop

def test_disabled_radix_cache_shares_nothing_and_orders_fcfs():
    # --disable-radix-cache (ChunkCache): no prefix match, nothing enters a tree, and a
    # cache-aware policy falls back to FCFS (_validate_and_adjust_policy). a then b with the same
    # 20-token prompt: b hits 0; the hit rate is 0 / (0 + 40) = 0.0.
    m = RadixManager(capacity_tokens=1000, disable_radix_cache=True)
    run = simulate([Request("a", 0, ids(0, 20), 3), Request("b", 10, ids(0, 20), 3)], m, check_invariants=True)
    assert [r.cached_tokens for r in run.requests] == [0, 0]
    assert m.tree.total_tokens == 0 and run.summary["hit_rate"] == 0.0
    # lpm without a cache: x (waiting first) before y, although y would match w's 40 tokens
    reqs = [Request("w", 0, ids(0, 40), 1), Request("z", 5, ids(5000, 8), 30),
            Request("x", 6, ids(900, 40), 1), Request("y", 6, ids(0, 40) + ids(950, 5), 1)]
    run = simulate(reqs, RadixManager(capacity_tokens=1024, schedule_policy="lpm", max_running_requests=1,
                                      disable_radix_cache=True), check_invariants=True)
    r = {x.id: x for x in run.requests}
    assert r["x"].finish_s < r["y"].finish_s and r["y"].cached_tokens == 0


def test_the_aborted_last_request_is_reported_as_rejected_by_the_step():
    # One request holding all 30 cells cannot decode its next token: the step aborts it (0.5.23)
    # and returns it among the rejected; nothing decodes.
    m = RadixManager(capacity_tokens=30)
    (s,) = running(m, [("r0", 10, 21)])
    st = m.step(0.0)
    assert st.rejected == [s] and st.decode_tokens == 0 and m.running == [] and m.private_tokens == 0


def test_peak_concurrency_counts_a_prefill_batch():
    # a and b (max_new 1) are prefilled together and finish at prefill: the only step runs 2.
    run = simulate([Request("a", 0, ids(0, 10), 1), Request("b", 0, ids(100, 10), 1)], RadixManager(capacity_tokens=1000))
    assert run.summary["peak_concurrency"] == 2 and run.summary["steps"] == 1


@pytest.mark.parametrize("page", [1, 16])
def test_decode_context_is_priced_on_both_decode_paths(page):
    # as test_fast_forward_prices_each_step_at_its_context, plus 0.5 per decoding sequence; page
    # 16 takes the per-request decode loop (no fast-forward). Prefill: 10 / 10 + 0.01 * 10 = 1.1;
    # decodes at contexts 11, 12, 13: 1.0 + 0.5 + 0.11 = 1.61, 1.62, 1.63 -> 1.1 + 4.86 = 5.96.
    tm = TimeModel.linear(prefill_tok_per_s=10, decode_step_s=1.0, per_seq_s=0.5, per_context_token_s=0.01)
    run = simulate([Request("a", 0, ids(0, 10), 4)], RadixManager(capacity_tokens=1000, page_size=page), tm,
                   check_invariants=True)
    assert run.requests[0].finish_s == pytest.approx(5.96)
    assert run.summary["output_tokens"] == 4


def test_check_drained_finds_what_was_left_behind():
    from inferlab.kv.simulator import InvariantError
    m = RadixManager(capacity_tokens=1000)
    m.check_drained()  # empty
    running(m, [("r0", 10, 3)])
    with pytest.raises(InvariantError):
        m.check_drained()  # a request still running (and its 12 private cells)
    m = RadixManager(capacity_tokens=1000)
    m.waiting.append(SglangRequest(Request("w", 0, ids(0, 5), 3), 0))
    with pytest.raises(InvariantError):
        m.check_drained()
    m = RadixManager(capacity_tokens=1000)
    cache(m, ids(0, 10))
    _, node = m.tree.match_prefix(runs_of_list(ids(0, 10)), 10)
    m.tree.inc_lock(node)  # a lock nobody holds
    with pytest.raises(InvariantError):
        m.check_drained()


def test_rejection_names_the_pool_and_the_cells_needed():
    # prompt 300, max_new 10, pool 256: cells at the last token 300 + 9 = 309; the admission
    # check needs 300 + 10 + 1 (page) < pool, i.e. 312 cells: it names the larger, 312.
    m = RadixManager(capacity_tokens=256)
    why = m.add(SglangRequest(Request("big", 0, ids(0, 300), 10), 0), 0.0)
    assert why == "prompt of 300 + 10 new tokens cannot fit the token pool of 256 (needs 312)"
    with pytest.raises(InvalidValueError):
        from inferlab.kv.simulator import Seq
        m.add(Seq(Request("plain", 0, ids(0, 5), 1), 1), 0.0)


def test_0_5_23_a_full_request_pool_skips_the_priority_computation():
    # `get_num_allocatable_reqs(running_bs) <= 0 and not chunked_req` -> batch full, return before
    # calc_priority: with max_running_requests 1 and one request running, the step decodes and the
    # fcfs refresh counter does not move.
    m = RadixManager(capacity_tokens=1000, max_running_requests=1)
    running(m, [("r0", 10, 3)])
    m.waiting.append(SglangRequest(Request("w", 0, ids(90_000, 5), 3), 9))
    st = m.step(0.0)
    assert st.decode_tokens == 1 and m.priority_calls == 0 and m.batch_is_full


def test_0_5_2_has_no_waiting_prefix_refresh():
    # 0.5.2's calc_priority returns at once for FCFS; only 0.5.23 counts (and refreshes) its calls.
    reqs = [Request(f"r{k}", k, ids(100 * k, 8), 2) for k in range(5)]
    m2, m23 = RadixManager(capacity_tokens=1000, version="0.5.2"), RadixManager(capacity_tokens=1000)
    simulate(reqs, m2)
    simulate(reqs, m23)
    assert m2.priority_calls == 0 and m23.priority_calls == 5  # one prefill round per arrival


def test_a_lone_chunked_request_keeps_the_loop_going():
    # A 5000-token prompt alone: after its first chunk nothing is running or waiting, but the
    # chunked request counts as running (num_running), so the loop goes on: chunks of 2048, 2048,
    # 904, first token after the third step, the second token in the fourth.
    m = RadixManager(capacity_tokens=20_000)
    run = simulate([Request("a", 0, ids(0, 5000), 2)], m, check_invariants=True)
    assert run.requests[0].ttft_s == 3.0 and run.requests[0].finish_s == 4.0


def test_default_budgets():
    # max_prefill_tokens 16384 (SGLang's default), chunked_prefill_size 2048 (SGLang's pick for a
    # GPU under 35 GB), page_size 1, fcfs, 0.5.23
    cfg = RadixManager(capacity_tokens=100_000).config()
    assert (cfg["max_prefill_tokens"], cfg["chunked_prefill_size"], cfg["page_size"]) == (16384, 2048, 1)
    assert (cfg["schedule_policy"], cfg["version"], cfg["disable_radix_cache"]) == ("fcfs", "0.5.23", False)


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_a_decode_step_that_exactly_fits_evicts_and_retracts_nothing(version):
    # 3 running hold 29 + 24 + 19 = 72 of 78 cells, a 3-token leaf is cached: 3 free for 3 new
    # tokens -> `available < need` is false: no eviction (0.5.2 would evict the whole need
    # otherwise) and no retraction; all three decode.
    m = RadixManager(capacity_tokens=78, version=version)
    cache(m, [70_000, 70_001, 70_002])
    running(m, [("r0", 10, 20), ("r1", 10, 15), ("r2", 10, 10)])
    st = m.step(0.0)
    assert st.decode_tokens == 3 and not m.waiting and m.tree.total_tokens == 3


def test_0_5_23_retraction_stops_when_the_freed_cells_exactly_fit():
    # r0 (prompt 10, 10 out: 19 cells), r1 (10, 12: 21), r2 (1, 2: 2) fill 42 cells. The step
    # needs 3: retract r2 (fewest outputs) -> 2 free for the 2 left: 2 >= 2 fits, stop.
    m = RadixManager(capacity_tokens=42)
    running(m, [("r0", 10, 10), ("r1", 10, 12), ("r2", 1, 2)])
    m._retract()
    assert [s.req.id for s in m.waiting] == ["r2"] and m.available() == 2


@pytest.mark.parametrize("page,free,gone", [(2, 0, ["r2", "r1"]), (2, 4, ["r2"]), (16, 14, ["r2", "r1"]),
                                            (16, 32, ["r2"])])
def test_paged_decode_needs_a_page_per_request_at_a_page_boundary(page, free, gone):
    # new_tokens_required_next_decode: one page for each request whose KV fills whole pages.
    # r0 and r1: prompt p, p + 1 outputs -> 2p computed (a boundary), 2p cells; r2: prompt p,
    # 1 output -> p computed (a boundary), p cells; 5p used + `free`. The step needs 3p > free
    # -> retract r2 (fewest outputs): free + p left for the 2p the other two need. p = 2, 0 free:
    # 2 < 4 -> r1 too; 4 free: 6 >= 4 stop. p = 16, 14 free: 30 < 32 -> r1 too; 32 free: 48 >= 32.
    m = RadixManager(capacity_tokens=5 * page + free, page_size=page)
    running(m, [("r0", page, page + 1), ("r1", page, page + 1), ("r2", page, 1)])
    st = m.step(0.0)
    assert [s.req.id for s in m.waiting] == gone
    assert st.decode_tokens == 3 - len(gone)
    m.check_invariants()


def test_the_finished_request_caches_whole_pages_of_what_it_computed():
    # cache_finished_req inserts input + output[:-1] page-aligned: page 16, prompt 20, 28 new
    # tokens -> 20 + 27 = 47 computed -> 32 cells enter the tree (the prompt's first page went in
    # after prefill; the second now); the 48th token, never computed, does not.
    m = RadixManager(capacity_tokens=1000, page_size=16)
    simulate([Request("a", 0, ids(0, 20), 28)], m, check_invariants=True)
    assert m.tree.total_tokens == 32


def test_0_5_23_check_decode_mem_after_a_retraction_evicts_only_the_shortfall():
    # page 32, 236 cells. The tree holds X -> Y (32 + 32; Z, X's other child, was evicted), both
    # locked by r1 (prompt X + Y, 1 output: 64 computed, all in the tree). r0 and r0b hold 64
    # private cells each (prompt 32, 33 outputs: 64 computed). 44 free. All three sit at a page
    # boundary: the step needs 96 > 44, nothing is evictable -> retract r1 (fewest outputs): X, Y
    # unlocked, nothing freed; release_req wants 2 * 20 = 40 <= 44 free: no eviction;
    # check_decode_mem for the two left needs 64 > 44 -> evict the shortfall 20: the leaf Y (32)
    # goes, X stays (evicting the whole 64 would take X too); they decode into 76 free.
    m = RadixManager(capacity_tokens=236, page_size=32)
    X, Y, Z = ids(50_000, 32), ids(60_000, 32), ids(70_000, 32)
    cache(m, X + Z, X + Y)
    assert m.tree.evict(1) == 32  # Z, the older leaf
    running(m, [("r0", 32, 33), ("r0b", 32, 33)])
    r1 = SglangRequest(Request("r1", 0, X + Y, 100), 2)
    r1.prefix_len, node = m.tree.match_prefix(runs_of_list(X + Y), 64)
    m.tree.inc_lock(node)
    r1.last_node, r1.num_output, r1.num_computed = node, 1, 64
    m.running.append(r1)
    m.check_invariants()
    assert m.available() == 44 and m.tree.evictable_tokens == 0
    st = m.step(0.0)
    assert [s.req.id for s in m.waiting] == ["r1"] and st.decode_tokens == 2
    assert m.tree.total_tokens == 32 and m.tree.match_prefix(runs_of_list(X + Y), 64)[0] == 32
    m.check_invariants()


def test_0_5_23_release_evicts_only_the_20_step_shortfall():
    # release_req: evict_from_tree_cache(remaining * 20), i.e. 20-step demand minus what is free.
    # The tree holds X -> Y (30 + 30), locked by r2 (prompt X + Y, 11 outputs: 70 computed, 10
    # of them private). r0 / r1 hold 29 / 24 private cells; 125 cells -> 2 free < 3 needed,
    # nothing evictable -> retract r2: 12 free, X and Y unlocked; the 2 left want 40 -> evict
    # 28: the leaf Y (30) suffices, X stays (evicting all 40 or 40 + 12 would take X too).
    m = RadixManager(capacity_tokens=125)
    X, Y, Z = ids(50_000, 30), ids(60_000, 30), ids(70_000, 30)
    cache(m, X + Z, X + Y)
    assert m.tree.evict(1) == 30  # Z
    running(m, [("r0", 10, 20), ("r1", 10, 15)])
    r2 = SglangRequest(Request("r2", 0, X + Y, 100), 2)
    r2.prefix_len, node = m.tree.match_prefix(runs_of_list(X + Y), 60)
    m.tree.inc_lock(node)
    r2.last_node, r2.num_output, r2.num_computed, r2.private = node, 11, 70, 10
    m.private_tokens += 10
    m.running.append(r2)
    m.check_invariants()
    assert m.available() == 2 and m.tree.evictable_tokens == 0
    st = m.step(0.0)
    assert [s.req.id for s in m.waiting] == ["r2"] and st.decode_tokens == 2
    assert m.tree.total_tokens == 30 and m.tree.match_prefix(runs_of_list(X + Y), 60)[0] == 30
    m.check_invariants()

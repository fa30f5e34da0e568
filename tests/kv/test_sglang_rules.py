"""SGLang 0.5.23's (and 0.5.2's) scheduling rules, one rule per test, at the boundary where the
rule turns: the waiting-queue order (``SchedulePolicy.calc_priority``, in-batch prefix
deprioritisation, the fcfs waiting-prefix refresh), the running requests' reservation and the
``PrefillAdder``'s budgets (``add_one_req``, ``add_chunked_req``, ``budget_state``), and the
radix tree's eviction. Every expected figure is worked out by hand in the comment above it,
from SGLang's code (sglang/srt/managers/schedule_policy.py, mem_cache/radix_cache.py,
mem_cache/common.py; docs/engines/sglang.md), not copied from inferlab's output."""

import pytest

from inferlab.kv.sglang import PrefillAdder, RadixCache, SglangRequest, calc_priority
from inferlab.kv.sglang.schedule_policy import (ADDED, ADDED_CHUNKED, NO_TOKEN, OTHER, reserved_by_running,
                                                touch_waiting_prefixes)
from inferlab.kv.simulator import Request
from inferlab.kv.tokens import runs_of_list


def ids(start, n):
    return list(range(start, start + n))


def req(name, prompt, max_new=4, k=0, tree=None):
    s = SglangRequest(Request(name, 0, prompt, max_new), k)
    if tree is not None:
        s.last_node = tree.root
    return s


def names(seqs):
    return [s.req.id for s in seqs]


def tree_of(*prompts, page_size=1):
    t = RadixCache(page_size)
    for p in prompts:
        t.insert(runs_of_list(p), len(p))
    return t


# ------------------------------------------------------------------ lpm and in-batch prefix caching

def test_lpm_checks_a_request_whose_tree_match_is_exactly_32():
    # SGLang: `if r.prefix_len <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD (32)` -> matched against
    # the scratch tree of the waiting requests. The tree holds P (32 tokens). a = P + x..., b =
    # P + x[:5] + y...: both match 32 <= 32, so both are checked. a joins the scratch tree; b
    # shares 32 + 5 = 37 >= 32 with a -> deprioritised. c (unrelated) matches 0 and joins.
    # Sort keys: a -min(32, 44) = -32, c 0, b inf -> a, c, b. (Were a match of 32 not checked,
    # b would keep -32 and sort second: a, b, c.)
    P = ids(0, 32)
    tree = tree_of(P)
    waiting = [req("a", P + ids(900, 12)), req("b", P + ids(900, 5) + ids(950, 7)), req("c", ids(5000, 40))]
    assert names(calc_priority("lpm", waiting, tree)) == ["a", "c", "b"]


def test_lpm_does_not_check_a_request_whose_tree_match_is_33():
    # The tree holds P + [v] (33 tokens). a = P + [u] + ... matches 32 (the edge splits there):
    # checked, joins the scratch tree. b = P + [v] + ... matches 33 > 32: not checked, although it
    # shares 32 tokens with a. Keys: b -33, a -32 -> b, a. (A threshold of 33 would check b:
    # scratch match 32 >= 32 -> b last: a, b.)
    P = ids(0, 32)
    tree = tree_of(P + [7000])
    waiting = [req("a", P + [8000] + ids(900, 10)), req("b", P + [7000] + ids(950, 10))]
    assert names(calc_priority("lpm", waiting, tree)) == ["b", "a"]


@pytest.mark.parametrize("shared,late", [(32, True), (31, False)])
def test_lpm_deprioritises_at_32_shared_tokens_not_31(shared, late):
    # Empty tree: every match is 0. a = S + x joins the scratch tree; b = S + y shares |S| with
    # a: `>= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD (32)` -> sorted last at 32, kept at
    # 31 (and b joins the scratch tree). c is unrelated (shares 0). Keys all -0 unless late:
    # late -> a, c, b; kept -> a, b, c (stable sort).
    S = ids(0, shared)
    waiting = [req("a", S + ids(900, 10)), req("b", S + ids(950, 10)), req("c", ids(5000, 40))]
    assert names(calc_priority("lpm", waiting, RadixCache(1))) == (["a", "c", "b"] if late else ["a", "b", "c"])


def test_lpm_sort_key_is_capped_at_num_tokens_minus_one():
    # num_matched_prefix_tokens = min(match, len(input) - 1) (`_compute_max_prefix_len`). The
    # tree holds A (10 tokens) and B's first 9 of 20. Queue: c (50 tokens, match 0), b (match 9,
    # key min(9, 19) = 9), a (A itself, match 10, key min(10, 9) = 9). Sorted by -key, stable:
    # b (-9), a (-9), c (0). An uncapped key would put a (10) before b.
    A, B = ids(0, 10), ids(100, 20)
    tree = tree_of(A, B[:9])
    waiting = [req("c", ids(5000, 50)), req("b", B), req("a", A)]
    assert names(calc_priority("lpm", waiting, tree)) == ["b", "a", "c"]
    # a first: keys 9 and 9, the stable sort keeps a before b (a cap of len - 2 would not: 8 < 9)
    waiting = [req("c", ids(5000, 50)), req("a", A), req("b", B)]
    assert names(calc_priority("lpm", waiting, tree)) == ["a", "b", "c"]


@pytest.mark.parametrize("n,sorted_", [(128, True), (129, False)])
def test_lpm_falls_back_to_fcfs_above_128_waiting(n, sorted_):
    # `_determine_active_policy`: lpm with len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX (128) is
    # FCFS. The tree holds L (20 tokens); the last waiting request is L + more (match 20), the
    # others match nothing. With 128 waiting lpm puts the last one first; with 129 the queue is
    # returned as it is.
    L = ids(0, 20)
    tree = tree_of(L)
    waiting = [req(f"r{k}", ids(1000 * (k + 1), 8), k=k) for k in range(n - 1)] + [req("hit", L + ids(900, 5), k=n)]
    out = calc_priority("lpm", waiting, tree)
    if sorted_:
        assert names(out)[0] == "hit" and len(out) == n
    else:
        assert out is waiting


def test_dfs_weight_visits_heavier_subtrees_first_and_a_nodes_own_requests_last():
    # The tree: root -> P (10) -> {Q (10), R (10)} (P + Q and P + R inserted). Waiting: a on Q
    # (P + Q + x), b and c on R, d on P only (P + y), e nowhere (node = root). Weights: P 4
    # (a, b, c, d), R 2, Q 1. visit(root) -> visit(P) -> R first (2 > 1): b, c; then Q: a; then
    # P's own: d; then the root's own: e.
    P, Q, R = ids(0, 10), ids(100, 10), ids(200, 10)
    tree = tree_of(P + Q, P + R)
    waiting = [req("a", P + Q + ids(900, 3)), req("e", ids(7000, 12)), req("d", P + ids(800, 4)),
               req("b", P + R + ids(950, 3)), req("c", P + R + ids(960, 3))]
    assert names(calc_priority("dfs-weight", waiting, tree)) == ["b", "c", "a", "d", "e"]


def test_fcfs_returns_the_queue_itself():
    waiting = [req("a", ids(0, 10)), req("b", ids(100, 10))]
    assert calc_priority("fcfs", waiting, tree_of(ids(100, 10))) is waiting


# ------------------------------------------------------------------ 0.5.23's fcfs waiting-prefix refresh

@pytest.mark.parametrize("reach,first_evicted", [(128, "B"), (129, "C"), (127, "A")])
def test_waiting_prefix_refresh_touches_exactly_the_first_128(reach, first_evicted, monkeypatch):
    # `_touch_waiting_prefixes`: `for r in reversed(waiting_queue[:128])`. Leaves A, B, C
    # inserted in that order (A oldest). waiting[127] is on A, waiting[128] on B, the rest match
    # nothing. Touching the first 128 makes A the newest: LRU order B, C, A -> evict(1) frees B.
    # Reaching 129 would touch B then A: C goes first; reaching 127 touches neither: A goes.
    # (`reach` patches the limit to show each alternative; SGLang's is 128.)
    import inferlab.kv.sglang.schedule_policy as sp
    monkeypatch.setattr(sp, "WAITING_QUEUE_PREFIX_MATCH_MAX", reach)
    A, B, C = ids(0, 30), ids(1000, 30), ids(2000, 30)
    tree = tree_of(A, B, C)
    waiting = [req(f"r{k}", ids(10_000 + 100 * k, 5), k=k) for k in range(127)]
    waiting += [req("onA", A + ids(9000, 5), k=127), req("onB", B + ids(9100, 5), k=128)]
    sp.touch_waiting_prefixes(waiting, tree)
    assert tree.evict(1) == 30
    left = {n for n, p in (("A", A), ("B", B), ("C", C)) if tree.match_prefix(runs_of_list(p), 30)[0] == 30}
    assert {"A", "B", "C"} - left == {first_evicted}


def test_waiting_prefix_refresh_touches_the_head_last():
    # Leaves X (older) and Y (newer). Waiting: head on Y, then one on X. Reversed: X touched
    # first, then Y (the head) -> Y is the newest, X is evicted first.
    X, Y = ids(0, 30), ids(1000, 30)
    tree = tree_of(X, Y)
    touch_waiting_prefixes([req("h", Y + ids(7000, 3)), req("t", X + ids(7100, 3), k=1)], tree)
    assert tree.evict(1) == 30
    assert tree.match_prefix(runs_of_list(Y), 30)[0] == 30 and tree.match_prefix(runs_of_list(X), 30)[0] == 0


# ------------------------------------------------------------------ the running requests' reservation

class _Run:
    def __init__(self, out_len, num_output):
        self.out_len, self.num_output = out_len, num_output


def test_reservation_of_running_requests_below_the_clip():
    # sum(min(max_new - len(output), 4096)) * ratio: (100 - 30) + (50 - 10) = 110, * 0.5 = 55.
    assert reserved_by_running([_Run(100, 30), _Run(50, 10)], 0.5) == pytest.approx(55.0)
    assert reserved_by_running([], 0.5) == 0


def test_reservation_clips_each_requests_remaining_tokens_at_4096():
    # CLIP_MAX_NEW_TOKENS clips the *remaining* tokens, per request (SGLang:
    # min(max_new_tokens - len(output_ids), CLIP_MAX_NEW_TOKENS)):
    # a: 5000 - 500 = 4500 -> 4096; b: 4500 - 1000 = 3500; c: 100 - 0 = 100.
    # (4096 + 3500 + 100) * 0.5 = 3848.
    running = [_Run(5000, 500), _Run(4500, 1000), _Run(100, 0)]
    assert reserved_by_running(running, 0.5) == pytest.approx(3848.0)
    # at exactly the clip: 4096 - 0 -> 4096; 4097 - 0 -> 4096; 4097 - 1 -> 4096
    assert reserved_by_running([_Run(4096, 0)], 1.0) == 4096
    assert reserved_by_running([_Run(4097, 0)], 1.0) == 4096
    assert reserved_by_running([_Run(4097, 1), _Run(10, 3)], 1.0) == 4096 + 7


# ------------------------------------------------------------------ PrefillAdder: 0.5.23 (PrefillBudget)

def adder(room=10_000, page=1, max_prefill=16384, chunk=2048, reserved=0.0, v2=True, tree=None):
    tree = tree or RadixCache(page)
    return PrefillAdder(tree, lambda: room, page, max_prefill_tokens=max_prefill, chunked_prefill_size=chunk,
                        reserved=reserved, budget_v2=v2), tree


@pytest.mark.parametrize("max_new,outcome", [(48, ADDED), (49, NO_TOKEN)])
def test_v2_fit_needs_extend_plus_future_plus_a_page_below_the_room(max_new, outcome):
    # check_prefill: extend + max_new + page_size < remaining_total. 100 cells, prompt 50:
    # 50 + 48 + 1 = 99 < 100 fits; 50 + 49 + 1 = 100 does not.
    a, tree = adder(room=100)
    s = req("r", ids(0, 50), max_new, tree=tree)
    assert a.add_one_req(s, 0, tree.root) == ((outcome, 50) if outcome == ADDED else (outcome, 0))


def test_v2_fit_counts_the_running_reservation_and_this_rounds_offset():
    # remaining_total = room - reserved - offset = 1000 - 300.5 - 0. r1: 600 + 98 + 1 = 699 <
    # 699.5 -> admitted, offset += 600 + 1 + 98 = 699. r2 (10 + 1 + 1 = 12) against 0.5 -> NO_TOKEN.
    a, tree = adder(room=1000, reserved=300.5)
    r1, r2 = req("r1", ids(0, 600), 98, tree=tree), req("r2", ids(5000, 10), 1, tree=tree)
    assert a.add_one_req(r1, 0, tree.root) == (ADDED, 600)
    assert a.offset == 699
    assert a.add_one_req(r2, 0, tree.root) == (NO_TOKEN, 0)


def test_v2_charges_page_ceiled_extend_one_page_and_the_clipped_max_new():
    # page 16, extend 20 -> ceil 32; max_new 5000 -> 4096. offset = 32 + 16 + 4096 = 4144;
    # current (this round's immediate allocations) = 32 + 16 = 48; rem_input = 16384 - 32 =
    # 16352; rem_chunk = 2048 - 32 = 2016.
    a, tree = adder(room=100_000, page=16)
    s = req("r", ids(0, 20), 5000, tree=tree)
    assert a.add_one_req(s, 0, tree.root) == (ADDED, 20)
    assert (a.offset, a.current, a.rem_input, a.rem_chunk) == (4144, 48, 16352, 2016)


@pytest.mark.parametrize("second,outcome", [(99, ADDED), (100, OTHER)])
def test_v2_without_chunking_stops_when_the_extend_reaches_the_input_budget(second, outcome):
    # chunked prefill off (-1): `can_run_list and input_tokens >= rem_input_tokens` -> OTHER.
    # max_prefill 200; r1 (101 tokens) leaves 99; r2 of 99 tokens: 99 >= 99 -> OTHER; of 98
    # -> admitted. (`second` is r2's length + 1.)
    a, tree = adder(room=100_000, max_prefill=200, chunk=None)
    r1 = req("r1", ids(0, 101), 1, tree=tree)
    assert a.add_one_req(r1, 0, tree.root) == (ADDED, 101)
    assert a.rem_input == 99
    r2 = req("r2", ids(5000, second - 1), 1, tree=tree)
    assert a.add_one_req(r2, 0, tree.root)[0] == outcome


def test_v2_without_chunking_the_first_request_may_exceed_the_input_budget():
    # "Without chunking, allow the first request even above the input cap": 300 > 200, nothing
    # admitted yet -> ADDED; rem_input = 200 - 300 = -100 -> budget_state OTHER (spent).
    a, tree = adder(room=100_000, max_prefill=200, chunk=None)
    assert a.add_one_req(req("r1", ids(0, 300), 1, tree=tree), 0, tree.root) == (ADDED, 300)
    assert a.rem_input == -100 and a.budget_state() == OTHER


@pytest.mark.parametrize("length,outcome,chunk", [(2048, ADDED, 2048), (2049, ADDED_CHUNKED, 2048)])
def test_v2_chunks_only_an_extend_above_the_chunk_budget(length, outcome, chunk):
    # `chunk_fit_tokens > chunk_tokens_limit` -> chunked: 2048 == 2048 fits whole; 2049 is cut to
    # 2048 // 1 * 1 = 2048 tokens and becomes the chunked request (its max_new not reserved:
    # offset = 2048 + 1 + 0).
    a, tree = adder(room=100_000)
    s = req("r", ids(0, length), 10, tree=tree)
    assert a.add_one_req(s, 0, tree.root) == (outcome, chunk)
    assert a.offset == 2048 + 1 + (10 if outcome == ADDED else 0)


def test_v2_chunk_end_is_page_aligned_from_the_prefix():
    # page 16, chunk budget 40, prefix 32 (2 pages cached), 100 tokens to extend (paged 112 >
    # 40): extend_len = 40 // 16 * 16 = 32; end = (32 + 32) // 16 * 16 = 64; chunk = 64 - 32 = 32.
    tree = tree_of(ids(0, 32), page_size=16)
    a, _ = adder(room=100_000, page=16, chunk=40, tree=tree)
    s = req("r", ids(0, 132), 10, tree=tree)
    prefix, node = tree.match_prefix(s.runs, s.num_tokens - 1)
    assert prefix == 32
    assert a.add_one_req(s, prefix, node) == (ADDED_CHUNKED, 32)
    assert (a.rem_chunk, a.offset) == (40 - 32, 32 + 16)


def test_v2_a_chunk_budget_below_one_page_admits_nothing():
    # page 16, chunk budget 40: r1 (32 tokens, paged 32) is admitted -> 8 left, still > 0, so
    # the round goes on (budget_state ADDED). r2 (paged 32 > 8): extend_len = 8 // 16 * 16 = 0
    # -> `if extend_len <= 0: return OTHER`; its prefix lock is released.
    a, tree = adder(room=100_000, page=16, chunk=40)
    assert a.add_one_req(req("r1", ids(0, 32), 4, tree=tree), 0, tree.root) == (ADDED, 32)
    assert a.rem_chunk == 8 and a.budget_state() == ADDED
    assert a.add_one_req(req("r2", ids(5000, 32), 4, tree=tree), 0, tree.root) == (OTHER, 0)
    assert len(a.adds) == 1


def test_v2_budget_state_at_each_boundary():
    # budget_state: NO_TOKEN unless remaining_total > 0 and room - current > 0; then OTHER if
    # rem_input <= 0 or (chunking on and rem_chunk <= 0); else CONTINUE.
    a, _ = adder(room=100, chunk=50)
    assert a.budget_state() == ADDED
    a.offset = 100  # remaining_total = 100 - 0 - 100 = 0: not > 0
    assert a.budget_state() == NO_TOKEN
    a.offset = 99
    assert a.budget_state() == ADDED
    a.current = 100  # room - current = 0
    assert a.budget_state() == NO_TOKEN
    a.current = 0
    a.rem_chunk = 0  # the chunk budget spent, the input budget not
    assert a.budget_state() == OTHER
    a.rem_chunk = 1
    a.rem_input = 0  # the input budget spent, the chunk budget not
    assert a.budget_state() == OTHER
    b, _ = adder(room=100, chunk=None)
    b.rem_input = 0  # chunking off: only the input budget
    assert b.budget_state() == OTHER
    b.rem_input = 1
    assert b.budget_state() == ADDED
    c, _ = adder(room=100, reserved=99.5)  # 100 - 99.5 = 0.5 > 0
    assert c.budget_state() == ADDED
    c, _ = adder(room=100, reserved=100.0)  # the running requests' reservation alone fills the pool
    assert c.budget_state() == NO_TOKEN
    a.current = 99  # room - current = 1 > 0
    assert a.budget_state() == OTHER  # (rem_input is still 0)
    a.rem_input, a.rem_chunk = 5, 1  # both budgets have 1+ left
    assert a.budget_state() == ADDED


def test_v2_budget_is_checked_with_the_prefix_locked():
    # `with self._lock_node(req.last_node)`: the request's own cached prefix is not evictable
    # room while it is checked. Pool of 100: 40 free, the tree holds the 60-token prefix P
    # (evictable). r = P + 30 new, max_new 9: locked, remaining_total = 40 + 0; 30 + 9 + 1 = 40
    # is not < 40 -> NO_TOKEN, and the lock is released again (60 evictable). Unlocked it would
    # have seen 100 cells. With max_new 8: 39 < 40 -> admitted, the prefix stays locked.
    P = ids(0, 60)
    tree = tree_of(P)
    room = lambda: 40 + tree.evictable_tokens  # noqa: E731
    for max_new, outcome in ((9, NO_TOKEN), (8, ADDED)):
        a = PrefillAdder(tree, room, 1, max_prefill_tokens=16384, chunked_prefill_size=2048, reserved=0.0,
                         budget_v2=True)
        s = req("r", P + ids(900, 30), max_new, tree=tree)
        prefix, node = tree.match_prefix(s.runs, s.num_tokens - 1)
        assert prefix == 60
        assert a.add_one_req(s, prefix, node)[0] == outcome
        assert tree.evictable_tokens == (60 if outcome == NO_TOKEN else 0)


def test_v2_chunked_request_continues_with_the_chunk_budget():
    # add_chunked_req: available_chunk_tokens = min(rem_chunk, remaining_total) (2048 here);
    # 5000-token prompt with 2048 done: extend 2952 -> chunk 2048, not the last; nothing of
    # max_new reserved: offset = 2048 + 1. With 4096 done: extend 904 -> the last chunk, which
    # reserves min(max_new, 4096) = 10: offset = 904 + 1 + 10.
    for done, chunk, last, offset in ((2048, 2048, False, 2049), (4096, 904, True, 915)):
        a, tree = adder(room=100_000)
        s = req("r", ids(0, 5000), 10, tree=tree)
        s.num_computed = done
        assert a.add_chunked_req(s) is last
        assert a.adds == [(s, chunk)] and a.offset == offset and a.rem_chunk == 2048 - chunk


def test_v2_chunked_request_bounded_by_the_room_left():
    # remaining_total = 1000 - 500 (reserved) = 500 < 2048 -> this chunk is 500 tokens.
    a, tree = adder(room=1000, reserved=500.0)
    s = req("r", ids(0, 5000), 10, tree=tree)
    s.num_computed = 2048
    assert a.add_chunked_req(s) is False and a.adds == [(s, 500)]
    # remaining_total <= 0 (reserved 1500 > room 1000): SGLang falls back to the chunk budget
    # (2048); the pool has 1000 cells, page 16 -> the simulator's guard waits for a whole page:
    # 1000 - 1000 % 16 = 992.
    a, tree = adder(room=1000, page=16, reserved=1500.0)
    s = req("r", ids(0, 5000), 10, tree=tree)
    s.num_computed = 2048
    assert a.add_chunked_req(s) is False and a.adds == [(s, 992)]


def test_v2_chunked_request_when_the_room_left_is_zero_or_one():
    # remaining_total = 1000 - 1000 = 0: int(0) is not > 0, so the chunk budget (2048) applies,
    # which the 1000-cell pool bounds (simulator guard): a 1000-token chunk. With 999 reserved,
    # remaining_total = 1 > 0 -> a 1-token chunk.
    for reserved, chunk in ((1000.0, 1000), (999.0, 1)):
        a, tree = adder(room=1000, reserved=reserved)
        s = req("r", ids(0, 5000), 10, tree=tree)
        s.num_computed = 2048
        assert a.add_chunked_req(s) is False and a.adds == [(s, chunk)]
    # a pool of 10 cells at page 16 with nothing left of remaining_total (10 reserved): the chunk
    # budget applies, bounded by the pool's whole pages: 10 - 10 % 16 = 0 -> nothing this round
    a, tree = adder(room=10, page=16, reserved=10.0)
    s = req("r", ids(0, 5000), 10, tree=tree)
    s.num_computed = 2048
    assert a.add_chunked_req(s) is False and a.adds == []


@pytest.mark.parametrize("v2", [True, False])
def test_a_one_token_chunk_budget_chunks_one_token(v2):
    # chunked_prefill_size 1 (page 1): a 5-token prompt is cut to 1 token (> 0: ADDED_CHUNKED).
    a, tree = adder(room=1000, chunk=1, v2=v2)
    assert a.add_one_req(req("r", ids(0, 5), 3, tree=tree), 0, tree.root) == (ADDED_CHUNKED, 1)


# ------------------------------------------------------------------ PrefillAdder: 0.5.2

@pytest.mark.parametrize("max_new,outcome", [(49, ADDED), (50, NO_TOKEN)])
def test_v1_fit_needs_extend_plus_future_below_the_room(max_new, outcome):
    # 0.5.2: `total_tokens >= rem_total_tokens` -> NO_TOKEN. 100 cells, prompt 50: 50 + 49 = 99 <
    # 100 fits (no page added); 50 + 50 = 100 does not. The reservation: extend + future = 99.
    a, tree = adder(room=100, v2=False)
    s = req("r", ids(0, 50), max_new, tree=tree)
    assert a.add_one_req(s, 0, tree.root)[0] == outcome
    if outcome == ADDED:
        assert (a.offset, a.rem_input, a.rem_chunk) == (99, 16384 - 50, 2048 - 50)


def test_v1_reserves_min_max_new_4096_for_a_fresh_request():
    # 0.5.2 reserves extend + min(max_new_tokens, 4096): prompt 510, max_new 5000 -> 510 + 4096.
    a, tree = adder(room=100_000, v2=False)
    assert a.add_one_req(req("r", ids(0, 510), 5000, tree=tree), 0, tree.root) == (ADDED, 510)
    assert a.offset == 510 + 4096


def test_v1_budgets_take_the_page_ceiled_extend():
    # 0.5.2's _update_prefill_budget (schedule_policy.py line 371): extend_input_len =
    # ceil_paged_tokens(extend) for every budget. Page 16, prompt 50 -> 64: offset 64 + max_new 5
    # = 69 (no extra page, unlike 0.5.23), rem_input 16384 - 64, rem_chunk 2048 - 64.
    a, tree = adder(room=100_000, page=16, v2=False)
    assert a.add_one_req(req("r", ids(0, 50), 5, tree=tree), 0, tree.root) == (ADDED, 50)
    assert (a.offset, a.current, a.rem_input, a.rem_chunk) == (69, 64, 16384 - 64, 2048 - 64)


def test_v1_reserves_a_resumed_requests_whole_max_new_tokens():
    # A request retracted after 60 of 100 tokens: extend 10 + 60 = 70, 0.5.2 reserves 70 + 100
    # (reset_for_retract keeps sampling_params; nothing subtracts len(output_ids) in 0.5.2).
    a, tree = adder(room=100_000, v2=False)
    s = req("r", ids(0, 10), 100, tree=tree)
    s.num_output = 60
    assert a.add_one_req(s, 0, tree.root) == (ADDED, 70)
    assert a.offset == 70 + 100


@pytest.mark.parametrize("second,outcome", [(98, ADDED), (99, OTHER)])
def test_v1_input_budget_stops_the_round_even_with_chunking(second, outcome):
    # 0.5.2: `extend_input_len >= rem_input_tokens and can_run_list` -> OTHER, chunked or not.
    # max_prefill 200, r1 101 -> 99 left; r2: 99 >= 99 -> OTHER; 98 -> admitted.
    a, tree = adder(room=100_000, max_prefill=200, v2=False)
    assert a.add_one_req(req("r1", ids(0, 101), 1, tree=tree), 0, tree.root) == (ADDED, 101)
    assert a.add_one_req(req("r2", ids(5000, second), 1, tree=tree), 0, tree.root)[0] == outcome


def test_v1_chunk_is_the_page_floored_chunk_budget():
    # 0.5.2: extend 100 > rem_chunk 40 at page 16 -> trunc_len = 40 - 40 % 16 = 32, chunked
    # (future not reserved): offset 32, rem_chunk 8, rem_input 16384 - 32. A second request then
    # finds 8 - 8 % 16 = 0 -> OTHER.
    a, tree = adder(room=100_000, page=16, chunk=40, v2=False)
    assert a.add_one_req(req("r1", ids(0, 100), 5, tree=tree), 0, tree.root) == (ADDED_CHUNKED, 32)
    assert (a.offset, a.rem_chunk, a.rem_input) == (32, 8, 16352)
    assert a.add_one_req(req("r2", ids(5000, 20), 5, tree=tree), 0, tree.root) == (OTHER, 0)


def test_v1_an_extend_equal_to_the_chunk_budget_is_not_chunked():
    # `extend_input_len > rem_chunk_tokens` chunks; 2048 == 2048 is admitted whole, future 3.
    a, tree = adder(room=100_000, v2=False)
    assert a.add_one_req(req("r", ids(0, 2048), 3, tree=tree), 0, tree.root) == (ADDED, 2048)
    assert a.offset == 2051 and a.rem_chunk == 0


def test_v1_chunked_request_continues():
    # 0.5.2's add_chunked_req: rem = min(rem_chunk, int(rem_total)) = 2048; truncated = extend >
    # rem. 5000 tokens with 2048 done -> 2048 this round, not the last (nothing of max_new
    # reserved): offset 2048, rem_chunk 0, rem_input 16384 - 2048.
    a, tree = adder(room=100_000, v2=False)
    s = req("r", ids(0, 5000), 10, tree=tree)
    s.num_computed = 2048
    assert a.add_chunked_req(s) is False
    assert a.adds == [(s, 2048)] and a.offset == 2048 and (a.rem_chunk, a.rem_input) == (0, 16384 - 2048)
    # the last chunk (904 of them) is the last: True
    a, tree = adder(room=100_000, v2=False)
    s = req("r", ids(0, 5000), 10, tree=tree)
    s.num_computed = 4096
    assert a.add_chunked_req(s) is True and a.adds == [(s, 904)] and a.rem_chunk == 2048 - 904
    # a last chunk of exactly the chunk budget is not truncated (2048 > 2048 is false): the last
    a, tree = adder(room=100_000, v2=False)
    s = req("r", ids(0, 5000), 10, tree=tree)
    s.num_computed = 5000 - 2048
    assert a.add_chunked_req(s) is True and a.adds == [(s, 2048)] and a.rem_chunk == 0


def test_v1_chunked_request_is_bounded_by_the_room_and_its_last_chunk_reserves_max_new():
    # last chunk: 904 + min(10, 4096) = 914 reserved
    a, tree = adder(room=100_000, v2=False)
    s = req("r", ids(0, 5000), 10, tree=tree)
    s.num_computed = 4096
    assert a.add_chunked_req(s) is True and a.offset == 914
    # rem_total = 1000 - 500 reserved = 500 < 2048 -> a 500-token chunk
    a, tree = adder(room=1000, reserved=500.0, v2=False)
    s = req("r", ids(0, 5000), 10, tree=tree)
    s.num_computed = 2048
    assert a.add_chunked_req(s) is False and a.adds == [(s, 500)]


# ------------------------------------------------------------------ the radix tree

def test_eviction_takes_leaves_oldest_first_then_the_parent_left_bare():
    # P + X and P + Y inserted (P 10, X 5, Y 5): nodes P, X (older leaf), Y. evict(6): X (5,
    # 5 < 6 so go on), then Y (10 >= 6): P is now a bare leaf but the loop is done -> 10 freed,
    # P (10 tokens) stays. From a fresh tree evict(11): X, Y, then P (pushed when it lost its
    # last child): 20.
    P, X, Y = ids(0, 10), ids(100, 5), ids(200, 5)
    t = tree_of(P + X, P + Y)
    assert t.evict(6) == 10 and t.total_tokens == 10 and t.evictable_tokens == 10
    assert t.match_prefix(runs_of_list(P + X), 15)[0] == 10
    t = tree_of(P + X, P + Y)
    assert t.evict(11) == 20 and t.total_tokens == 0
    assert t.evict(1) == 0


def test_locked_paths_are_not_evictable():
    # Lock Y's leaf: Y and its ancestor P are protected (lock_ref 1): evictable = 20 - 15 = 5,
    # a second lock changes no count, one unlock neither; evict(100) frees only X (5). Unlocking
    # twice makes P + Y evictable again (15).
    P, X, Y = ids(0, 10), ids(100, 5), ids(200, 5)
    t = tree_of(P + X, P + Y)
    _, y = t.match_prefix(runs_of_list(P + Y), 15)
    t.inc_lock(y)
    assert t.evictable_tokens == 5
    t.inc_lock(y)
    t.dec_lock(y)
    assert t.evictable_tokens == 5
    assert t.evict(100) == 5 and t.total_tokens == 15
    t.dec_lock(y)
    assert t.evictable_tokens == 15 and t.evict(100) == 15


def test_page_size_16_tree_keys_by_first_page_and_stores_whole_pages():
    # page 16: a 40-token insert keeps 32 (two pages). A prompt sharing the first page and
    # differing in the second matches 16 (and splits the edge at 16); one differing in the first
    # page's last token matches 0 (children are keyed by the whole first page).
    a = ids(0, 40)
    t = tree_of(a, page_size=16)
    assert t.total_tokens == 32
    b = ids(0, 16) + ids(500, 24)
    assert t.match_prefix(runs_of_list(b), 40)[0] == 16
    (upper,) = t.root.children.values()
    assert upper.length == 16
    c = ids(0, 15) + ids(700, 25)
    assert t.match_prefix(runs_of_list(c), 40)[0] == 0
    # a match limited to 31 tokens floors to 16
    assert t.match_prefix(runs_of_list(a), 31)[0] == 16
    # inserting b adds its second page only (16 present): total 32 + 16
    assert t.insert(runs_of_list(b), 40)[0] == 16 and t.total_tokens == 48


def test_eviction_stops_once_enough_is_freed():
    # `while freed < num_tokens and heap`: evict(5) frees X (5 == 5) and stops; Y and P stay.
    P, X, Y = ids(0, 10), ids(100, 5), ids(200, 5)
    t = tree_of(P + X, P + Y)
    assert t.evict(5) == 5 and t.total_tokens == 15
    assert t.match_prefix(runs_of_list(P + Y), 15)[0] == 15


def test_a_locked_parent_left_bare_is_not_evicted():
    # A request holds P itself (its match ends at P's node). evict(100) frees the leaves X and Y;
    # P is now a leaf but locked, so it is not pushed: 10 freed, P's 10 tokens stay.
    P, X, Y = ids(0, 10), ids(100, 5), ids(200, 5)
    t = tree_of(P + X, P + Y)
    n, node = t.match_prefix(runs_of_list(P + ids(900, 5)), 15)
    assert n == 10
    t.inc_lock(node)
    assert t.evict(100) == 10 and t.total_tokens == 10 and t.evictable_tokens == 0


def test_a_match_touches_only_the_nodes_it_walks():
    # match_prefix updates last_access of the nodes it traverses. P + X then P + Y inserted (Y
    # newer). A match of P + X limited to 10 tokens stops at P without touching X, so X is still
    # the least recently used leaf: evict(1) takes X (5). A full match of P + X touches X:
    # then Y goes first.
    P, X, Y = ids(0, 10), ids(100, 5), ids(200, 5)
    for limit, gone in ((10, X), (15, Y)):
        t = tree_of(P + X, P + Y)
        t.match_prefix(runs_of_list(P + X), limit)
        assert t.evict(1) == 5
        assert t.match_prefix(runs_of_list(P + gone), 15)[0] == 10


def test_a_page_floored_match_inside_an_edge_across_runs():
    # page 16. The tree holds one 32-token edge of three runs: 0-9, 100-105, 200-215. The query
    # shares 10 + 6 + 4 = 20 tokens, then parts (999...): the common prefix 20 floors to one page
    # (16, which ends exactly where the second run ends) and the edge splits there. Inserting the
    # query (32 tokens) finds those 16 present and adds its second page: 32 + 16 cells.
    stored = ids(0, 10) + ids(100, 6) + ids(200, 16)
    query = ids(0, 10) + ids(100, 6) + ids(200, 4) + ids(999, 12)
    t = tree_of(stored, page_size=16)
    assert t.match_prefix(runs_of_list(query), 32)[0] == 16
    (upper,) = t.root.children.values()
    assert upper.length == 16 and [c.length for c in upper.children.values()] == [16]
    assert t.insert(runs_of_list(query), 32)[0] == 16 and t.total_tokens == 48
    assert t.match_prefix(runs_of_list(query), 32)[0] == 32


def test_page_key_of_a_child_that_starts_near_the_end_of_a_run():
    # page 16. A = 0-39 then 300-323 (64 tokens, two runs), B = 0-31 then 200-231: root ->
    # [0..31] -> {[32..39, 300..323], [200..231]}. Matching A itself (limit 63): the second edge's
    # key is its first page, 8 tokens of the first run (32..39) and 8 of the second (300..307);
    # the common prefix there is min(32, 63 - 32) = 31 -> one page: 32 + 16 = 48.
    A = ids(0, 40) + ids(300, 24)
    B = ids(0, 32) + ids(200, 32)
    t = tree_of(A, B, page_size=16)
    assert t.total_tokens == 64 + 32
    assert t.match_prefix(runs_of_list(A), 63)[0] == 48
    assert t.match_prefix(runs_of_list(A), 64)[0] == 64

"""llama.cpp server's slot rules, step by step, worked out by hand (tools/server/server-context.cpp
and server-task.cpp at the commit llama-cpp-python 0.3.36 vendors, 0c1e570: get_available_slot,
update_slots, process_token, try_clear_idle_slots, server_prompt_cache::update;
docs/engines/llamacpp.md).

Each step's work is read with a recording cost function: the simulator prices every step as
``cost(prefill tokens, decode tokens, context tokens)`` (the batch's prompt tokens, its one token per
generating slot, and per batch segment the slot's cells after it), so the per-step triples below
are the server loop's decisions, derived in the comments.
"""

import pytest

from inferlab.kv.llamacpp.prompt_cache import PromptCache
from inferlab.kv.llamacpp.server import CONTEXT_EXCEEDED, SlotManager
from inferlab.kv.llamacpp.slots import Slot
from inferlab.kv_managers import Request, simulate

from _recorded_steps import ids, steps_of


def by_id(run):
    return {r.id: r for r in run.requests}


def test_a_fully_cached_prompt_still_evaluates_its_last_token():
    # update_slots: n_past = LCP(slot tokens, prompt); "if (n_past == task.n_tokens() && n_past > 0)
    # n_past--": at least one prompt token is evaluated, for the logits. One slot, no RAM cache.
    # A 10-token prompt asked again finds the slot holding it (+ reply): 10 - 1 = 9 cached; a
    # 1-token prompt asked again: 1 - 1 = 0 cached, its token computed again.
    for n, cached in ((10, 9), (1, 0)):
        reqs = [Request("a", 0, ids(7, n), 2), Request("b", 10, ids(7, n), 2)]
        run = simulate(reqs, SlotManager(4096, n_parallel=1, cache_ram_mib=0), check_invariants=True)
        b = by_id(run)["b"]
        assert (b.cached_tokens, b.computed_prompt_tokens, b.output_tokens) == (cached, n - cached, 2), n


@pytest.mark.parametrize("ff", [True, False])
def test_generation_stops_one_cell_short_of_the_slot_context(ff):
    # process_token without context shift: stop (truncated) when n_tokens + 1 >= n_ctx_slot.
    # -c 16 with ctx_pad 1, one slot: n_ctx_slot 16. A 10-token prompt asking 100: after the prefill
    # the slot holds 10 cells (token 1 sampled), each decode adds one: token k is sampled at
    # 9 + k cells; 9 + k + 1 >= 16 first at k = 6: 6 tokens, truncated.
    # Steps: (10, 0, 10), then 5 decodes with 11 .. 15 cells.
    run, steps = steps_of([Request("a", 0, ids(0, 10), 100)], SlotManager(16, n_parallel=1, ctx_pad=1, cache_ram_mib=0),
                          fast_forward=ff)
    a = run.requests[0]
    assert (a.output_tokens, a.truncated) == (6, True)
    assert steps == [(10, 0, 10)] + [(0, 1, c) for c in range(11, 16)]
    # a 15-token prompt: 15 + 1 >= 16 at its first token; a 16-token one is refused (>= n_ctx_slot)
    r15 = simulate([Request("a", 0, ids(0, 15), 100)], SlotManager(16, n_parallel=1, ctx_pad=1, cache_ram_mib=0))
    assert (r15.requests[0].output_tokens, r15.requests[0].truncated) == (1, True)
    r16 = simulate([Request("a", 0, ids(0, 16), 100)], SlotManager(16, n_parallel=1, ctx_pad=1, cache_ram_mib=0))
    assert r16.requests[0].rejected and "exceeds the available context size" in r16.requests[0].rejected


def test_prompts_fill_the_batch_slot_by_slot_after_the_generating_tokens():
    # Two unified slots, n_batch 8, no RAM cache. A (10 tokens) and B (6 tokens), 2 new tokens each,
    # both at 0. get_available_slot: no slot holds tokens, so the least recently used; never-used
    # slots tie and the 2026 server takes the last one: A -> slot 1, then B -> slot 0.
    # step 0: prompts in slot-id order: B 6 (done: samples), A min(10, 8 - 6) = 2 -> (8, 0, 6 + 2)
    # step 1: B's decode token first, then A min(8, 8 - 1) = 7 (9 cells); B samples its 2nd: done
    #                                                                     -> (7, 1, 7 + 9)
    # step 2: A's last prompt token (10 cells), samples                   -> (1, 0, 10)
    # step 3: A decodes (11 cells), its 2nd token: done                   -> (0, 1, 11)
    reqs = [Request("A", 0, ids(0, 10), 2), Request("B", 0, ids(100, 6), 2)]
    m = SlotManager(4096, n_parallel=2, kv_unified=True, n_batch=8, cache_ram_mib=0)
    run, steps = steps_of(reqs, m)
    assert (m.slot_of("A"), m.slot_of("B")) == (1, 0)
    assert steps == [(8, 0, 8), (7, 1, 16), (1, 0, 10), (0, 1, 11)]
    assert (by_id(run)["A"].ttft_s, by_id(run)["B"].ttft_s) == (3.0, 1.0)
    # 2024 builds take the first of the tied slots: A -> slot 0, B -> slot 1.
    # step 0: A min(10, 8) = 8; the batch is full                         -> (8, 0, 8)
    # step 1: A's last 2 (samples), B's 6 (samples)                       -> (8, 0, 10 + 6)
    # step 2: both decode their 2nd token: done                           -> (0, 2, 11 + 7)
    old = SlotManager(4096, n_parallel=2, kv_unified=True, n_batch=8, cache_ram_mib=0, version="2024")
    run, steps = steps_of(reqs, old)
    assert (old.slot_of("A"), old.slot_of("B")) == (0, 1)
    assert steps == [(8, 0, 8), (8, 0, 16), (0, 2, 18)]


def test_a_full_unified_buffer_purges_an_idle_slot_then_fails_the_processing_ones():
    # -c 40 (ctx_pad 1), 3 unified slots, no RAM cache. C (8 tokens, 1 new) runs alone at 0 in
    # slot 2 (never-used slots tie: the last) and leaves its 8 cells there, idle.
    # A and B (10 tokens, 30 new) arrive at 1: slot 2 shares nothing with them, so LRU: slots 0 and 1
    # never used (t = -1) tie, the last: A -> slot 1, B -> slot 0.
    # step 1: both prefill (8 + 20 = 28 cells), sample token 1; each later step adds 2 cells:
    #   steps 2-7 fill the 40 cells. Step 8: 2 tokens, no room: try_clear_idle_slots purges slot 2
    #   (8 cells) and the view is retried; steps 8-11 fill those. Step 12: no room, no idle slot
    #   holding cells: the view halves down to one token, still no room: "Context size has been
    #   exceeded", every processing slot released. A and B got 1 + 10 = 11 tokens each.
    reqs = [Request("C", 0, ids(500, 8), 1), Request("A", 1, ids(0, 10), 30), Request("B", 1, ids(100, 10), 30)]
    for ff in (True, False):
        m = SlotManager(40, n_parallel=3, kv_unified=True, ctx_pad=1, cache_ram_mib=0)
        run, steps = steps_of(reqs, m, fast_forward=ff)
        r = by_id(run)
        assert (m.slot_of("C"), m.slot_of("A"), m.slot_of("B")) == (2, 1, 0)
        assert r["A"].rejected == r["B"].rejected == CONTEXT_EXCEEDED, ff
        assert (r["A"].output_tokens, r["B"].output_tokens) == (11, 11), ff
        # B (slot 0) and A (slot 1) cells after each step: 10 + k after decode step k
        assert steps == [(8, 0, 8), (20, 0, 20)] + [(0, 2, 2 * (10 + k)) for k in range(1, 11)], ff
        assert [s.n_tokens for s in m.slots] == [0, 0, 0]  # released and cleared; slot 2 purged


def test_keep_first_keeps_the_first_n_cells():
    # prompt.tokens.keep_first(n) + seq_rm(id, n, -1): the slot keeps its first n tokens
    s = Slot(0, 64, runs=((100, 10), (900, 5)), n_tokens=15)
    s.keep_first(12)
    assert (s.runs, s.n_tokens) == (((100, 10), (900, 2)), 12)
    s.keep_first(0)
    assert (s.runs, s.n_tokens) == ((), 0)


def _runs(i: int, n: int = 100):
    return ((i * 10_000, n),)  # n consecutive ids of their own: no two entries share a prefix


def test_update_floors_the_state_size_per_token_at_one_byte():
    # server_prompt_cache::update: size_per_token = max(1.0f, size() / max(1, n_tokens())),
    # limit_tokens_cur = max(limit_tokens, limit_size / size_per_token); then the oldest entries go
    # while n_tokens() > limit_tokens_cur. 12 entries of 100 tokens and 50 bytes (0.5 bytes a
    # token, under the 1,000-byte limit: 600 bytes): the floor makes it 1.0, so the byte limit
    # holds 1,000 tokens (not 2,000): the 2 oldest entries go, 10 stay.
    c = PromptCache(1000, 300)
    for i in range(12):
        assert c.alloc(_runs(i), 100, 50)
    c.update()
    assert [e.runs for e in c.states] == [_runs(i) for i in range(2, 12)]
    # at 2 bytes a token (5 entries, 1,000 bytes) the byte limit holds 500 tokens: all stay
    d = PromptCache(1000, 300)
    for i in range(5):
        d.alloc(_runs(i), 100, 200)
    d.update()
    assert d.n_tokens() == 500


def test_alloc_takes_an_entry_exactly_the_size_of_the_limit():
    # server_prompt_cache::alloc skips a state only when state_size > limit_size; one of exactly
    # limit_size bytes is saved after the older entries make room (all of them here).
    c = PromptCache(1000, 10_000)
    assert c.alloc(_runs(0), 100, 400) and c.alloc(_runs(1), 100, 400)
    assert c.alloc(_runs(2), 100, 1000)
    assert [e.runs for e in c.states] == [_runs(2)] and c.size() == 1000
    assert not c.alloc(_runs(3), 100, 1001)  # one byte over: skipped, the entry stays
    assert [e.runs for e in c.states] == [_runs(2)]


def test_update_in_single_precision_can_drop_an_entry_at_the_byte_limit():
    # update's limit_tokens_cur = max(limit_tokens, limit_size / size_per_token) is float
    # arithmetic truncated to an integer. A 1,000-byte cache holding A (10 tokens, 500 bytes) and B
    # (3 tokens, 500 bytes): size_per_token = float(1000 / 13) = 76.92308044... (rounded up from
    # 76.9230769...), 1000 / that = 12.9999995 -> float 12.999999046 -> 12 tokens. 13 cached tokens
    # are over 12 (limit_tokens 5 is lower): the oldest entry, A, goes although both fit the bytes.
    c = PromptCache(1000, 5)
    assert c.alloc(_runs(0, 10), 10, 500) and c.alloc(_runs(1, 3), 3, 500)
    c.update()
    assert [e.runs for e in c.states] == [_runs(1, 3)]
    # 14 tokens in the same bytes: float(1000 / 14) = 71.42857361 (rounded down), 1000 / that =
    # 14.00000008 -> float 14.0 -> 14: both stay
    d = PromptCache(1000, 5)
    assert d.alloc(_runs(0, 11), 11, 500) and d.alloc(_runs(1, 3), 3, 500)
    d.update()
    assert d.n_tokens() == 14


def test_2024_builds_serve_one_request_at_a_time_by_default():
    # 2024 servers default to -np 1 (one slot); 2026's -np auto resolves to 4 unified slots.
    # Two 4-token prompts (2 new tokens each) at 0, 2024: B waits (deferred) until A's slot is
    # released: A steps 0-1, B steps 2-3 -> (4, 0, 4), (0, 1, 5), (4, 0, 4), (0, 1, 5).
    # 2026: both at once -> (8, 0, 8), (0, 2, 10).
    reqs = [Request("A", 0, ids(0, 4), 2), Request("B", 0, ids(100, 4), 2)]
    old = SlotManager(4096, version="2024")
    assert old.n_parallel == 1
    run, steps = steps_of(reqs, old)
    assert steps == [(4, 0, 4), (0, 1, 5), (4, 0, 4), (0, 1, 5)]
    assert by_id(run)["B"].queue_s == 2.0
    new = SlotManager(4096)
    assert new.n_parallel == 4
    _, steps = steps_of(reqs, new)
    assert steps == [(8, 0, 8), (0, 2, 10)]


def test_a_slot_holding_a_single_token_is_chosen_by_similarity():
    # get_available_slot skips only empty slots; a slot holding 1 token that begins the new prompt
    # shares 1 / 2 = 0.5 > 0.10 of it. Two slots (split KV), no RAM cache.
    # B (4 tokens, 1 new) -> slot 1 (never-used slots tie: the last), released at t_last 1; A ([7],
    # 1 new) at 5 -> shares nothing with slot 1: LRU takes slot 0 (never used), released at t_last 2,
    # holding 1 + 1 - 1 = 1 token. C ([7, 99]) at 10: slot 0 shares 1 token (0.5): C takes slot 0
    # (LRU alone would take slot 1, the older one) and reuses 1 token.
    reqs = [Request("B", 0, ids(50, 4), 1), Request("A", 5, [7], 1), Request("C", 10, [7, 99], 1)]
    m = SlotManager(4096, n_parallel=2, cache_ram_mib=0)
    run = simulate(reqs, m, check_invariants=True)
    assert (m.slot_of("B"), m.slot_of("A"), m.slot_of("C")) == (1, 0, 0)
    assert by_id(run)["C"].cached_tokens == 1


def test_a_batch_too_big_for_the_free_cells_is_decoded_in_halved_views():
    # -c 20 (ctx_pad 1), 2 unified slots, no RAM cache; A and B (12 tokens each) at 0: B -> slot 0,
    # A -> slot 1. The batch holds B's 12 then A's 12 prompt tokens = 24 > 20 free cells: no idle
    # slot to purge, so the view halves 2048 -> ... -> 16 (fits): B's 12 (done: B samples) and A's
    # first 4; then the rest (8) halves to 4 = the 4 cells left: A's next 4; then A's last 4 find no
    # cell even one at a time: "Context size has been exceeded", both slots released.
    # The step: 20 prompt tokens; context = B 12 + A 4 + A 8 = 24.
    reqs = [Request("A", 0, ids(0, 12), 5), Request("B", 0, ids(100, 12), 5)]
    run, steps = steps_of(reqs, SlotManager(20, n_parallel=2, kv_unified=True, ctx_pad=1, cache_ram_mib=0))
    assert steps == [(20, 0, 24)]
    r = by_id(run)
    assert r["A"].rejected == r["B"].rejected == CONTEXT_EXCEEDED
    assert (r["A"].output_tokens, r["B"].output_tokens) == (0, 1)


def test_alloc_makes_room_under_a_one_byte_limit():
    # alloc evicts the oldest entries while size() + the new state's size > limit_size: with a
    # 1-byte limit a second 1-byte state pushes the first one out.
    c = PromptCache(1, 100)
    assert c.alloc(_runs(0, 10), 10, 1) and c.alloc(_runs(1, 10), 10, 1)
    assert [e.runs for e in c.states] == [_runs(1, 10)] and c.size() == 1

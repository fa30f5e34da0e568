"""llama.cpp server hand-worked cases; each expected figure is derived in a comment from its rules."""

import pytest

from inferlab.kv_managers import Request, SlotManager, simulate


def ids(start, n):
    return list(range(start, start + n))


def by_id(run):
    return {r.id: r for r in run.requests}


def test_identical_prompt_to_an_idle_slot_hits_all_but_one():
    # n_past = LCP(slot tokens, prompt) = 32 = prompt length -> minus one (last token evaluated).
    reqs = [Request("a", 0, ids(0, 32), 1), Request("b", 10, ids(0, 32), 1)]
    run = simulate(reqs, SlotManager(capacity_tokens=1024, cache_ram_mib=0), check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 31


def test_prefix_in_another_busy_slot_gives_no_reuse():
    # a holds slot 0 while decoding; b shares a's 40-token prefix but slot 0 is busy, so b takes
    # the other (empty) slot: n_past = 0. There is no sharing between slots.
    reqs = [Request("a", 0, ids(0, 40), 50), Request("b", 5, ids(0, 40) + ids(900, 10), 2)]
    run = simulate(reqs, SlotManager(capacity_tokens=1024, n_parallel=2, cache_ram_mib=0),
                   check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 0


def test_similarity_beats_lru():
    # Two idle slots: slot 0 holds a's conversation (30 prompt + 4 reply - 1 = 33 tokens), slot 1
    # holds b's. c continues a (sim = 33/40 > 0.10) although slot 0 is less recently used: it
    # lands in slot 0 and reuses 33 tokens.
    a_reply = ids(500, 4)
    reqs = [Request("a", 0, ids(0, 30), 4, output=a_reply), Request("b", 10, ids(200, 30), 4),
            Request("c", 20, ids(0, 30) + a_reply + ids(700, 6), 2)]
    run = simulate(reqs, SlotManager(capacity_tokens=1024, n_parallel=2, cache_ram_mib=0),
                   check_invariants=True)
    assert by_id(run)["c"].cached_tokens == 33


def test_shared_system_prompt_overwrites_a_conversation():
    # One slot. a's conversation sits in it; b (same 20-token system prompt, different question)
    # lands there (only slot), keeps the 20 shared tokens and drops a's tail. a's follow-up then
    # finds only the system prompt: 20 tokens, not a's whole first turn.
    sys_ = ids(0, 20)
    a1 = Request("a1", 0, sys_ + ids(100, 10), 3, output=ids(150, 3))
    b1 = Request("b1", 10, sys_ + ids(200, 10), 3)
    a2 = Request("a2", 20, sys_ + ids(100, 10) + ids(150, 3) + ids(300, 5), 2)
    run = simulate([a1, b1, a2], SlotManager(capacity_tokens=1024, n_parallel=1, cache_ram_mib=0),
                   check_invariants=True)
    r = by_id(run)
    assert r["b1"].cached_tokens == 20
    assert r["a2"].cached_tokens == 20


def test_host_ram_prompt_cache_restores_a_conversation():
    # One slot, two users alternating; their prompts share only 4 tokens.
    sys_ = ids(0, 4)
    a1 = Request("a1", 0, sys_ + ids(100, 36), 3, output=ids(150, 3))  # 40 + 3 - 1 = 42 in slot
    b1 = Request("b1", 10, sys_ + ids(200, 36), 3)  # sim 4/40 = 0.10, not > 0.10 -> LRU choice
    a2 = Request("a2", 20, sys_ + ids(100, 36) + ids(150, 3) + ids(300, 5), 2)
    # b1 by LRU -> "update cache": a1's 42 tokens saved to RAM, nothing better to load.
    # a2: the slot holds b1 (sim 4/48 < 0.10) -> LRU -> save b1, load a1's entry
    # (f_keep 42/42, sim 42/48 beat the slot's 4/42, 4/48) -> n_past = 42.
    run = simulate([a1, b1, a2], SlotManager(capacity_tokens=1024, n_parallel=1), check_invariants=True)
    assert by_id(run)["a2"].cached_tokens == 42
    run0 = simulate([a1, b1, a2], SlotManager(capacity_tokens=1024, n_parallel=1, cache_ram_mib=0))
    # without the RAM cache the LRU slot keeps only its LCP with a2: the 4 shared tokens
    assert by_id(run0)["a2"].cached_tokens == 4


def test_split_kv_rejects_prompts_over_the_slot_context():
    # -np 4 without -kvu: each slot gets 1024 // 4 = 256 cells; a 256-token prompt is rejected
    # (prompt_len >= n_ctx_slot), a 255-token one runs.
    m = SlotManager(capacity_tokens=1024, n_parallel=4)
    assert not m.kv_unified and m.n_ctx_slot == 256
    run = simulate([Request("big", 0, ids(0, 256), 4), Request("ok", 0, ids(0, 255), 1)], m)
    r = by_id(run)
    assert "context size" in r["big"].rejected
    assert r["ok"].rejected is None


def test_generation_stops_at_the_slot_context():
    # 1 slot of 64 cells, prompt 50, asks 40 new tokens: generation stops when
    # n_tokens + 1 >= 64, i.e. with 63 tokens in KV: 50 prompt + 13 decoded -> 14 sampled.
    run = simulate([Request("a", 0, ids(0, 50), 40)], SlotManager(capacity_tokens=64, n_parallel=1))
    rec = run.requests[0]
    assert rec.truncated and rec.output_tokens == 14


def test_slots_cap_concurrency_and_defer_fifo():
    # -np auto = 4 slots: 6 simultaneous requests run 4 at a time; the 5th and 6th wait (FIFO).
    reqs = [Request(f"r{i}", 0, ids(1000 * i, 10), 5) for i in range(6)]
    run = simulate(reqs, SlotManager(capacity_tokens=4096), check_invariants=True)
    assert run.summary["peak_concurrency"] == 4
    r = by_id(run)
    assert r["r4"].queue_s > 0 and r["r5"].queue_s > 0 and r["r3"].queue_s == 0


def test_bad_options():
    from inferlab.errors import InvalidValueError, NotSupportedError
    with pytest.raises(NotSupportedError):
        SlotManager(capacity_tokens=1024, cache_reuse=256)
    with pytest.raises(InvalidValueError):
        SlotManager(capacity_tokens=1024, n_parallel=0)

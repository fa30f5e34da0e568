"""llama.cpp server hand-worked cases; each expected figure is derived in a comment from the
server's rules (docs/engines/llamacpp.md cites the functions). tests/conformance checks the same
rules against a real llama-server."""

import pytest

from inferlab.errors import InvalidValueError
from inferlab.kv.llamacpp import PromptCache, seq_state_bytes
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


def test_fresh_server_takes_the_highest_slot_first():
    # get_available_slot keeps the *last* idle slot with t_last_used <= t_last: never-used slots
    # all read -1, so a fresh -np 4 server gives a slot 3, then b slot 2 (slot 3 now has a time),
    # c slot 1, d slot 0. 2024 builds (strict <) went 0, 1, 2, 3.
    reqs = [Request(k, 10 * i, ids(1000 * i, 20), 2) for i, k in enumerate("abcd")]
    m = SlotManager(capacity_tokens=4096, cache_ram_mib=0)
    simulate(reqs, m, check_invariants=True)
    assert [m.slot_of(k) for k in "abcd"] == [3, 2, 1, 0]
    old = SlotManager(capacity_tokens=4096, n_parallel=4, kv_unified=True, version="2024")
    simulate(reqs, old)
    assert [old.slot_of(k) for k in "abcd"] == [0, 1, 2, 3]


def test_prefix_in_another_busy_slot_gives_no_reuse():
    # a holds a slot while decoding; b shares a's 40-token prefix but that slot is busy, so b takes
    # the other (empty) slot: n_past = 0. There is no sharing between slots.
    reqs = [Request("a", 0, ids(0, 40), 50), Request("b", 5, ids(0, 40) + ids(900, 10), 2)]
    m = SlotManager(capacity_tokens=1024, n_parallel=2, cache_ram_mib=0)
    run = simulate(reqs, m, check_invariants=True)
    assert by_id(run)["b"].cached_tokens == 0
    assert (m.slot_of("a"), m.slot_of("b")) == (1, 0)


def test_similarity_beats_lru():
    # Two idle slots: slot 1 holds a's conversation (30 prompt + 4 reply - 1 = 33 tokens), slot 0
    # holds b's. c continues a (sim = 33/40 > 0.10) although slot 1 is less recently used: it
    # lands in slot 1 and reuses 33 tokens.
    a_reply = ids(500, 4)
    reqs = [Request("a", 0, ids(0, 30), 4, output=a_reply), Request("b", 10, ids(200, 30), 4),
            Request("c", 20, ids(0, 30) + a_reply + ids(700, 6), 2)]
    m = SlotManager(capacity_tokens=1024, n_parallel=2, cache_ram_mib=0)
    run = simulate(reqs, m, check_invariants=True)
    assert by_id(run)["c"].cached_tokens == 33
    assert m.slot_of("c") == m.slot_of("a") == 1


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


def test_split_kv_pads_each_slot_to_256():
    # -c 1000 -np 3: n_ctx = pad256(1000) = 1024, per slot pad256(1024 // 3 = 341) = 512, so the
    # buffer holds 3 x 512 = 1536 cells (not 1000 // 3 = 333 each). A 511-token prompt runs, a
    # 512-token one fails (prompt_len >= n_ctx_slot).
    m = SlotManager(capacity_tokens=1000, n_parallel=3)
    assert (m.n_ctx_slot, m.capacity_tokens) == (512, 1536)
    run = simulate([Request("ok", 0, ids(0, 511), 1), Request("big", 100, ids(0, 512), 1)], m)
    r = by_id(run)
    assert r["ok"].rejected is None and "exceeds the available context size" in r["big"].rejected
    # unified: one buffer of pad256(-c) cells
    assert SlotManager(capacity_tokens=1000).n_ctx_slot == 1024


def test_too_long_prompt_takes_and_touches_a_slot_before_failing():
    # Split -np 2 -c 512: 256 cells per slot. a -> slot 1 (fresh server: highest id). big (300
    # tokens) -> LRU picks slot 0 (t = -1); only update_slots sees it is too long, and release()
    # stamps slot 0 with a time later than slot 1's. So c (unrelated) gets slot 1 by LRU; had
    # the rejection happened on arrival, c would have found slot 0 untouched (t = -1).
    reqs = [Request("a", 0, ids(0, 100), 2), Request("big", 100, ids(5000, 300), 2),
            Request("c", 200, ids(9000, 50), 2)]
    m = SlotManager(capacity_tokens=512, n_parallel=2, cache_ram_mib=0)
    run = simulate(reqs, m, check_invariants=True)
    r = by_id(run)
    assert "exceeds the available context size" in r["big"].rejected
    assert (m.slot_of("a"), m.slot_of("big"), m.slot_of("c")) == (1, 0, 1)


def test_full_unified_buffer_purges_the_first_idle_slot_by_id():
    # Unified -c 256, -np 3, no RAM cache. a (100 + 1 - 1 = 100 tokens kept) -> slot 2, b -> slot 1,
    # each 100 cells. c (100 new tokens) -> slot 0: 56 cells free < 100 -> try_clear_idle_slots
    # purges the first idle non-empty slot by id, slot 1 (b), not the least recently used (a).
    reqs = [Request(k, 10 * i, ids(1000 * i, 100), 1) for i, k in enumerate("abc")]
    reqs.append(Request("a2", 40, ids(0, 100) + ids(7000, 5), 1))
    m = SlotManager(capacity_tokens=256, n_parallel=3, kv_unified=True, cache_ram_mib=0)
    run = simulate(reqs[:3], m, check_invariants=True)
    assert [s.n_tokens for s in m.slots] == [100, 0, 100]
    # a's conversation survived in slot 2: its follow-up reuses all 100 tokens
    run = simulate(reqs, SlotManager(capacity_tokens=256, n_parallel=3, kv_unified=True, cache_ram_mib=0))
    assert by_id(run)["a2"].cached_tokens == 100


def test_context_exceeded_releases_running_slots_in_id_order():
    # Unified -c 256, -np 2, no RAM cache; a and b (100-token prompts, 100 new tokens) arrive
    # together: a -> slot 1, b -> slot 0. Prefill 200 cells, then 2 cells per step: after 28
    # decode steps 256 are used and the next step finds no room even for one token -> "Context
    # size has been exceeded": slot 0 then slot 1 are released (t_last_used 1 and 2) and cleared.
    # c then takes the least recently used slot, 0; d slot 1.
    reqs = [Request("a", 0, ids(0, 100), 100), Request("b", 0, ids(1000, 100), 100),
            Request("c", 1000, ids(2000, 10), 2), Request("d", 1000, ids(3000, 10), 2)]
    m = SlotManager(capacity_tokens=256, n_parallel=2, kv_unified=True, cache_ram_mib=0)
    run = simulate(reqs, m, check_invariants=True)
    r = by_id(run)
    assert r["a"].rejected == r["b"].rejected == "Context size has been exceeded."
    # 1 token sampled after the prompt, then one per decode step: 1 + 28 = 29 each
    assert r["a"].output_tokens == r["b"].output_tokens == 29
    assert (m.slot_of("a"), m.slot_of("b"), m.slot_of("c"), m.slot_of("d")) == (1, 0, 0, 1)


def test_cache_reuse_shifts_a_matching_chunk():
    # One slot holds S(10) + Y(3) + X(20) (a, 1 new token: 33 + 1 - 1 = 33 kept). b = S + X + Z(5):
    # the common prefix is S (10); --cache-reuse 4 then skips Y in the cache and finds X (20
    # tokens >= 4) at b's position 10: n_past = 10 + 20 = 30. Without it: 10. With a minimum
    # chunk of 21 the 20-token chunk is too short: 10.
    S, Y, X, Z = ids(0, 10), ids(100, 3), ids(200, 20), ids(300, 5)
    reqs = [Request("a", 0, S + Y + X, 1), Request("b", 10, S + X + Z, 1)]
    for reuse, want in ((4, 30), (0, 10), (21, 10)):
        run = simulate(reqs, SlotManager(capacity_tokens=512, n_parallel=1, cache_ram_mib=0, cache_reuse=reuse),
                       check_invariants=True)
        assert by_id(run)["b"].cached_tokens == want, reuse


def test_ram_cache_entry_is_the_whole_sequence_state():
    # llama_kv_cache::state_write, one stream, 4 layers, K+V 4,096 B per token:
    # 4 (n_stream) + 4 (cell count) + 8 (v_trans, n_layer) + 4 x 24 (K/V headers)
    # + 100 x (12 cell metadata + 4,096) = 112 + 410,800 = 410,912 bytes.
    assert seq_state_bytes(100, kv_bytes_per_token=4096, n_layers=4, n_stream=1) == 410_912
    # split KV with -np 4: three more empty-stream cell counts
    assert seq_state_bytes(100, kv_bytes_per_token=4096, n_layers=4, n_stream=4) == 410_924
    assert seq_state_bytes(0, kv_bytes_per_token=4096, n_layers=4, n_stream=1) == 8


def test_ram_cache_skips_an_oversize_state_and_keeps_older_entries():
    # 1 MiB = 1,048,576 B; 255 tokens take 112 + 255 x 4,108 = 1,047,652 B (fit), 256 tokens
    # 1,051,760 B (over the whole limit: skipped, the older entry stays).
    size = lambda n: seq_state_bytes(n, kv_bytes_per_token=4096, n_layers=4, n_stream=1)  # noqa: E731
    cache = PromptCache(2**20, 4096)
    assert cache.alloc(((0, 100),), 100, size(100))
    assert not cache.alloc(((1000, 256),), 256, size(256))
    assert [e.n_tokens for e in cache.states] == [100]
    # 255 tokens fit the limit only alone: the 100-token entry is evicted to make room
    assert cache.alloc(((2000, 255),), 255, size(255))
    assert [e.n_tokens for e in cache.states] == [255]
    # a prompt already contained in an entry is not saved again
    assert not cache.alloc(((2000, 50),), 50, size(50))


def test_ram_cache_without_a_byte_limit_keeps_n_ctx_tokens():
    # --cache-ram -1: no byte limit, but update() still caps the entries at n_ctx tokens, oldest out.
    cache = PromptCache(0, 300)
    for k in range(4):
        cache.alloc(((1000 * k, 100),), 100, 1)
        cache.update()
    assert [e.runs[0][0] for e in cache.states] == [1000, 2000, 3000]


def test_generation_stops_at_the_slot_context():
    # 1 slot of 256 cells (-c 256), prompt 240, asks 40 new tokens: process_token stops when
    # n_tokens + 1 >= 256 with n_tokens = 240 + (k - 1) after the k-th sample: k = 16.
    run = simulate([Request("a", 0, ids(0, 240), 40)], SlotManager(capacity_tokens=256, n_parallel=1))
    rec = run.requests[0]
    assert rec.truncated and rec.output_tokens == 16


def test_slots_cap_concurrency_and_defer_fifo():
    # -np auto = 4 slots: 6 simultaneous requests run 4 at a time; the 5th and 6th wait.
    reqs = [Request(f"r{i}", 0, ids(1000 * i, 10), 5) for i in range(6)]
    m = SlotManager(capacity_tokens=4096)
    run = simulate(reqs, m, check_invariants=True)
    assert run.summary["peak_concurrency"] == 4
    r = by_id(run)
    assert r["r4"].queue_s > 0 and r["r5"].queue_s > 0 and r["r3"].queue_s == 0
    # r0..r3 (slots 3, 2, 1, 0) finish in one step and are released in slot-id order: slot 0
    # (t 1), 1 (t 2), 2, 3. Each release hands the oldest deferred task to the *front* of the
    # queue: r4 after the first, then r5 before it. So r5 launches first and takes the least
    # recently used slot, 0; r4 then slot 1.
    assert (m.slot_of("r5"), m.slot_of("r4")) == (0, 1)


def test_bad_settings_are_typed_errors():
    with pytest.raises(InvalidValueError):
        SlotManager(capacity_tokens=1024, cache_reuse=-1)
    with pytest.raises(InvalidValueError):
        SlotManager(capacity_tokens=1024, n_parallel=0)
    with pytest.raises(InvalidValueError):
        SlotManager(capacity_tokens=1024, cache_ram_mib=-2)

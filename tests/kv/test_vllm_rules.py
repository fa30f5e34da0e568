"""vLLM v1's scheduler rules, step by step, worked out by hand (vLLM 0.33.0's
vllm/v1/core/sched/scheduler.py, sched/utils.py check_stop, v1/engine/input_processor.py,
v1/core/kv_cache_manager.py, block_pool.py; docs/engines/vllm.md sections 6-8).

Each step's work is read with a recording cost function: the simulator prices every step as
``cost(prefill tokens, decode tokens, context tokens)`` (the tokens computed in the step, and the
KV tokens the batch attends to: each scheduled request's num_computed after its tokens), so the
per-step triples below are the scheduler's decisions, derived in the comments.
"""

import pytest

from inferlab.kv.vllm.block_pool import FreeBlockQueue
from inferlab.kv_managers import PagedManager, Request, simulate

from _recorded_steps import ids, steps_of


def test_the_last_prompt_token_of_a_chunked_prefill_counts_as_prefill():
    # 18-token prompt, 3 new tokens, budget 17 tokens a step, blocks of 16.
    # step 0: admitted, num_new = min(18, 17) = 17 prompt tokens (chunked), nothing sampled -> (17, 0, 17)
    # step 1: the running loop schedules the 1 prompt token left (c 17 -> 18, inside block 1) and
    #         samples token 1                                                          -> (1, 0, 18)
    # steps 2, 3: one decode token each (c 18 -> 19 -> 20), tokens 2 and 3; 18 + 3 - 1 = 20 KV tokens
    #         at the end                                                               -> (0, 1, 19), (0, 1, 20)
    reqs = [Request("a", 0, ids(0, 18), 3)]
    for ff in (True, False):
        run, steps = steps_of(reqs, PagedManager(capacity_tokens=1024, max_num_batched_tokens=17), fast_forward=ff)
        assert steps == [(17, 0, 17), (1, 0, 18), (0, 1, 19), (0, 1, 20)], ff
        assert run.summary["prefill_tokens_total"] == 18 and run.summary["output_tokens"] == 3


@pytest.mark.parametrize("mode", ["decode clock", "per-request loop", "max_model_len"])
def test_one_decode_token_per_step_across_a_block_boundary(mode):
    # 14-token prompt, 6 new tokens, blocks of 16. Step 0 prefills 14 and samples token 1; steps 1-5
    # decode one token each: c = 14 -> 15 (inside block 0), 15 -> 16 (fills block 0: registered),
    # 16 -> 17 (starts block 1: a new block), 17 -> 18, 18 -> 19; token 6 is sampled at c = 19.
    # Context per step = c after the step's token. The same whichever path does the work: the
    # decode batch on the clock, the per-request loop (decode_clock off), or with max_model_len
    # (100: never reached; every decode goes through allocate_slots' general path).
    want = [(14, 0, 14), (0, 1, 15), (0, 1, 16), (0, 1, 17), (0, 1, 18), (0, 1, 19)]
    m = PagedManager(capacity_tokens=1024, max_model_len=100 if mode == "max_model_len" else None)
    if mode == "per-request loop":
        m.decode_clock = False
    run, steps = steps_of([Request("a", 0, ids(0, 14), 6)], m, fast_forward=False)
    assert steps == want
    # two requests side by side: each step's decode count is the batch size, 2
    m2 = PagedManager(capacity_tokens=1024, max_model_len=100 if mode == "max_model_len" else None)
    if mode == "per-request loop":
        m2.decode_clock = False
    _, steps2 = steps_of([Request("a", 0, ids(0, 14), 6), Request("b", 0, ids(500, 14), 6)], m2, fast_forward=False)
    assert steps2 == [(28, 0, 28)] + [(0, 2, 2 * c) for c in (15, 16, 17, 18, 19)]


def test_a_decode_that_finds_no_free_block_preempts_the_newest_request():
    # Blocks of 4, capacity 20 tokens: 5 blocks, block 0 is the null block -> 4 usable.
    # a and b (4-token prompts, 6 new tokens each, nothing shared) both arrive at 0.
    # step 0: admit a (1 block; 0.33's gate: the whole 4-token prompt fits), then b (1 block); both
    #         prefill 4 and sample token 1; 2 free                                  -> (8, 0, 8)
    # step 1: c 4 -> 5 each: each starts a block (2 -> 0 free)                     -> (0, 2, 10)
    # steps 2-4: c -> 6, 7, 8 each (c 7 -> 8 fills block 1: registered)            -> (0, 2, 12) (0, 2, 14) (0, 2, 16)
    # step 5: a's token 8 -> 9 starts a block; the free queue is empty: preempt the most recently
    #         admitted running request, b (FCFS: running.pop()); its 2 blocks go back tail block first
    #         (queue [b's 2nd, b's 1st], both hashed); a takes the head (b's 2nd block, evicting its
    #         hash), computes c = 9 and samples its 6th token: done. No admission in a step that
    #         preempted                                                               -> (0, 1, 9)
    # step 6: a freed (its 3rd block unhashed: 0.33 puts it at the head). b (num_tokens 4 + 5 = 9)
    #         looks up at most 8 tokens = 2 blocks: its 1st block still hashed (hit, 4 tokens), its
    #         2nd evicted: num_new = 9 - 4 = 5; computes c = 9 and samples its 6th token -> (5, 0, 9)
    # b: 1 preemption, 9 - 4 = 5 tokens recomputed, 0 cached at first admission.
    reqs = [Request("a", 0, ids(0, 4), 6), Request("b", 0, ids(100, 4), 6)]
    for clock in (True, False):
        m = PagedManager(capacity_tokens=20, block_size=4)
        m.decode_clock = clock
        run, steps = steps_of(reqs, m, fast_forward=False)
        assert steps == [(8, 0, 8), (0, 2, 10), (0, 2, 12), (0, 2, 14), (0, 2, 16), (0, 1, 9), (5, 0, 9)], clock
        a, b = run.requests
        assert (a.preemptions, b.preemptions) == (0, 1)
        assert (b.recomputed_tokens, b.cached_tokens, b.output_tokens) == (5, 0, 6)
        assert run.summary["preemptions"] == 1 and run.summary["recomputed_tokens"] == 5
        assert run.summary["prefill_tokens_total"] == 8 + 5
        assert (a.finish_s, b.finish_s) == (6.0, 7.0)
        # 0.33's PrefixCacheStats at admission: a and b first (4 + 4 queried, 0 hit); b's resume
        # counts apart (preempted: 9 queried, 4 hit)
        assert (m.kv.queries, m.kv.hits, m.kv.preempted_queries, m.kv.preempted_hits) == (8, 0, 9, 4)


def test_max_model_len_caps_prompt_plus_output():
    # check_stop: a request stops when num_tokens (prompt + output) reaches max_model_len; the input
    # processor refuses a prompt of max_model_len tokens or more (no room for one output token).
    # max_model_len 12: a 10-token prompt yields 12 - 10 = 2 tokens (truncated, asked 10), an
    # 11-token one 1, a 3-token one 9 of 20; a 10-token prompt asking 2 gets them, not truncated;
    # a 12-token prompt is refused. (Checked against vLLM 0.33.0's own Scheduler with
    # max_model_len=12: 2, 1, 9 output tokens.)
    def one(prompt, out):
        run = simulate([Request("a", 0, ids(100, prompt), out)],
                       PagedManager(capacity_tokens=256, block_size=4, max_model_len=12), check_invariants=True)
        r = run.requests[0]
        return r.output_tokens, r.truncated, r.rejected is not None

    assert one(10, 10) == (2, True, False)
    assert one(11, 5) == (1, True, False)
    assert one(3, 20) == (9, True, False)
    assert one(10, 2) == (2, False, False)
    assert one(12, 3) == (0, False, True)


def test_max_model_len_bounds_the_blocks_a_request_needs():
    # capacity 64 in blocks of 16: 4 blocks, 3 usable (48 tokens). With max_model_len 49 a request
    # holds at most 49 - 1 = 48 tokens of KV (it stops at num_tokens = 49, the last sampled token
    # never computed): a 40-token prompt asking 100 fits in 3 blocks and yields 49 - 40 = 9 tokens;
    # with max_model_len 50 it would need 49 tokens = 4 blocks: refused.
    ok = simulate([Request("a", 0, ids(0, 40), 100)], PagedManager(capacity_tokens=64, max_model_len=49),
                  check_invariants=True)
    assert (ok.summary["finished"], ok.requests[0].output_tokens, ok.requests[0].truncated) == (1, 9, True)
    no = simulate([Request("a", 0, ids(0, 40), 100)], PagedManager(capacity_tokens=64, max_model_len=50))
    assert no.summary["rejected"] == 1


def test_decode_fast_forward_stops_before_max_model_len():
    # With max_model_len 40 a 10-token prompt yields 30 tokens whatever it asks (100): the decode
    # fast-forward (stretches of pure decode steps applied at once) must stop short of the step
    # that reaches num_tokens = 40: same tokens, steps and per-step contexts as stepping one by one.
    # Steps: prefill (10, 0, 10), then 29 decodes with c = 11 .. 39.
    want = [(10, 0, 10)] + [(0, 1, c) for c in range(11, 40)]
    for ff in (True, False):
        run, steps = steps_of([Request("a", 0, ids(0, 10), 100)], PagedManager(capacity_tokens=1024, max_model_len=40),
                              fast_forward=ff)
        assert steps == want, ff
        assert run.requests[0].output_tokens == 30 and run.summary["steps"] == 30


def test_compaction_of_the_free_queue_keeps_its_order():
    # FreeBlockQueue drops touched blocks lazily and rebuilds its lists once more than COMPACT_AT
    # (4096) stale copies make up over half of it, and drops its consumed front once more than
    # 4096 entries were popped; the queue (head to tail) must stay what a plain list gives.
    # Blocks 1..10000 free; hits touch 1..3000 (3000 stale: no rebuild), then 3001..6000 (6000 stale
    # of 10000: rebuilt to 6001..10000); 10 pops give 6001..6010; 1..5000 freed again at the tail
    # (8990 entries); 4100 pops (4110 consumed, not over half: kept), then 400 (4510 of 8990: the
    # consumed front is dropped); left: 511..5000.
    q = FreeBlockQueue([], list(range(1, 10001)))
    q.remove_n(list(range(1, 3001)))
    assert len(q) == 7000 and q.num_stale == 3000
    q.remove_n(list(range(3001, 6001)))
    assert len(q) == 4000 and q.num_stale == 0 and q.tail[0] == 6001  # rebuilt from the live blocks
    got, keys = q.popleft_n(10)
    assert got == list(range(6001, 6011)) and keys == [None] * 10
    q.append_n(list(range(1, 5001)), [None] * 5000)  # 5000 blocks freed again, at the tail
    got, _ = q.popleft_n(4100)  # 4110 consumed of 8990 entries: not yet over half
    assert got == list(range(6011, 10001)) + list(range(1, 111)) and q.start == 4110
    got, _ = q.popleft_n(400)  # 4510 consumed of 8990: over half: the consumed front is dropped
    assert got == list(range(111, 511)) and q.start == 0
    assert [b for b, _ in q.items()] == list(range(511, 5001)) and len(q) == 4490


def test_a_block_hash_chains_its_parent_so_a_lookalike_block_lends_nothing():
    # vLLM hashes block i as hash(parent block's hash, block i's tokens): equal tokens under a
    # different parent are a different block. Blocks of 4, 4 usable blocks (capacity 20).
    # P (13 tokens: [0..3] [100..103] [500..503] [900], 1 new token) runs alone: 4 blocks p0..p3;
    #   p0..p2 registered, p3 (1 token) not. Freed: 0.33 puts the unhashed p3 at the head, the
    #   hashed ones tail block first: queue [p3, p2, p1, p0].
    # Q (12 tokens: [0..3] [200..203] [500..503]) at 10: looks up 11 tokens = 2 blocks: block 0
    #   hits p0 (same tokens, same parent), block 1 misses. Needs 3 - 1 = 2 new blocks: p3, then p2
    #   (evicting P's block 2). Q's block 2 holds P's block-2 tokens under another parent: its hash
    #   differs from P's. Q freed: queue [p1, p2, p3, p0].
    # R (P's prompt again) at 20: looks up 12 tokens = 3 blocks: p0 hits, p1 (P's block 1, still
    #   hashed) hits, P's block 2 was evicted and Q's lookalike does not count: 8 tokens hit.
    P = ids(0, 4) + ids(100, 4) + ids(500, 4) + [900]
    Q = ids(0, 4) + ids(200, 4) + ids(500, 4)
    reqs = [Request("P", 0, P, 1), Request("Q", 10, Q, 1), Request("R", 20, P, 1)]
    run = simulate(reqs, PagedManager(capacity_tokens=20, block_size=4), check_invariants=True)
    assert [r.cached_tokens for r in run.requests] == [0, 4, 8]


def test_allocate_slots_for_a_decode_token_inside_a_block_does_nothing():
    # KVCacheManager.allocate_slots (vLLM: num_tokens_need_slot = num_computed + 1; blocks needed =
    # cdiv(that, block_size) - held): a decode token at c = 5 in blocks of 4 (held: 2 blocks for
    # tokens 0-7) needs no block and fills none (6 // 4 = 1 full block, registered already).
    from inferlab.kv.vllm.kv_cache_manager import KVCacheManager, VllmRequest

    for mml in (None, 64):
        kv = KVCacheManager(10, block_size=4, enable_prefix_caching=True, max_model_len=mml,
                            watermark_blocks=0, version="0.33")
        req = VllmRequest(Request("a", 0, ids(0, 5), 4), 0)
        assert kv.allocate_slots(req, 5, admitting=True, running=False)  # the prompt: 2 blocks, 1 full
        req.num_computed, req.num_output = 5, 1
        free = kv.pool.num_free
        assert (len(req.blocks), req.num_cached_blocks, free) == (2, 1, 9 - 2)
        assert kv.allocate_slots(req, 1)  # c 5 -> 6: inside block 1
        assert (len(req.blocks), req.num_cached_blocks, kv.pool.num_free) == (2, 1, free)
        req.num_computed, req.num_output = 7, 3
        assert kv.allocate_slots(req, 1)  # c 7 -> 8: fills block 1: registered, no new block
        assert (len(req.blocks), req.num_cached_blocks, kv.pool.num_free) == (2, 2, free)
        req.num_computed, req.num_output = 8, 4
        assert kv.allocate_slots(req, 1)  # c 8 -> 9: starts block 2
        assert (len(req.blocks), req.num_cached_blocks, kv.pool.num_free) == (3, 2, free - 1)


def test_a_resumed_request_with_all_but_one_token_cached_is_one_decode_token():
    # Blocks of 4, 4 usable (capacity 20). x: prompt [0..3], reply 100..107 (given); b arrives at 4
    # with x's prompt + x's first 4 reply tokens as its prompt and x's next 4 as its reply: b's
    # tokens are x's tokens.
    # steps 0-3: x prefills 4 (block x0), then decodes c 4 -> 8 (block x1 from c 4 -> 5)
    #            -> (4, 0, 4), (0, 1, 5), (0, 1, 6), (0, 1, 7)
    # step 4: x 7 -> 8 fills x1 (registered). b: looks up (8 - 1) // 4 = 1 block: x0 hits; computes
    #         4 tokens in a new block b1 (registered under x1's hash: a duplicate) and samples
    #         -> (4, 1, 8 + 8); 1 block free
    # step 5: x 8 -> 9 starts a block: takes the last free one. b 8 -> 9 needs one: none free, the
    #         newest running request is b itself: preempted (b1 freed, hashed; x0 stays with x)
    #         -> (0, 1, 9)
    # step 6: x 9 -> 10. b (9 tokens) looks up 2 blocks: x0 and x1 (the first block registered
    #         under that hash) hit 8 tokens; num_new = 1, one new block (b1 again): a token
    #         past the prompt with a token already sampled is a decode token  -> (0, 2, 10 + 9)
    # step 7: x 10 -> 11 samples its 8th token (done); b 9 -> 10          -> (0, 2, 11 + 10)
    # step 8: b 10 -> 11 samples its 4th token (done)                     -> (0, 1, 11)
    # b: 4 cached at first admission, 1 preemption, 9 - 8 = 1 token recomputed. (The same as vLLM
    # 0.33.0's own Scheduler on these requests: b scheduled 4, 1, 1, 1 tokens, finishing at step 9.)
    reqs = [Request("x", 0, ids(0, 4), 8, output=ids(100, 8)),
            Request("b", 4, ids(0, 4) + ids(100, 4), 4, output=ids(104, 4))]
    run, steps = steps_of(reqs, PagedManager(capacity_tokens=20, block_size=4), fast_forward=False)
    assert steps == [(4, 0, 4), (0, 1, 5), (0, 1, 6), (0, 1, 7), (4, 1, 16), (0, 1, 9), (0, 2, 19), (0, 2, 21),
                     (0, 1, 11)]
    x, b = run.requests
    assert (b.cached_tokens, b.preemptions, b.recomputed_tokens) == (4, 1, 1)
    assert (x.finish_s, b.finish_s) == (8.0, 9.0)


def test_defaults_are_the_api_servers_on_a_small_gpu():
    # EngineArgs.get_batch_defaults (vllm serve, GPUs under 70 GiB): max_num_batched_tokens 2048,
    # max_num_seqs 256.
    # 257 one-token prompts (2 new tokens each) at once: step 0 admits 256 (max_num_seqs; 256 of the
    # 2048-token budget), the 257th waits; step 1 decodes the 256 (they finish); step 2 admits it.
    reqs = [Request(k, 0, [k], 2) for k in range(257)]
    run, steps = steps_of(reqs, PagedManager(capacity_tokens=16 * 300))
    assert steps[:3] == [(256, 0, 256), (0, 256, 512), (1, 0, 1)]
    assert [r.queue_s for r in run.requests].count(0.0) == 256 and run.requests[-1].queue_s == 2.0
    # a 3000-token prompt is chunked to the 2048-token budget: 2048, then 952 (sampling its token)
    run, steps = steps_of([Request("a", 0, ids(0, 3000), 1)], PagedManager(capacity_tokens=16 * 300))
    assert steps == [(2048, 0, 2048), (952, 0, 3000)]


def test_freeing_a_table_whose_shared_block_is_not_a_prefix():
    # Blocks of 4, 49 usable (capacity 200); 0.33's free queue starts as blocks 1..49, all unhashed.
    # D ([0..3], 1 new) at 0: block 1, registered as k0; freed at once (hashed, to the tail).
    # R ([0..3], reply 10..17) at 1 looks up (4 - 1) // 4 = 0 blocks: computes its own block 2 under
    #   k0 (a duplicate: lookups still return block 1); block 3 from c 4 -> 5, filled at c 8 and
    #   registered as k1; block 4 from c 8 -> 9 (step 6).
    # S ([0..3] [10..13] [20], 2 new) at 6 looks up 2 blocks: k0 -> block 1 (free: taken out of the
    #   queue), k1 -> block 3 (R's): 8 tokens hit; one new block, 5. S's table [1, 3, 5]: its shared
    #   block (3) is not a prefix of it, so freeing S goes block by block, tail first: 5 (no hash) to
    #   the head, 3 only loses S's reference, 1 (hashed) to the tail. R then frees [2, 3, 4]: 4 (no
    #   hash) to the head, 3 and 2 (hashed, tail first) to the tail.
    # Queue at the end, head to tail: 4, 5, 6 .. 49, 1, 3, 2 (the same in vLLM 0.33.0's BlockPool).
    reqs = [Request("D", 0, ids(0, 4), 1), Request("R", 1, ids(0, 4), 8, output=ids(10, 8)),
            Request("S", 6, ids(0, 4) + ids(10, 4) + [20], 2)]
    m = PagedManager(capacity_tokens=200, block_size=4)
    run = simulate(reqs, m, check_invariants=True)
    assert [r.cached_tokens for r in run.requests] == [0, 0, 8]
    assert m.free_queue() == [4, 5, *range(6, 50), 1, 3, 2]


def test_the_last_token_of_the_budget_goes_to_a_running_request():
    # max_num_batched_tokens 2, max_num_seqs 2, max_model_len 100 (so every request goes through the
    # per-request loop). A and B: 2-token prompts, 3 new tokens, at 0.
    # step 0: A admitted with the whole budget (2 tokens), samples; B waits (no budget) -> (2, 0, 2)
    # step 1: A decodes (1 left); B admitted with a 1-token chunk                        -> (1, 1, 3 + 1)
    # step 2: A decodes its 3rd token (done); the last budget token goes to B's last prompt
    #         token (running requests first): B samples                                  -> (1, 1, 4 + 2)
    # steps 3, 4: B decodes                                                              -> (0, 1, 3), (0, 1, 4)
    # (vLLM 0.33.0's Scheduler schedules B 1, 1, 1, 1 tokens in steps 1-4 too.)
    reqs = [Request("A", 0, ids(0, 2), 3), Request("B", 0, ids(100, 2), 3)]
    m = PagedManager(capacity_tokens=1024, max_num_batched_tokens=2, max_num_seqs=2, max_model_len=100)
    run, steps = steps_of(reqs, m)
    assert steps == [(2, 0, 2), (1, 1, 4), (1, 1, 6), (0, 1, 3), (0, 1, 4)]
    assert [r.finish_s for r in run.requests] == [3.0, 5.0]


@pytest.mark.parametrize("ff", [True, False])
def test_decode_fast_forward_stops_where_the_free_blocks_run_out(ff):
    # Blocks of 4, 5 usable (capacity 24). a and b: 4-token prompts (nothing shared), 10 new tokens.
    # step 0: both admitted and prefilled (1 block each; 3 free)                   -> (8, 0, 8)
    # steps 1-4: c 4 -> 8 each (a block each at c 4 -> 5: 1 free)                  -> (0, 2, 10) .. (0, 2, 16)
    # step 5: a 8 -> 9 takes the last free block; b needs one: none, and b is the newest: preempted
    #         (its 2 hashed blocks back, tail block first: queue [b1, b0])          -> (0, 1, 9)
    # steps 6-8: a 9 -> 12. b (9 tokens) would hit b0, b1 (8 tokens) with 1 new block: 0.33's gate
    #         needs cdiv(9, 4) - 2 = 1 block + 2 free hits > 2 free: refused each step -> (0, 1, 10) .. (0, 1, 12)
    # step 9: a 12 -> 13 takes the head, b1 (evicting b's block-1 hash); a's 10th token: done -> (0, 1, 13)
    # step 10: b hits b0 only (4 tokens), computes 5 and samples its 6th token     -> (5, 0, 9)
    # steps 11-14: b 9 -> 13, its 10th token at step 14                             -> (0, 1, 10) .. (0, 1, 13)
    # A decode fast-forward must stop before the step where a block is missing (steps 1-4 may be
    # jumped over; step 5 must be stepped): the same steps either way.
    reqs = [Request("a", 0, ids(0, 4), 10), Request("b", 0, ids(100, 4), 10)]
    run, steps = steps_of(reqs, PagedManager(capacity_tokens=24, block_size=4), fast_forward=ff)
    assert steps == ([(8, 0, 8)] + [(0, 2, 2 * c) for c in (5, 6, 7, 8)] + [(0, 1, c) for c in (9, 10, 11, 12, 13)]
                     + [(5, 0, 9)] + [(0, 1, c) for c in (10, 11, 12, 13)])
    a, b = run.requests
    assert (b.preemptions, b.recomputed_tokens, a.finish_s, b.finish_s) == (1, 5, 10.0, 15.0)

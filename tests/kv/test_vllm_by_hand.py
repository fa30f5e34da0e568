"""vLLM's admission bound and prefix-hit cap, worked out by hand from vLLM v1's rules
(Scheduler.add_request's length check against the KV pool, KVCacheManager.get_computed_blocks)."""

from inferlab.kv_managers import PagedManager, Request, simulate


def test_a_request_is_refused_when_its_last_sampled_token_needs_more_blocks_than_the_pool():
    # 64 tokens of cache in blocks of 16: 4 blocks, one of them vLLM's null block: 3 usable (48 tokens).
    # The last token sampled is never written to the cache: a 40-token prompt with 9 new tokens holds
    # 40 + 9 - 1 = 48 tokens at most (3 blocks: admitted); with 10 new tokens 49 (4 blocks: refused)
    assert PagedManager(capacity_tokens=64, block_size=16).usable_blocks == 3
    ok = simulate([Request("a", 0, list(range(40)), 9)], PagedManager(capacity_tokens=64, block_size=16))
    assert (ok.summary["finished"], ok.summary["rejected"]) == (1, 0)
    no = simulate([Request("a", 0, list(range(40)), 10)], PagedManager(capacity_tokens=64, block_size=16))
    assert (no.summary["finished"], no.summary["rejected"]) == (0, 1)


def test_an_identical_prompt_hits_whole_blocks_short_of_its_last_token():
    # at most num_tokens - 1 tokens can hit, in whole blocks of 16: a repeated 32-token prompt hits
    # 16 * ((32 - 1) // 16) = 16; a repeated 33-token prompt 16 * (32 // 16) = 32
    for n, hit in ((32, 16), (33, 32)):
        reqs = [Request("a", 0, list(range(n)), 4), Request("b", 100, list(range(n)), 4)]
        run = simulate(reqs, PagedManager(capacity_tokens=4096, block_size=16))
        assert {r.id: r.cached_tokens for r in run.requests}["b"] == hit, n

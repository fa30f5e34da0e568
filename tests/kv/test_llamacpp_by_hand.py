"""llama.cpp server's host-RAM prompt cache and slot sizing, worked out by hand from the server's
rules (tools/server/server-task.cpp server_prompt_cache alloc/update; server_context's n_ctx_slot)."""

import pytest

from inferlab.errors import InvalidValueError
from inferlab.kv.llamacpp.prompt_cache import PromptCache, seq_state_bytes
from inferlab.kv.llamacpp.server import SlotManager


def _runs(i: int, n: int = 100):
    return ((i * 10_000, n),)  # n consecutive ids of their own: no two entries share a prefix


def test_alloc_evicts_the_oldest_entries_until_the_new_one_fits():
    # a 1,000-byte cache holding A and B (400 bytes each): C (400) needs 1,200 -> drop A only (800 left)
    c = PromptCache(1000, 10_000)
    for i in range(3):
        assert c.alloc(_runs(i), 100, 400)
    assert [e.runs for e in c.states] == [_runs(1), _runs(2)] and c.size() == 800
    # an entry over the whole limit is skipped; the others stay
    assert not c.alloc(_runs(9), 100, 1001) and c.size() == 800
    # a prompt that is a prefix of an entry is not saved again
    assert not c.alloc(((10_000, 50),), 50, 10)


def test_update_raises_the_token_limit_to_what_the_bytes_hold():
    # 5 entries of 100 tokens x 10 bytes: 10 bytes per token; a 10,000-byte limit holds 1,000 tokens,
    # more than the 300-token limit, so the 500 tokens stay
    c = PromptCache(10_000, 300)
    for i in range(5):
        c.alloc(_runs(i), 100, 1000)
    c.update()
    assert c.n_tokens() == 500
    # no byte limit (-1 MiB -> 0): the token limit applies as given, the oldest go first: 3 entries stay
    d = PromptCache(0, 300)
    for i in range(5):
        d.alloc(_runs(i), 100, 1000)
    d.update()
    assert [e.runs for e in d.states] == [_runs(2), _runs(3), _runs(4)]


def test_state_size_of_one_sequence():
    # llama_state_seq_get_size: 4 + 4 per stream; with cells 8 + 24 per layer + (12 + KV bytes) per cell
    assert seq_state_bytes(0, kv_bytes_per_token=100, n_layers=2, n_stream=1) == 8
    assert seq_state_bytes(10, kv_bytes_per_token=100, n_layers=2, n_stream=4) == 4 + 16 + 8 + 48 + 10 * 112


def test_slot_context_is_capped_by_the_training_context():
    # -c 4096, -np auto (4 unified slots): each slot may use all 4,096 cells, unless trained on fewer
    assert SlotManager(4096).n_ctx_slot == 4096
    assert SlotManager(4096, n_ctx_train=2048).n_ctx_slot == 2048
    # split KV, -np 4: pad256(4096 / 4) = 1,024 cells a slot
    assert SlotManager(4096, n_parallel=4, kv_unified=False).n_ctx_slot == 1024
    with pytest.raises(InvalidValueError, match="cells per slot"):
        SlotManager(4096, n_ctx_train=1)  # a training context of 1 leaves one cell: the server refuses it


def test_ram_cache_limit_is_whole_mib_and_minus_one_is_unlimited():
    assert SlotManager(4096, cache_ram_mib=3).cache.limit_size == 3 * 2**20
    assert SlotManager(4096, cache_ram_mib=-1).cache.limit_size == 0  # no byte limit
    assert SlotManager(4096, cache_ram_mib=0).cache is None  # off
    assert SlotManager(4096).cache.limit_size == 8192 * 2**20  # the 2026 default, 8 GiB
    assert SlotManager(4096).cache.limit_tokens == 4096


@pytest.mark.parametrize("name,lowest", [("n_batch", 1), ("cache_reuse", 0), ("ctx_pad", 1), ("kv_bytes_per_token", 1),
                                         ("n_layers", 1)])
def test_integer_options_accept_their_lowest_value_and_refuse_one_less(name, lowest):
    SlotManager(4096, **{name: lowest})
    with pytest.raises(InvalidValueError, match=name):
        SlotManager(4096, **{name: lowest - 1})


def test_a_slot_is_chosen_by_similarity_only_above_the_threshold():
    # llama.cpp get_available_slot: a slot whose cached prompt shares more than --slot-prompt-similarity
    # (0.10) of the new prompt is taken; otherwise the least recently used one. A then B fill two slots;
    # C shares its first token with B: 1/10 = 0.10 is not above 0.10, so C takes A's older slot and
    # reuses nothing; sharing 2/10 = 0.20 it takes B's slot and reuses those 2 tokens
    from inferlab.kv_managers import Request, simulate

    def ids(s, n):
        return list(range(s, s + n))

    for shared, cached in ((1, 0), (2, 2)):
        reqs = [Request("A", 0, ids(0, 10), 2), Request("B", 100, ids(100, 10), 2),
                Request("C", 200, ids(100, shared) + ids(500, 10 - shared), 2)]
        run = simulate(reqs, SlotManager(4096, n_parallel=2, cache_ram_mib=0))
        assert {r.id: r.cached_tokens for r in run.requests}["C"] == cached, shared

"""Workloads, the seed's table, trace loaders and arrivals, bad input."""

import json

import pytest

from inferlab.errors import FileFormatError, InvalidValueError, UnknownNameError
from inferlab.kv.tokens import RunTokens, lcp, runs_of_list, slice_runs
from inferlab.kv.traces import (load_azure, load_mooncake, load_trace, prefix_hit_upper_bound,
                                repeated_block_fraction, retime)
from inferlab.kv.workloads import multi_turn_chats, seed_chat, shared_prefix_groups
from inferlab.kv_managers import PagedManager, RadixManager, Request, SlotManager, compare, simulate

from _paths import vendored

# vendored copies (tests/data/README.md): the whole Mooncake conversation trace, the Azure trace's first 200 requests
MOONCAKE = vendored("mooncake_conversation_trace.jsonl")
AZURE_HEAD = vendored("azure_llm_inference_conv_head.csv")


def test_run_tokens_match_lists():
    a = RunTokens([(5, 3), (8, 2), (20, 4)])
    assert list(a) == [5, 6, 7, 8, 9, 20, 21, 22, 23]
    assert a.runs == ((5, 5), (20, 4)) and a == list(a) and a[6] == 21
    assert runs_of_list(list(a)) == a.runs
    assert lcp(a.runs, runs_of_list([5, 6, 7, 8, 9, 20, 99])) == 6
    assert list(RunTokens(slice_runs(a.runs, 3, 7))) == [8, 9, 20, 21]


def test_seed_workload_has_the_seeds_totals():
    reqs = seed_chat()
    assert len(reqs) == 8
    assert sum(len(r.prompt) for r in reqs) == 652
    # each second turn starts with its first turn and reply
    first = {r.id.split("-")[0]: r for r in reqs if r.id.endswith("turn1")}
    for r in reqs:
        if r.id.endswith("turn2"):
            f = first[r.id.split("-")[0]]
            assert list(r.prompt)[: len(f.prompt) + len(f.output)] == list(f.prompt) + list(f.output)


def test_compare_reproduces_the_seed_order_and_figures():
    runs = compare(capacity_tokens=384)
    s = {k: v["summary"] for k, v in runs.items()}
    assert all(x["prompt_tokens"] == 652 for x in s.values())
    assert s["radix"]["prefill_computed"] < s["paged"]["prefill_computed"] < s["slots"]["prefill_computed"]
    assert s["radix"]["prefill_computed"] == 208  # the seed's figure
    assert abs(s["slots"]["prefill_computed"] - 376) <= 5
    assert abs(s["paged"]["prefill_computed"] - 268) <= 16
    assert s["slots"]["peak_concurrency"] == 4
    assert all(x["preemptions"] == 0 for x in s.values())


def test_shared_prefix_groups_and_chats():
    reqs = shared_prefix_groups(num_groups=3, prompts_per_group=4, system_prompt_len=64, question_len=8,
                                output_len=4)
    assert len(reqs) == 12 and all(len(r.prompt) == 72 for r in reqs)
    run = simulate(reqs, RadixManager(capacity_tokens=4096))
    # each group's system prompt is computed by the first of its requests admitted in round 1;
    # all 12 arrive at once and fit one round, so nothing is shared in that round
    assert run.summary["prefill_computed"] == 12 * 72
    chats = multi_turn_chats(num_chats=3, turns=3)
    assert [r.arrival_s for r in chats] == sorted(r.arrival_s for r in chats)
    run = simulate(chats, RadixManager(capacity_tokens=65536))
    assert run.summary["prefill_saved_frac"] > 0.5


def test_mooncake_loader_expands_hash_ids():
    reqs = load_mooncake(MOONCAKE, limit=50)
    d = json.loads((MOONCAKE).open().readline())
    r0 = reqs[0]
    assert len(r0.prompt) == d["input_length"] and r0.max_new_tokens == d["output_length"]
    assert r0.prompt[0] == d["hash_ids"][0] * 512 and r0.prompt[513] == d["hash_ids"][1] * 512 + 1
    # requests 0 and 1 share hash id 0 only: 512 common tokens
    assert lcp(reqs[0].prompt.runs, reqs[1].prompt.runs) == 512


def test_mooncake_upper_bound_is_36_6_percent():
    reqs = load_mooncake(MOONCAKE)
    assert len(reqs) == 12031
    assert repeated_block_fraction(reqs) == pytest.approx(0.366, abs=0.0005)


def test_no_manager_beats_the_unbounded_bound_on_a_mooncake_slice():
    reqs = load_mooncake(MOONCAKE, limit=300)
    bound = repeated_block_fraction(reqs)
    # token-level bound: per request, the longest prefix shared with any earlier prompt (L-1 cap)
    best = 0
    for i, r in enumerate(reqs):
        best += max((min(lcp(p.prompt.runs, r.prompt.runs), len(r.prompt) - 1) for p in reqs[:i]), default=0)
    token_bound = best / sum(len(r.prompt) for r in reqs)
    assert prefix_hit_upper_bound(reqs) == pytest.approx(token_bound)  # the fast bound agrees
    for m in (SlotManager(capacity_tokens=131072), PagedManager(capacity_tokens=262144),
              RadixManager(capacity_tokens=262144)):
        s = simulate(reqs, m, record_timeline=False).summary
        assert s["prefill_saved_frac"] <= token_bound + 1e-9, m.engine
    assert 0 < token_bound and bound > 0


def test_azure_loader():
    reqs = load_azure(AZURE_HEAD, limit=20)
    assert reqs[0].arrival_s == 0 and len(reqs[0].prompt) == 374 and reqs[0].max_new_tokens == 44
    assert reqs[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert lcp(reqs[0].prompt.runs, reqs[1].prompt.runs) == 0  # no prefix information


def test_malformed_traces(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}\n')
    with pytest.raises(FileFormatError, match="hash_ids"):
        load_mooncake(bad)
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n{oops\n')
    with pytest.raises(FileFormatError, match=":2: not valid JSON"):
        load_mooncake(bad)
    bad.write_text('{"timestamp": 5, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
                   '{"timestamp": 1, "input_length": 10, "output_length": 5, "hash_ids": [2]}\n')
    with pytest.raises(FileFormatError, match="sorted"):
        load_mooncake(bad)
    csv_ = tmp_path / "t.csv"
    csv_.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,3\n")
    with pytest.raises(FileFormatError, match="columns"):
        load_azure(csv_)
    with pytest.raises(UnknownNameError):
        load_trace(tmp_path / "t.parquet")


def test_arrivals():
    reqs = [Request(i, 5.0 * i, [i + 1], 1) for i in range(200)]
    assert all(r.arrival_s == 0 for r in retime(reqs, "at-once"))
    pois = retime(reqs, "poisson", rate=10.0, seed=1)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(pois, pois[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.25)
    with pytest.raises(InvalidValueError):
        retime(reqs, "poisson")
    with pytest.raises(UnknownNameError):
        retime(reqs, "burst")


def test_bad_requests():
    with pytest.raises(InvalidValueError, match="max_new_tokens"):
        Request("x", 0, [1, 2], -3)
    with pytest.raises(InvalidValueError, match="arrival_s"):
        Request("x", -1, [1, 2], 3)
    with pytest.raises(InvalidValueError, match="prompt"):
        Request("x", 0, [], 3)
    with pytest.raises(InvalidValueError, match="token ids"):
        Request("x", 0, [1, -2], 3)
    with pytest.raises(InvalidValueError, match="out of order"):
        simulate([Request("a", 5, [1], 1), Request("b", 1, [2], 1)], PagedManager(capacity_tokens=256))
    with pytest.raises(InvalidValueError, match="duplicate"):
        simulate([Request("a", 0, [1], 1), Request("a", 1, [2], 1)], PagedManager(capacity_tokens=256))
    with pytest.raises(InvalidValueError, match="capacity_tokens"):
        RadixManager(capacity_tokens=0)


@pytest.mark.slow
def test_whole_mooncake_trace_stays_under_the_bound():
    # 36.6 % of blocks repeat; in prompt tokens an unbounded cache could reuse 37.4 %.
    reqs = load_mooncake(MOONCAKE)
    bound = prefix_hit_upper_bound(reqs)
    assert 0.366 < bound < 0.38
    for m in (SlotManager(capacity_tokens=131072), RadixManager(capacity_tokens=131072)):
        s = simulate(reqs, m, record_timeline=False).summary
        assert s["finished"] + s["rejected"] == len(reqs)
        assert 0 < s["prefill_saved_frac"] <= bound, m.engine


@pytest.mark.slow
def test_unbounded_pool_without_overlap_reaches_the_bound():
    # Steps priced near zero: every request is done before the next arrives, so only the cache
    # decides. SGLang (token granular) reuses exactly the bound; vLLM loses at most the partial
    # 16-token block at the end of each shared prefix.
    from inferlab.kv.time_model import TimeModel

    reqs = load_mooncake(MOONCAKE, limit=300)
    bound = prefix_hit_upper_bound(reqs)
    instant = TimeModel.linear(prefill_tok_per_s=1e9, decode_step_s=1e-7)
    radix = simulate(reqs, RadixManager(capacity_tokens=1 << 28), time_model=instant, record_timeline=False)
    assert radix.summary["prefill_saved_frac"] == pytest.approx(bound)
    paged = simulate(reqs, PagedManager(capacity_tokens=1 << 28), time_model=instant, record_timeline=False)
    prompt = sum(len(r.prompt) for r in reqs)
    assert bound - 16 * len(reqs) / prompt <= paged.summary["prefill_saved_frac"] <= bound

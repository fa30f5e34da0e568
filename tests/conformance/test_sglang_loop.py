"""inferlab's RadixManager against SGLang's own scheduler loop (the wheel named in SGLANG_VERSION,
installed without its dependencies by scripts/test), request by request over whole workloads.

_sglang_loop.py drives SGLang's ``Scheduler`` (made without ``__init__``; its
``get_next_batch_to_run``, ``PrefillAdder``, ``ScheduleBatch``, ``retract_decode``, batch result
processors, ``RadixCache`` and token pools are SGLang's) with a stub model runner; inferlab's
``RadixManager(version="0.5.23")`` serves the same requests in ``simulate``. Per request both must
agree on the prompt tokens cached at first admission, the tokens recomputed at re-admissions,
the retractions, the first-token and finish steps and the tokens generated; per run on the
tokens hit at all admissions and on every eviction the tree is asked for (tokens asked, tokens
evicted, in order). Hand-made cases aim at one rule each; windows of the Mooncake conversation
trace (prefix reuse, millions of tokens evicted) and of the Azure conversation trace (a tight
pool: retractions) cover them together.

Known difference, not compared: with ``ignore_eos`` SGLang's adder takes a fixed-length path
(``add_one_req_ignore_eos``; running requests reserved at ratio 1.0) that inferlab does not
model; the stub never samples an EOS, so requests still stop at ``max_new_tokens`` (as a trace's
recorded output lengths do) and SGLang's default path with the new-token ratio is the one driven.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferlab.kv_managers import RadixManager, Request, simulate  # noqa: E402

SGLANG_VERSION = "0.5.23"  # the release driven; inferlab's version="0.5.23" models it
from _engine_import import engine_or_skip  # noqa: E402

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

loop = engine_or_skip("_sglang_loop", reason=f"SGLang {SGLANG_VERSION} is not installed: "
                           f"pip install --no-deps sglang=={SGLANG_VERSION} (scripts/test does)")


# the tree suite's cases (one rule each) run through the whole loop too; the rest are the loop's own
from test_sglang_conformance import CASES as TREE_CASES, S, ids  # noqa: E402

# name -> (requests, RadixManager / SglangLoop options); the rule each case aims at in its comment
CASES = {name: TREE_CASES[name] for name in ("split_on_partial_match", "lock_protects_running", "lru_order", "page_16",
                                             "chunked_prefill", "retraction", "lpm_policy", "fcfs_refresh", "dfs_weight")}
CASES |= {
    # the batch-full flag set while nothing ran dies with the empty running batch (the prefill
    # batch replaces it): r2 and r3 are admitted one step later, and one of them is retracted
    "retract_chain": ([Request(f"r{k}", 0, ids(100 * k, 20), 60) for k in range(6)],
                      {"capacity_tokens": 240, "schedule_conservativeness": 0.1}),
    # retracted requests find their prompts (and the shared stem) still in the tree
    "retract_shared_prefix": ([Request(f"r{k}", k, S + ids(1000 * (k + 1), 10), 50) for k in range(5)],
                              {"capacity_tokens": 220, "schedule_conservativeness": 0.2}),
    # retraction with pages: a decode step needs a new page only at a page boundary
    "retract_page_16": ([Request(f"r{k}", k, ids(100 * k, 30), 70) for k in range(5)],
                        {"capacity_tokens": 320, "page_size": 16, "schedule_conservativeness": 0.2}),
    # a chunked request in flight clears the batch-full flag each step (it is kept out of the merge)
    "chunked_with_full_batch": ([Request("long", 0, ids(0, 200), 30)]
                                + [Request(f"r{k}", 1, ids(1000 * (k + 1), 20), 60) for k in range(4)],
                                {"capacity_tokens": 400, "chunked_prefill_size": 64, "schedule_conservativeness": 0.2}),
    # the decode step evicts cached prompts of finished requests
    "evict_in_decode": ([Request(f"c{k}", 0, ids(100 * k, 30), 1) for k in range(4)]
                        + [Request("d", 5, ids(5000, 20), 80)], {"capacity_tokens": 160}),
    # decoded tokens enter the tree at finish: the next turn hits prompt + reply (49 = 30 + 20 - 1)
    "turns_reuse_output": ([Request("t1", 0, ids(0, 30), 20, output=ids(7000, 20)),
                            Request("t2", 25, ids(0, 30) + ids(7000, 20) + ids(9000, 5), 4)], {}),
    # chunked prefill off: max_prefill_tokens bounds a round (0.5.23 compares it only then)
    "max_prefill_tokens_no_chunk": ([Request(f"r{k}", 0, ids(1000 * k, 300), 3) for k in range(4)],
                                    {"chunked_prefill_size": -1, "max_prefill_tokens": 500}),
    # two request slots: the others wait for a finish
    "max_running": ([Request(f"r{k}", 0, ids(1000 * k, 10), 5 + k) for k in range(6)], {"max_running_requests": 2}),
    # the prefill allocation with pages evicts for the extend plus one page per request (116 of 112
    # free): a's leaf goes although c's 7 pages would fit, so a2 hits nothing
    "paged_over_estimate": ([Request("a", 0, ids(0, 60), 1), Request("b", 1, ids(500, 60), 1),
                             Request("c", 3, ids(900, 100), 1), Request("a2", 5, ids(0, 60), 1)],
                            {"page_size": 16, "capacity_tokens": 208}),
    # a finish that adds nothing to the tree (22 computed tokens: one page, already cached) still
    # touches a's path, so b's leaf is the older one when c needs a page: a2 hits a's page
    "finish_touches_path": ([Request("a", 0, ids(0, 20), 3), Request("b", 0, ids(1000, 20), 1),
                             Request("c", 4, ids(2000, 40), 1), Request("a2", 6, ids(0, 20), 1)],
                            {"page_size": 16, "capacity_tokens": 80}),
    "lpm_retract": ([Request(f"r{k}", k // 2, S + ids(5000 + 50 * k, 10), 40) for k in range(6)],
                    {"schedule_policy": "lpm", "capacity_tokens": 300, "schedule_conservativeness": 0.1}),
}


def _compare(reqs, opts, **loop_kw):
    opts = {"capacity_tokens": 4096, **opts}
    m = RadixManager(version=SGLANG_VERSION, **opts)
    ours_evictions = loop.record_evictions(m)
    run = simulate(reqs, m, check_invariants=True, record_timeline=False)
    assert run.summary["rejected"] == 0  # every request fits (SGLang's driver admits all)
    engine = loop.SglangLoop(**opts, **loop_kw)
    theirs = engine.run(reqs)
    ours = loop.inferlab_outcomes(run)
    return m, engine, ours, theirs, ours_evictions


def _check(m, engine, ours, theirs, ours_evictions):
    diff = loop.differences(theirs, ours)
    assert diff == [], f"{len(diff)} differences, first {diff[:5]}"
    assert engine.hit_tokens == m.log_hit_tokens
    assert [c for c in ours_evictions if c[0] > 0] == engine.evict_calls


@pytest.mark.parametrize("name", sorted(CASES))
def test_sglang_loop_case(name):
    reqs, opts = CASES[name]
    _check(*_compare(reqs, opts))


def test_the_cases_exercise_their_rules():
    # the hand-made cases are not vacuous: what SGLang's own loop did where the comments claim it
    runs = {n: _compare(r, o) for n, (r, o) in CASES.items()}

    def theirs(name):
        return runs[name][3]

    assert theirs("split_on_partial_match")["b"].cached_tokens == 40
    assert theirs("page_16")["b"].cached_tokens == 32
    assert theirs("turns_reuse_output")["t2"].cached_tokens == 49
    for name in ("retraction", "retract_chain", "retract_shared_prefix", "retract_page_16", "lpm_retract"):
        assert sum(o.preemptions for o in theirs(name).values()) >= 1, name
    # retract_chain: r2 and r3 start at step 2, in the second prefill round (flag not kept)
    assert theirs("retract_chain")["r2"].first_token_s == 2 and theirs("retract_chain")["r3"].preemptions == 1
    # retracted requests re-hit their cached prompts: recomputed less than their whole tokens
    sp = theirs("retract_shared_prefix")
    assert any(o.preemptions and 0 < o.recomputed_tokens < 50 + 50 for o in sp.values())
    for name in ("lock_protects_running", "lru_order", "evict_in_decode", "paged_over_estimate", "fcfs_refresh",
                 "finish_touches_path"):
        assert runs[name][1].evicted_tokens > 0, name
    assert theirs("lru_order")["a2"].cached_tokens == 49  # a2 re-touched a, so b's leaf went first
    assert theirs("paged_over_estimate")["a2"].cached_tokens == 0
    assert theirs("finish_touches_path")["a2"].cached_tokens == 16
    assert theirs("max_running")["r2"].first_token_s > theirs("max_running")["r0"].finish_s - 1


def _mooncake_window(start, n):
    from inferlab.kv.traces import load_mooncake

    from _paths import CONVERSATION_TRACE
    reqs = load_mooncake(CONVERSATION_TRACE, limit=start + n)[start:]
    t0 = reqs[0].arrival_s
    return [Request(r.id, r.arrival_s - t0, r.prompt, r.max_new_tokens, r.output) for r in reqs]


def _max_len(reqs):
    return max(len(r.prompt) + r.max_new_tokens for r in reqs) + 64


# window -> (requests, options); every request fits the pool, the pool evicts (and retracts)
def _windows():
    from inferlab.kv.traces import load_azure

    from _paths import vendored
    azure = load_azure(vendored("azure_llm_inference_conv_head.csv"))
    return {
        # 300 conversation requests, 4.3 M prompt tokens through a 131,072-token pool
        "mooncake_fcfs": (_mooncake_window(0, 300), {"capacity_tokens": 131072, "max_running_requests": 128}),
        # the next 150, longest prefix first, admission at 0.3 of the default conservativeness
        "mooncake_lpm": (_mooncake_window(300, 150), {"capacity_tokens": 131072, "max_running_requests": 128,
                                                      "schedule_policy": "lpm", "schedule_conservativeness": 0.3}),
        # 200 Azure conversation requests (no shared prefixes) through 8,192 tokens: retractions
        "azure_fcfs": (azure, {"capacity_tokens": 8192, "max_running_requests": 64}),
        "azure_page_16_lpm": (azure, {"capacity_tokens": 6144, "max_running_requests": 64, "page_size": 16,
                                      "schedule_policy": "lpm"}),
        "azure_chunked": (azure, {"capacity_tokens": 6144, "max_running_requests": 64, "chunked_prefill_size": 256,
                                  "schedule_conservativeness": 0.3}),
    }


@pytest.mark.parametrize("window", ["mooncake_fcfs", "mooncake_lpm", "azure_fcfs", "azure_page_16_lpm", "azure_chunked"])
def test_sglang_loop_trace_window(window):
    reqs, opts = _windows()[window]
    m, engine, ours, theirs, ours_evictions = _compare(reqs, opts, max_context_len=_max_len(reqs))
    _check(m, engine, ours, theirs, ours_evictions)
    assert all(o.finish_s is not None for o in theirs.values())
    assert engine.evicted_tokens > 100_000
    if window.startswith("mooncake"):
        assert engine.hit_tokens > 50_000
    else:
        assert sum(o.preemptions for o in theirs.values()) >= 1

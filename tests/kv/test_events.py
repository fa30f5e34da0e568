"""Per-step events (simulate(record_events=True)): recording changes nothing, the records are
JSON, and replaying them rebuilds the run's counters and, for vLLM, every block's state.

The replays below are written from the event semantics (events.py), not from the managers'
code: a vLLM replay keeps its own ref count and hash per block and must reproduce the KV in use
and cached after every step, and the hashes a prefix hit claims; an SGLang replay keeps tree and
private cell counts."""

import json

import pytest

from inferlab.kv.events import StepEvents
from inferlab.kv_managers import PagedManager, RadixManager, Request, SlotManager, simulate

from _paths import CONVERSATION_TRACE as trace


def _mooncake(limit):
    from inferlab.kv.traces import load_mooncake

    if not trace.exists():
        pytest.skip("traces not present")
    return load_mooncake(trace, limit=limit)


MANAGERS = {
    "vllm-0.33": lambda: PagedManager(capacity_tokens=30000),
    "vllm-0.11-bs4": lambda: PagedManager(capacity_tokens=20000, block_size=4, version="0.11"),
    "sglang-0.5.23": lambda: RadixManager(capacity_tokens=28000),
    "sglang-0.5.2-p16": lambda: RadixManager(capacity_tokens=25000, page_size=16, version="0.5.2"),
    "llamacpp": lambda: SlotManager(capacity_tokens=60000),
}


def _counters(events: tuple[StepEvents, ...]) -> dict:
    """The summary's counters, from the events alone."""
    kinds: dict[str, list] = {}
    for st in events:
        for e in st.events:
            kinds.setdefault(e.kind, []).append(e)
    first_admit: dict = {}
    recomputed = 0
    for a in kinds.get("admit", []):
        if a.resumed:
            recomputed += a.num_tokens - a.cached_tokens
        else:
            first_admit.setdefault(a.request, a.cached_tokens)
    finished = {e.request for e in kinds.get("finish", [])}
    return {"finished": len(finished), "rejected": len(kinds.get("reject", [])),
            "preemptions": len(kinds.get("preempt", [])),
            "cached_tokens": sum(v for k, v in first_admit.items() if k in finished) if "admit" in kinds else None,
            "recomputed_tokens": recomputed if "admit" in kinds else None,
            "prefill_tokens_total": sum(st.prefill_tokens for st in events),
            "steps": sum(1 for st in events if st.prefill_tokens + st.decode_tokens),
            "first_tokens": len(kinds.get("first_token", []))}


@pytest.mark.parametrize("name", sorted(MANAGERS))
def test_events_replay_to_the_summary_and_change_nothing(name):
    reqs = _mooncake(120)
    plain = simulate(reqs, MANAGERS[name](), fast_forward=False)
    rec = simulate(reqs, MANAGERS[name](), record_events=True)
    assert plain.events is None
    assert rec.requests == plain.requests and rec.summary == plain.summary and rec.timeline == plain.timeline
    s, c = rec.summary, _counters(rec.events)
    assert c["finished"] == s["finished"] and c["rejected"] == s["rejected"] and c["steps"] == s["steps"]
    assert c["prefill_tokens_total"] == s["prefill_tokens_total"]
    assert c["first_tokens"] == sum(1 for r in rec.requests if r.ttft_s is not None)
    if not name.startswith("llamacpp"):  # the slot manager emits only the loop's own events
        assert c["preemptions"] == s["preemptions"] and c["cached_tokens"] == s["cached_tokens"]
        assert c["recomputed_tokens"] == s["recomputed_tokens"]
        assert s["preemptions"] > 0  # the pool is tight enough to preempt (and evict)
    assert [(st.t, st.kv_used_tokens, st.kv_cached_tokens) for st in rec.events if st.prefill_tokens + st.decode_tokens] \
        == list(zip(rec.timeline["t"], rec.timeline["kv_used_tokens"], rec.timeline["kv_cached_tokens"]))
    json.dumps([st.to_dict() for st in rec.events], allow_nan=False)  # strictly valid JSON


@pytest.mark.parametrize("version,bs", [("0.33", 16), ("0.11", 4)])
def test_vllm_block_replay(version, bs):
    # Replay each block's ref count and hash from allocate / prefix_hit / free / cache / evict and
    # compare, after every step, the blocks in use and the hashed free blocks with the manager's
    # figures; every hit must name blocks that carry the claimed hashes at that moment.
    reqs = _mooncake(120)
    m = PagedManager(capacity_tokens=30000 if bs == 16 else 20000, block_size=bs, version=version)
    run = simulate(reqs, m, record_events=True)
    ref: dict[int, int] = {}
    bhash: dict[int, int] = {}
    in_use = cached = evictions = hits = 0  # blocks with ref > 0; hashed blocks with ref 0
    for st in run.events:
        for e in st.events:
            if e.kind == "allocate":
                for b in e.blocks:
                    assert ref.get(b, 0) == 0 and b not in bhash  # a fresh block, its old hash evicted
                    ref[b] = 1
                in_use += len(e.blocks)
            elif e.kind == "prefix_hit":
                for b, k in zip(e.blocks, e.hashes, strict=True):
                    assert bhash.get(b) == k
                    r = ref[b] = ref.get(b, 0) + 1
                    if r == 1:
                        in_use, cached = in_use + 1, cached - 1
                hits += len(e.blocks)
            elif e.kind == "free":
                for b in e.blocks:
                    r = ref[b] = ref[b] - 1
                    if r == 0:
                        in_use, cached = in_use - 1, cached + (b in bhash)
            elif e.kind == "cache":
                for b, k in zip(e.blocks, e.hashes, strict=True):
                    assert ref[b] >= 1 and b not in bhash
                    bhash[b] = k
            elif e.kind == "evict":
                for b, k in zip(e.blocks, e.hashes, strict=True):
                    assert ref.get(b, 0) == 0 and bhash.pop(b) == k
                cached -= len(e.blocks)
                evictions += len(e.blocks)
        assert (in_use * bs, cached * bs) == (st.kv_used_tokens, st.kv_cached_tokens), st.step
    assert evictions > 0 and hits > 0 and run.summary["preemptions"] > 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_sglang_cell_replay(page_size):
    # Tree cells = inserted new tokens - evicted; private cells = allocated - freed - handed to the
    # tree; their sum is the pool in use plus cached after every step. (18000 cells: with 0.5.2's
    # whole-max_new reservations and retraction only until the next step fits, 25000 no longer
    # retracts on these 120 requests; 18000 retracts twice at both page sizes.)
    reqs = _mooncake(120)
    run = simulate(reqs, RadixManager(capacity_tokens=18000, page_size=page_size, version="0.5.2"), record_events=True)
    tree = private = 0
    nodes_evicted = 0
    for st in run.events:
        for e in st.events:
            if e.kind == "allocate":
                private += e.tokens
            elif e.kind == "free":
                private -= e.tokens
            elif e.kind == "cache":
                tree += e.new_tokens
                private -= e.from_request
            elif e.kind == "evict":
                tree -= e.tokens
                nodes_evicted += len(e.nodes)
        assert tree + private == st.kv_used_tokens + st.kv_cached_tokens, st.step
    assert nodes_evicted > 0 and run.summary["preemptions"] > 0


def test_events_on_a_hand_made_case():
    # 6 blocks of 16 (5 usable). "a" (40 tokens) takes blocks 1-3 and registers 2 full blocks;
    # "b" (a's first 32 tokens + 8 others) hits (40 - 1) // 16 = 2 blocks = a's, with a's hashes.
    ids = list(range(40))
    reqs = [Request("a", 0, ids, 2), Request("b", 5, ids[:32] + list(range(900, 908)), 1)]
    run = simulate(reqs, PagedManager(capacity_tokens=96), record_events=True)
    ev = [e for st in run.events for e in st.events]
    a_alloc = next(e for e in ev if e.kind == "allocate" and e.request == "a")
    a_cache = next(e for e in ev if e.kind == "cache" and e.request == "a")
    hit = next(e for e in ev if e.kind == "prefix_hit")
    assert a_alloc.blocks == (1, 2, 3) and a_cache.blocks == (1, 2)
    assert hit.request == "b" and hit.tokens == 32 and hit.blocks == (1, 2) and hit.hashes == a_cache.hashes
    assert [e.kind for e in ev if e.request == "a"][-2:] == ["free", "finish"]

"""Property tests over random workloads and capacities for every manager (hypothesis).

Checked on every step (simulate(check_invariants=True)): KV in use <= capacity; reference counts
and locks never negative and equal to the holders; then at the end no block, lock or slot leaked.
Per request: finished (all tokens, or truncated at llama.cpp's context) or rejected with a
reason; cached + computed prompt tokens = prompt tokens. With an unbounded pool and requests that
never overlap, the hits equal a brute-force prefix computation at the engine's granularity.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlab.kv_managers import PagedManager, RadixManager, Request, SlotManager, simulate

SETTINGS = dict(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def workloads(draw, max_requests=8, spaced=False):
    """Prompts built from a small pool of shared segments, so prefixes overlap often."""
    n_seg = draw(st.integers(2, 5))
    segs = [list(range(1000 * (k + 1), 1000 * (k + 1) + draw(st.integers(1, 40)))) for k in range(n_seg)]
    n = draw(st.integers(1, max_requests))
    reqs, t = [], 0
    for i in range(n):
        parts = draw(st.lists(st.integers(0, n_seg - 1), min_size=1, max_size=3))
        prompt = [tok for p in parts for tok in segs[p]]
        if draw(st.booleans()):
            prompt = prompt + [50_000 + i * 100 + k for k in range(draw(st.integers(1, 8)))]
        t += 1000 if spaced else draw(st.integers(0, 6))
        reqs.append(Request(i, t, prompt, draw(st.integers(1, 20))))
    return reqs


slot_managers = st.builds(
    lambda cap, np_, unified, ram: SlotManager(capacity_tokens=cap, n_parallel=np_, kv_unified=unified,
                                              cache_ram_mib=ram),
    st.integers(64, 1024), st.integers(1, 4), st.booleans(), st.sampled_from([0, 8192, 0.01]))
paged_managers = st.builds(
    lambda cap, bs, v, budget: PagedManager(capacity_tokens=cap, block_size=bs, version=v,
                                            max_num_batched_tokens=budget),
    st.integers(64, 1024), st.sampled_from([4, 16]), st.sampled_from(["0.11", "0.33"]), st.integers(8, 256))
radix_managers = st.builds(
    lambda cap, ps, pol, v, chunk: RadixManager(capacity_tokens=cap, page_size=ps, schedule_policy=pol,
                                                version=v, chunked_prefill_size=chunk),
    st.integers(64, 1024), st.sampled_from([1, 4]), st.sampled_from(["fcfs", "lpm", "dfs-weight"]),
    st.sampled_from(["0.5.2", "0.5.23"]), st.sampled_from([16, 64, 2048, -1]))


def _check_run(reqs, run):
    assert len(run.requests) == len(reqs)
    for req, rec in zip(reqs, run.requests):
        if rec.rejected is not None:
            assert isinstance(rec.rejected, str) and rec.rejected
            continue
        assert rec.output_tokens == req.max_new_tokens or rec.truncated
        assert rec.cached_tokens + rec.computed_prompt_tokens == len(req.prompt)
        assert 0 <= rec.cached_tokens < len(req.prompt)
        assert rec.finish_s is not None and rec.finish_s >= req.arrival_s
    s = run.summary
    assert s["finished"] + s["rejected"] == len(reqs)
    assert s["kv_peak_tokens"] <= s["kv_capacity_tokens"]


@settings(**SETTINGS)
@given(workloads(), slot_managers)
def test_slots_invariants(reqs, manager):
    _check_run(reqs, simulate(reqs, manager, check_invariants=True))


@settings(**SETTINGS)
@given(workloads(), paged_managers)
def test_paged_invariants(reqs, manager):
    _check_run(reqs, simulate(reqs, manager, check_invariants=True))


@settings(**SETTINGS)
@given(workloads(), radix_managers)
def test_radix_invariants(reqs, manager):
    _check_run(reqs, simulate(reqs, manager, check_invariants=True))


# ---------------------------------------------------------------- brute force, unbounded pool


def _lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _resident_after(req):
    """Tokens whose KV exists when a request finishes: prompt + reply without its last token."""
    return list(req.prompt) + list(req.output_tokens())[:-1]


def _brute_force_hits(reqs, granularity, only_previous=False):
    hits, seen = [], []
    for r in reqs:
        p = list(r.prompt)
        pool = seen[-1:] if only_previous else seen
        best = max((_lcp(s, p) for s in pool), default=0)
        best = min(best, len(p) - 1)  # the last prompt token is always computed
        hits.append(best - best % granularity)
        seen.append(_resident_after(r))
    return hits


UNBOUNDED = 1 << 20


@settings(**SETTINGS)
@given(workloads(spaced=True), st.sampled_from([4, 16]))
def test_paged_unbounded_hits_equal_brute_force(reqs, bs):
    run = simulate(reqs, PagedManager(capacity_tokens=UNBOUNDED, block_size=bs))
    assert [r.cached_tokens for r in run.requests] == _brute_force_hits(reqs, bs)


@settings(**SETTINGS)
@given(workloads(spaced=True), st.sampled_from([1, 4]))
def test_radix_unbounded_hits_equal_brute_force(reqs, page):
    run = simulate(reqs, RadixManager(capacity_tokens=UNBOUNDED, page_size=page))
    assert [r.cached_tokens for r in run.requests] == _brute_force_hits(reqs, page)


@settings(**SETTINGS)
@given(workloads(spaced=True))
def test_single_slot_hits_equal_brute_force(reqs):
    # One slot, no RAM cache: only the previous request's tokens are in the slot.
    run = simulate(reqs, SlotManager(capacity_tokens=UNBOUNDED, n_parallel=1, cache_ram_mib=0))
    assert [r.cached_tokens for r in run.requests] == _brute_force_hits(reqs, 1, only_previous=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(max_requests=10), st.one_of(slot_managers, paged_managers, radix_managers))
def test_decode_fast_forward_changes_nothing(reqs, manager):
    # The shortcut must give the same records as stepping one step at a time.
    import copy
    fast = simulate(reqs, copy.deepcopy(manager), check_invariants=True)
    slow = simulate(reqs, manager, fast_forward=False)
    assert fast.requests == slow.requests
    for key in ("prefill_computed", "hit_rate", "steps", "duration", "peak_concurrency", "kv_peak_tokens", "kv_mean_tokens"):
        assert fast.summary[key] == slow.summary[key], key  # kv_mean_tokens too: the same sum of KV x step, term by term


@pytest.mark.slow
def test_fast_forward_changes_nothing_on_a_mooncake_slice():
    from inferlab.kv.traces import load_mooncake

    from _paths import CONVERSATION_TRACE as trace
    if not trace.exists():
        pytest.skip("traces not present")
    reqs = load_mooncake(trace, limit=80)
    for make in (lambda: PagedManager(capacity_tokens=60000, version="0.11", block_size=8),
                 lambda: PagedManager(capacity_tokens=100000), lambda: RadixManager(capacity_tokens=80000),
                 lambda: SlotManager(capacity_tokens=150000)):
        fast = simulate(reqs, make(), record_timeline=False)
        slow = simulate(reqs, make(), record_timeline=False, fast_forward=False)
        assert fast.requests == slow.requests


clocked_paged_managers = st.builds(
    lambda cap, bs, v, budget, seqs, caching: PagedManager(
        capacity_tokens=cap, block_size=bs, version=v, max_num_batched_tokens=budget, max_num_seqs=seqs,
        enable_prefix_caching=caching),
    st.integers(64, 1024), st.sampled_from([1, 4, 16]), st.sampled_from(["0.11", "0.33"]), st.integers(8, 64),
    st.integers(1, 8), st.booleans())


@settings(**SETTINGS)
@given(workloads(max_requests=10), clocked_paged_managers)
def test_paged_decode_clock_equals_stepping_each_request(reqs, manager):
    # vLLM's decode batch on a shared clock (block work only where a token starts or fills a
    # block, fields written back when a request stops decoding) against the per-request loop:
    # same records, summary and timeline; the clock's own invariants are checked every step.
    import copy
    assert manager.decode_clock  # max_num_seqs <= max_num_batched_tokens, no max_model_len
    per_request = copy.deepcopy(manager)
    per_request.decode_clock = False
    for ff in (True, False):
        clocked = simulate(reqs, copy.deepcopy(manager), check_invariants=True, fast_forward=ff)
        slow = simulate(reqs, copy.deepcopy(per_request), check_invariants=True, fast_forward=ff)
        assert clocked.requests == slow.requests
        assert clocked.summary == slow.summary and clocked.timeline == slow.timeline


@pytest.mark.slow
def test_paged_decode_clock_equals_stepping_each_request_on_a_mooncake_slice():
    # Tight pools: decode tokens that start a block find the free queue empty and preempt
    # requests of the batch on the clock (some before their turn in the step).
    from inferlab.kv.traces import load_mooncake

    from _paths import CONVERSATION_TRACE as trace
    if not trace.exists():
        pytest.skip("traces not present")
    reqs = load_mooncake(trace, limit=60)
    for version, cap, bs in (("0.33", 40000, 16), ("0.33", 30000, 4)):  # 2 such preemptions each
        runs = []
        for clock in (True, False):
            m = PagedManager(capacity_tokens=cap, version=version, block_size=bs)
            m.decode_clock = clock
            runs.append(simulate(reqs, m, check_invariants=True))
        assert runs[0].requests == runs[1].requests and runs[0].timeline == runs[1].timeline
        assert runs[0].summary["preemptions"] > 0

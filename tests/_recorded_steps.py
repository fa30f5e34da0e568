"""Helpers of the hand-derived KV-manager tests: token ids, and a run with its steps recorded."""

from inferlab.kv.time_model import TimeModel
from inferlab.kv_managers import simulate


def ids(start, n):
    return list(range(start, start + n))


def steps_of(reqs, manager, **kw):
    """The run and its steps as (prefill, decode, context) triples."""
    steps = []

    def cost(p, b, c):
        steps.append((p, b, c))
        return 1.0

    run = simulate(reqs, manager, TimeModel(cost, name="recorder"), check_invariants=True, **kw)
    return run, steps

"""SGLang's radix cache on prompts made of several runs of ids (as the Mooncake trace's hashed
blocks are), worked out by hand: a match that ends inside the second run splits the edge there."""

from inferlab.kv.radix import RadixManager
from inferlab.kv_managers import Request, simulate


def ids(start, n):
    return list(range(start, start + n))


def test_matches_across_runs_split_the_edge_where_they_part():
    # a: 0-9 then 100-109 (20 tokens, one edge of two runs). b shares 10 + 5 = 15 tokens, then parts:
    # the edge splits after 15 and b hits 15. c repeats a: both halves, min(20, 20 - 1) = 19.
    # d shares a's first run and 3 of the second: 13; e repeats b: min(20, 19) = 19.
    a = ids(0, 10) + ids(100, 10)
    b = ids(0, 10) + ids(100, 5) + ids(900, 5)
    d = ids(0, 10) + ids(100, 3) + ids(700, 7)
    reqs = [Request("a", 0, a, 1), Request("b", 10, b, 1), Request("c", 20, a, 1), Request("d", 30, d, 1),
            Request("e", 40, b, 1)]
    run = simulate(reqs, RadixManager(capacity_tokens=4096), check_invariants=True)
    hits = {r.id: r.cached_tokens for r in run.requests}
    assert hits == {"a": 0, "b": 15, "c": 19, "d": 13, "e": 19}

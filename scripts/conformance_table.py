"""Regenerate the conformance table: inferlab's managers against the engines' own code.

    python scripts/conformance_table.py            # markdown on stdout
    python scripts/conformance_table.py --json benchmarks/results/conformance.json

Runs the same comparisons as tests/conformance (the wheels must be installed, as scripts/test
does): vLLM's Scheduler / KVCacheManager / BlockPool against PagedManager on the hand-made
cases and 1,000 Mooncake requests, compared per request on cached tokens, recomputed tokens,
preemptions, first-token and finish step and output tokens; SGLang's RadixCache against
inferlab's tree on every call of the hand-made cases and of 1,000 Mooncake requests at page
size 1 and 16; SGLang's PrefillAdder against RadixManager's 0.5.23 prefill round on 300 random
scheduler states; SGLang's whole scheduler loop against RadixManager 0.5.23 on the cases and
trace windows of test_sglang_loop, per request as for vLLM. Agreement is the share of compared values that are equal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "conformance"), str(ROOT / "tests")]

TRACE_REQUESTS = 1000


def vllm_row() -> dict:
    import test_vllm_conformance as t

    from inferlab.kv.traces import load_mooncake
    from inferlab.kv_managers import PagedManager, simulate

    from _paths import CONVERSATION_TRACE
    eng = t.eng
    values = same = 0
    cases_ok = 0
    for reqs, opts, cap in t.CASES.values():
        ours = eng.inferlab_outcomes(simulate(reqs, PagedManager(capacity_tokens=cap, **opts)))
        theirs = eng.VllmEngine(cap // opts.get("block_size", 16), **opts).run(reqs)
        diffs = eng.differences(theirs, ours)
        values += len(theirs) * len(eng.FIELDS)
        same += len(theirs) * len(eng.FIELDS) - len(diffs)
        cases_ok += not diffs
    reqs = load_mooncake(CONVERSATION_TRACE, limit=TRACE_REQUESTS)
    ours = eng.inferlab_outcomes(simulate(reqs, PagedManager(capacity_tokens=131072), record_timeline=False))
    engine = eng.VllmEngine(131072 // 16)
    theirs = engine.run(reqs)
    diffs = eng.differences(theirs, ours)
    trace_values = len(theirs) * len(eng.FIELDS)
    return {"engine": "vLLM", "version": eng.VERSION, "compared": "Scheduler + KVCacheManager + BlockPool",
            "cases": len(t.CASES), "cases_agreeing": cases_ok, "trace_requests": len(reqs),
            "trace_preemptions": sum(o.preemptions for o in theirs.values()), "trace_evicted_blocks": engine.evictions,
            "values": values + trace_values, "agreeing_values": same + trace_values - len(diffs),
            "unit": "request fields"}


def sglang_row() -> dict:
    import test_sglang_conformance as t

    from inferlab.kv.traces import load_mooncake
    from inferlab.kv_managers import RadixManager, simulate

    from _paths import CONVERSATION_TRACE
    eng = t.eng
    calls = same = cases_ok = 0
    for reqs, opts in t.CASES.values():
        _, _, n, diffs = t._replay(reqs, opts)
        calls, same, cases_ok = calls + n, same + n - len(diffs), cases_ok + (not diffs)
    reqs = load_mooncake(CONVERSATION_TRACE, limit=TRACE_REQUESTS)
    evicted = 0
    for page_size in (1, 16):
        m = RadixManager(capacity_tokens=131072, page_size=page_size)
        log = eng.record_tree_calls(m)
        simulate(reqs, m, record_timeline=False)
        n, diffs = eng.replay(log, page_size)
        calls, same = calls + n, same + n - len(diffs)
        evicted += sum(c[2] for c in log if c[0] == "evict")
    return {"engine": "SGLang", "version": eng.VERSION, "compared": "RadixCache (every tree call)",
            "cases": len(t.CASES), "cases_agreeing": cases_ok, "trace_requests": len(reqs),
            "trace_evicted_tokens": evicted, "values": calls, "agreeing_values": same, "unit": "tree calls"}


def sglang_adder_row(states: int = 300) -> dict:
    """SGLang's own PrefillAdder against RadixManager's 0.5.23 prefill round on random states
    (the loop of test_prefill_adder_agrees_with_sglangs_own_on_random_states)."""
    import random

    import test_sglang_conformance as t
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    eng = t.eng
    same = 0
    for seed in range(states):
        rng = random.Random(seed)
        stems, running, waiting, kw = t._random_round(rng)
        tree = RadixCache.create_simulated(mock_allocator=eng.CountingAllocator(0), page_size=1)
        for st in stems:
            tree.insert(InsertParams(key=RadixKey(token_ids=eng.array("q", st)), value=torch.zeros(len(st), dtype=torch.int64)))
        ours = t._inferlab_round(stems, running, waiting, **kw)
        seqs = ours[3]

        def out_ids(rid, done, seqs=seqs):
            return [x for a, n in seqs[rid].runs for x in range(a, a + n)][len(seqs[rid].req.prompt):][:done]

        theirs = eng.sglang_prefill_round(
            tree, kw["free"], [eng.sglang_req(r, p, o, out_ids(r, d)) for r, p, o, d in running],
            [eng.sglang_req(r, p, o, out_ids(r, d)) for r, p, o, d in waiting],
            new_token_ratio=kw["new_token_ratio"], max_prefill_tokens=kw["max_prefill_tokens"],
            chunked_prefill_size=kw["chunked_prefill_size"])
        same += ours[:3] == theirs
    return {"engine": "SGLang", "version": eng.VERSION, "compared": "PrefillAdder (one prefill round)",
            "cases": states, "cases_agreeing": same, "trace_requests": 0, "values": states,
            "agreeing_values": same, "unit": "random scheduler states"}


def sglang_loop_row() -> dict:
    """SGLang's own scheduler loop (tests/conformance/_sglang_loop.py) against RadixManager 0.5.23:
    the cases and trace windows of test_sglang_loop, compared per request on cached tokens,
    recomputed tokens, retractions, first-token and finish step and output tokens."""
    import test_sglang_loop as t

    loop = t.loop
    values = same = cases_ok = trace_requests = retractions = evicted = 0
    windows = t._windows()
    for name, (reqs, opts) in [*t.CASES.items(), *windows.items()]:
        kw = {"max_context_len": t._max_len(reqs)} if name in windows else {}
        m, engine, ours, theirs, ours_evictions = t._compare(reqs, opts, **kw)
        diffs = loop.differences(theirs, ours)
        n = len(theirs) * len(loop.FIELDS)
        values, same = values + n, same + n - len(diffs)
        if name in windows:
            trace_requests += len(reqs)
            retractions += sum(o.preemptions for o in theirs.values())
            evicted += engine.evicted_tokens
        else:
            cases_ok += not diffs and [c for c in ours_evictions if c[0] > 0] == engine.evict_calls
    return {"engine": "SGLang", "version": loop.VERSION, "compared": "Scheduler loop (admission, decode, retraction, finish)",
            "cases": len(t.CASES), "cases_agreeing": cases_ok, "trace_requests": trace_requests,
            "trace_retractions": retractions, "trace_evicted_tokens": evicted, "values": values,
            "agreeing_values": same, "unit": "request fields"}


def llamacpp_rows(repeat: int = 3) -> list[dict]:
    """A real llama-server against SlotManager: runs benchmarks/conformance_llamacpp.py (it builds
    or finds llama-server, runs every sequential case once and the concurrent ones ``repeat``
    times) and turns its JSON into two rows."""
    import subprocess

    out = ROOT / "benchmarks" / "results" / "conformance_llamacpp.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "conformance_llamacpp.py"), "--repeat", str(repeat)],
                   check=True, stdout=subprocess.DEVNULL)
    d = json.loads(out.read_text())
    seq, conc = d["sequential"], d["concurrent"]
    version = d["llama_cpp_commit"][:7]
    return [{"engine": "llama.cpp", "version": version, "compared": "llama-server, sequential token-id prompts",
             "cases": seq["cases"], "cases_agreeing": sum(r["agree"] == r["requests"] for r in d["rows"] if r["kind"] == "sequential"),
             "trace_requests": 0, "values": seq["requests"], "agreeing_values": seq["agree"],
             "unit": "requests (slot, reused tokens, outcome, /slots)"},
            {"engine": "llama.cpp", "version": version, "compared": f"llama-server, concurrent groups x {conc['runs'] // max(1, conc['cases'])} runs",
             "cases": conc["runs"], "cases_agreeing": sum(r["agree_as_received"] == r["requests"] for r in d["rows"] if r["kind"] == "concurrent"),
             "trace_requests": 0, "values": conc["requests"], "agreeing_values": conc["agree_as_received"],
             "unit": "requests in the server's received order"}]


def markdown(rows: list[dict]) -> str:
    out = ["| engine | version | compared | cases | trace requests | agreement |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        pct = 100.0 * r["agreeing_values"] / r["values"] if r["values"] else 0.0
        trace = f"{r['trace_requests']:,}" if r["trace_requests"] else "-"
        out.append(f"| {r['engine']} | {r['version']} | {r['compared']} | {r['cases_agreeing']}/{r['cases']} | "
                   f"{trace} | {pct:.1f} % of {r['values']:,} {r['unit']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--engines", default="vllm,sglang,sglang-adder,sglang-loop,llamacpp",
                    help="rows to compute; llamacpp starts a real llama-server (minutes)")
    ap.add_argument("--repeat", type=int, default=3, help="llamacpp: runs of each concurrent case")
    args = ap.parse_args()
    fns = {"vllm": lambda: [vllm_row()], "sglang": lambda: [sglang_row()], "sglang-adder": lambda: [sglang_adder_row()],
           "sglang-loop": lambda: [sglang_loop_row()],
           "llamacpp": lambda: llamacpp_rows(args.repeat)}
    unknown = [e for e in args.engines.split(",") if e not in fns]
    if unknown:
        ap.error(f"unknown --engines {unknown}; valid: {', '.join(fns)}")
    rows = [r for e in args.engines.split(",") for r in fns[e]()]
    print(markdown(rows))  # noqa: T201  (a script: the table is its output)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""The whole Mooncake conversation trace (12,031 requests) through each KV manager.

Prints, per manager: wall time and CPU time (the machine is shared: CPU time is the figure
that does not depend on other load), simulated requests per wall second, the share of prompt tokens
saved and the engine's own hit rate, against the trace's unbounded-cache bound (36.6 % of blocks
repeat). Writes benchmarks/results/kv_managers.json.

    python benchmarks/bench_kv_managers.py                     # default capacity 131072 tokens
    python benchmarks/bench_kv_managers.py --capacities 65536,262144,1048576 --engines vllm
    python benchmarks/bench_kv_managers.py --profile vllm      # cProfile the manager
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path

from inferlab.kv.traces import load_mooncake, prefix_hit_upper_bound, repeated_block_fraction
from inferlab.kv_managers import ENGINES, simulate

# the project's shared/ folder beside the repository, or /work/shared; --trace overrides
TRACE = next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "traces" / "conversation_trace.jsonl",
                          Path("/work/shared/traces/conversation_trace.jsonl")) if p.exists()),
             Path("/work/shared/traces/conversation_trace.jsonl"))
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--capacities", default="131072", help="comma-separated KV pool sizes in tokens")
    ap.add_argument("--engines", default="llamacpp,vllm,sglang")
    ap.add_argument("--profile", help="cProfile this engine at the first capacity")
    args = ap.parse_args()

    t0 = time.perf_counter()
    reqs = load_mooncake(args.trace, limit=args.limit)
    load_s = time.perf_counter() - t0
    block_bound = repeated_block_fraction(reqs)
    bound = prefix_hit_upper_bound(reqs)
    print(f"{args.trace}: {len(reqs):,} requests, {sum(len(r.prompt) for r in reqs):,} prompt tokens, "
          f"loaded in {load_s:.2f} s; unbounded cache: {block_bound:.1%} of 512-token blocks repeat, "
          f"{bound:.1%} of prompt tokens reusable ('of bound' below)")
    if args.profile:
        m = ENGINES[args.profile](capacity_tokens=int(args.capacities.split(",")[0]))
        prof = cProfile.Profile()
        prof.runcall(simulate, reqs, m, record_timeline=False)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    rows = []
    print(f"{'engine':9s} {'capacity':>9s} {'wall s':>7s} {'cpu s':>7s} {'req/s':>8s} {'steps':>9s} {'saved':>7s} "
          f"{'hit rate':>8s} {'of bound':>8s} {'preempt':>7s} {'rejected':>8s}")
    for cap in (int(c) for c in args.capacities.split(",")):
        for name in args.engines.split(","):
            m = ENGINES[name](capacity_tokens=cap)
            t, c = time.perf_counter(), time.process_time()
            run = simulate(reqs, m, record_timeline=False)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            s = run.summary
            row = {"engine": name, "capacity_tokens": cap, "wall_s": wall, "cpu_s": cpu, "requests": len(reqs),
                   "sim_requests_per_s": len(reqs) / wall, "steps": s["steps"],
                   "prefill_saved_frac": s["prefill_saved_frac"], "hit_rate": s["hit_rate"],
                   "hit_rate_name": s["hit_rate_name"], "bound_tokens": bound, "bound_blocks": block_bound,
                   "preemptions": s["preemptions"], "rejected": s["rejected"], "config": run.config}
            rows.append(row)
            hr = "-" if s["hit_rate"] is None else f"{s['hit_rate']:.1%}"
            print(f"{name:9s} {cap:9,d} {wall:7.2f} {cpu:7.2f} {len(reqs) / wall:8.0f} {s['steps']:9,d} "
                  f"{s['prefill_saved_frac']:7.1%} {hr:>8s} {s['prefill_saved_frac'] / bound:8.0%} "
                  f"{s['preemptions']:7d} {s['rejected']:8d}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "kv_managers.json"
    out.write_text(json.dumps({"trace": args.trace, "bound_blocks": block_bound, "bound_tokens": bound,
                               "runs": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

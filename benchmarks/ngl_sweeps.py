"""Partial offload against published llama-bench -ngl sweeps (data/ngl_sweeps.json): for each sweep
the model's curve (perf.placement.place with n_gpu_layers, perf.speed with CALIBRATED), anchored
as the data file's notes say (one scale for the CPU side's time and one for the GPU side's, from
the sweep's two ends or by least squares), the error at the points not used as anchors, and where
the largest step between consecutive points is, measured and predicted.

Then the --n-cpu-moe sweeps of MoE models (every block on the GPU, the routed experts of the first N
blocks in host RAM; perf.calibration.check_n_cpu_moe_sweeps): the same anchored curve (or the scales
of another sweep of the same machine: every point predicted), whether it is monotone, and the cost of
one block's experts on the host in ms per token, measured (the slope of 1/(t/s) against N) and
predicted. For a machine that also published an -ngl sweep, the -ngl sweep's scales applied to its
--n-cpu-moe points are printed too (not scored: see the output's note).

    python benchmarks/ngl_sweeps.py [--json benchmarks/results/ngl_sweeps.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", default="benchmarks/results/ngl_sweeps.json")
    args = ap.parse_args()
    from inferlab.perf.calibration import (check_n_cpu_moe_sweep, check_n_cpu_moe_sweeps, check_ngl_sweep, host_attention_flops,
                                           host_kv_layer_s, ngl_sweeps)

    data = ngl_sweeps()
    results = [check_ngl_sweep(s) for s in data["sweeps"]]
    errs = {"tg": [], "pp": []}
    for s, r in zip(data["sweeps"], results):
        print(f"\n{s['id']}: {s['model_id']} {s['quant']} on {s.get('device') or 'an unnamed GPU'} (split on {s['gpu_proxy']} + {s['host_proxy']}); {s['source']}")
        for k, m in r["metrics"].items():
            tag = "" if m["checked"] else "   [not checked: " + s.get(f"{k}_not_checked", "")[:60] + "...]"
            print(f"  {k} ({m['method']}; scales cpu {m['cpu_scale']:.2f} gpu {m['gpu_scale']:.2f}){tag}")
            print("    ngl  " + " ".join(f"{p['ngl']:>8}" for p in m["points"]))
            print("    meas " + " ".join(f"{p['measured']:8.1f}" for p in m["points"]))
            print("    pred " + " ".join(f"{p['predicted']:8.1f}" for p in m["points"]))
            print("    err  " + " ".join(("  anchor" if p["anchor"] else f"{p['err']:+8.1%}") for p in m["points"]))
            jd = "" if m["jump_distinct"] else " (no distinct jump: the two largest steps are within 10 %)"
            print(f"    largest step: measured {m['jump_measured'][0]} -> {m['jump_measured'][1]}, predicted "
                  f"{m['jump_predicted'][0]} -> {m['jump_predicted'][1]}{jd}; |err| median {m['median_abs_err']:.1%}, max {m['max_abs_err']:.1%}")
            if m["checked"]:
                errs[k] += [abs(p["err"]) for p in m["points"] if not p["anchor"]]
    summary = {k: {"n_points": len(v), "median_abs_err": statistics.median(v), "max_abs_err": max(v)} for k, v in errs.items() if v}
    print(f"\nchecked sweeps: {len(results)}; host-KV cost {json.dumps(host_kv_layer_s())} s/block, host attention {host_attention_flops() / 1e9:.1f} GFLOP/s")
    for k, v in summary.items():
        print(f"{k}: {v['n_points']} points not used as anchors, |err| median {v['median_abs_err']:.1%}, max {v['max_abs_err']:.1%}")
    moe, moe_summary, cross = _n_cpu_moe(data, results, check_n_cpu_moe_sweep, check_n_cpu_moe_sweeps)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"summary": summary, "sweeps": results, "host_kv_layer_s": host_kv_layer_s(), "host_attention_flops": host_attention_flops(),
                   "n_cpu_moe_summary": moe_summary, "n_cpu_moe_sweeps": moe, "n_cpu_moe_with_ngl_scales": cross}, f, indent=1)


def _n_cpu_moe(data, ngl_results, check_one, check_all):
    print("\n--n-cpu-moe sweeps (-ngl 99, the experts of the first N blocks on the host)")
    results = check_all()
    errs = {"tg": [], "pp": []}
    for s, r in zip(data["n_cpu_moe_sweeps"], results):
        print(f"\n{s['id']}: {s['model_id']} {s['quant']} on {s['device']} (split on {s['gpu_proxy']} + {s['host_proxy']}); build {s['build']}; {s['source']}")
        for k, m in r["metrics"].items():
            print(f"  {k} ({m['method']}; scales cpu {m['cpu_scale']:.2f} gpu {m['gpu_scale']:.2f}){'' if m['checked'] else '   [not checked]'}")
            print("    N    " + " ".join(f"{p['n_cpu_moe']:>8}" for p in m["points"]))
            print("    meas " + " ".join(f"{p['measured']:8.1f}" for p in m["points"]))
            print("    pred " + " ".join(f"{p['predicted']:8.1f}" for p in m["points"]))
            print("    err  " + " ".join(("  anchor" if p["anchor"] else f"{p['err']:+8.1%}") for p in m["points"]))
            print(f"    one block's experts on the host: measured {m['slope_measured_s'] * 1e3:.3f} ms/token, predicted {m['slope_predicted_s'] * 1e3:.3f} "
                  f"({m['slope_predicted_s'] / m['slope_measured_s'] - 1:+.0%}; unscaled on the proxies {m['slope_unscaled_s'] * 1e3:.3f}); "
                  f"monotone: measured {m['monotone_measured']}, predicted {m['monotone_predicted']}; |err| median {m['median_abs_err']:.1%}, max {m['max_abs_err']:.1%}")
            if m["checked"]:
                errs[k] += [abs(p["err"]) for p in m["points"] if not p["anchor"]]
    summary = {k: {"n_points": len(v), "median_abs_err": statistics.median(v), "max_abs_err": max(v)} for k, v in errs.items() if v}
    print(f"\nchecked --n-cpu-moe sweeps: {len(results)}")
    for k, v in summary.items():
        print(f"{k}: {v['n_points']} points not used as anchors, |err| median {v['median_abs_err']:.1%}, max {v['max_abs_err']:.1%}")
    cross = []
    by_id = {r["id"]: r for r in ngl_results}
    for s in data["n_cpu_moe_sweeps"]:
        ngl = by_id.get(s.get("same_machine_ngl_sweep", ""))
        if ngl is None:
            continue
        scales = {k: (m["cpu_scale"], m["gpu_scale"]) for k, m in ngl["metrics"].items()} | {"from": ngl["id"]}
        r = check_one(s, scales=scales)
        cross.append(r)
        for k, m in r["metrics"].items():
            print(f"{s['id']} {k} with the -ngl sweep's scales (not scored): err " + " ".join(f"{p['err']:+.0%}" for p in m["points"]))
    if cross:
        print("  (the -ngl sweep's GPU side is a small share of its steps, so its GPU scale is loosely set, and its CPU side is slower than the\n"
              "   CPU alone on that machine (-ngl 0: 15.1 t/s; -ngl 0 -nopo 1: 20.6): the scales do not carry over to the --n-cpu-moe layout)")
    return results, summary, cross


if __name__ == "__main__":
    main()

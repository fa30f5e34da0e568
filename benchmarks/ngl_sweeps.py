"""Partial offload against published llama-bench -ngl sweeps (data/ngl_sweeps.json): for each sweep
the model's curve (perf.placement.place with n_gpu_layers, perf.speed with CALIBRATED), anchored
as the data file's notes say (one scale for the CPU side's time and one for the GPU side's, from
the sweep's two ends or by least squares), the error at the points not used as anchors, and where
the largest step between consecutive points is, measured and predicted.

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
    from inferlab.perf.calibration import check_ngl_sweep, host_attention_flops, host_kv_layer_s, ngl_sweeps

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
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"summary": summary, "sweeps": results, "host_kv_layer_s": host_kv_layer_s(), "host_attention_flops": host_attention_flops()}, f, indent=1)


if __name__ == "__main__":
    main()

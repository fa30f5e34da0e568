"""The calibrated speed model against published llama-bench rows, by backend: the development
split (data/llama_bench_dev.json, what the constants were fitted on: in-sample), the validation
split (data/llama_bench_validation.json: devices held out by a rule fixed before fitting, never
fitted on) and the dev rows marked historic (not fitted: not llama-bench, or 2023 builds), each
beside the lesson's method (η = 0.7 of bandwidth, 50 % of FP16 peak). Median and p90 absolute
error of tg128 and pp512.

    python benchmarks/validate_calibrated.py [--rows] [--json benchmarks/results/calibration.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics


def _stats(errs: list[float]) -> dict | None:
    e = sorted(abs(x) for x in errs)
    if not e:
        return None
    return {"n": len(e), "median_abs_err": statistics.median(e), "p90_abs_err": e[min(len(e) - 1, round(0.9 * (len(e) - 1)))]}


def summarize(table: list[dict]) -> dict:
    """{backend or "all": {"tg": stats, "pp": stats}}; p90 = the value at rank round(0.9 (n-1)) of the sorted errors."""
    out = {}
    for b in sorted({r["backend"] for r in table}) + ["all"]:
        sel = [r for r in table if b == "all" or r["backend"] == b]
        out[b] = {k: s for k in ("tg", "pp") if (s := _stats([r[f"{k}_err"] for r in sel if r[f"{k}_err"] is not None]))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--json", default="benchmarks/results/calibration.json")
    args = ap.parse_args()
    from inferlab.perf.calibration import CALIBRATED, dev_rows, fitted_constants, validation_rows, validation_table
    from inferlab.perf.speed import BANDWIDTH_ONLY as LESSON

    splits = {"dev": [r for r in dev_rows() if r["fit"]], "validation": validation_rows(), "historic": [r for r in dev_rows() if not r["fit"]]}
    tables = {s: {"calibrated": validation_table(CALIBRATED(), rows), "lesson": validation_table(LESSON, rows)} for s, rows in splits.items()}
    summary = {s: {m: summarize(t) for m, t in v.items()} for s, v in tables.items()}
    if args.rows:
        for s in splits:
            print(f"\n[{s}]")
            print(f"{'device':40s} {'backend':7s} {'quant':5s} {'tg':>7s} {'pred':>7s} {'err':>6s} {'pp':>8s} {'pred':>8s} {'err':>6s}")
            for r in tables[s]["calibrated"]:
                tg = f"{r['tg']:7.1f} {r['tg_pred']:7.1f} {r['tg_err']:+6.0%}" if r["tg"] else " " * 22
                pp = f"{r['pp']:8.0f} {r['pp_pred']:8.0f} {r['pp_err']:+6.0%}" if r["pp"] else ""
                print(f"{r['device'][:40]:40s} {r['backend']:7s} {r['quant']:5s} {tg} {pp}")
    print(f"\n{'backend':8s} {'metric':6s} | {'dev (in-sample)':^31s} | {'validation (held out)':^31s}")
    print(f"{'':8s} {'':6s} | {'n':>3s} {'calibrated':>13s} {'lesson':>13s} | {'n':>3s} {'calibrated':>13s} {'lesson':>13s}")
    print(f"{'':8s} {'':6s} | {'':3s} {'median / p90':>13s} {'median / p90':>13s} | {'':3s} {'median / p90':>13s} {'median / p90':>13s}")
    backends = sorted({b for s in ("dev", "validation") for b in summary[s]["calibrated"]} - {"all"}) + ["all"]
    for b in backends:
        for k in ("tg", "pp"):
            cells = []
            for s in ("dev", "validation"):
                c, l = summary[s]["calibrated"].get(b, {}).get(k), summary[s]["lesson"].get(b, {}).get(k)
                cells.append(f"{c['n']:3d} {c['median_abs_err']:6.1%}/{c['p90_abs_err']:6.1%} {l['median_abs_err']:6.1%}/{l['p90_abs_err']:6.1%}"
                             if c else f"{'-':>3s} {'':13s} {'':13s}")
            print(f"{b:8s} {k:6s} | {cells[0]} | {cells[1]}")
    h = summary["historic"]["calibrated"]["all"]
    print(f"\nhistoric rows (not fitted): tg median {h['tg']['median_abs_err']:.1%} (n {h['tg']['n']}), pp median {h['pp']['median_abs_err']:.1%} (n {h['pp']['n']})")
    print("fitted constants:", json.dumps({b: {k: v[k] for k in ("eta", "kappa_bytes_per_op", "layer_overhead_s", "zeta_flop_per_op", "eps_float", "n_rows")}
                                           for b, v in fitted_constants().items()}))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"summary": summary, "constants": fitted_constants(),
                   "rows": {s: tables[s]["calibrated"] for s in tables}}, f, indent=1)


if __name__ == "__main__":
    main()

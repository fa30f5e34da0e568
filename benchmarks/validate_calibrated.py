"""The calibrated speed model against the dev file it was fitted on (data/llama_bench_dev.json):
every row predicted vs published, then median and p90 absolute error per backend, for the
calibrated model and, for comparison, the lesson's.

    python benchmarks/validate_calibrated.py [--rows] [--json benchmarks/results/calibration.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics


def summarize(table: list[dict]) -> dict:
    out = {}
    for b in sorted({r["backend"] for r in table}):
        out[b] = {}
        for k in ("tg", "pp"):
            e = sorted(abs(r[f"{k}_err"]) for r in table if r["backend"] == b and r[f"{k}_err"] is not None)
            if e:
                p90 = e[min(len(e) - 1, round(0.9 * (len(e) - 1)))]
                out[b][k] = {"n": len(e), "median_abs_err": statistics.median(e), "p90_abs_err": p90}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--json", default="benchmarks/results/calibration.json")
    args = ap.parse_args()
    from inferlab.perf.calibration import CALIBRATED, fitted_constants, validation_table
    from inferlab.perf.speed import BANDWIDTH_ONLY as LESSON

    cal, les = validation_table(CALIBRATED()), validation_table(LESSON)
    if args.rows:
        print(f"{'device':40s} {'backend':7s} {'quant':5s} {'tg':>7s} {'pred':>7s} {'err':>6s} {'pp':>8s} {'pred':>8s} {'err':>6s}")
        for r in cal:
            tg = f"{r['tg']:7.1f} {r['tg_pred']:7.1f} {r['tg_err']:+6.0%}" if r["tg"] else " " * 22
            pp = f"{r['pp']:8.0f} {r['pp_pred']:8.0f} {r['pp_err']:+6.0%}" if r["pp"] else ""
            print(f"{r['device'][:40]:40s} {r['backend']:7s} {r['quant']:5s} {tg} {pp}")
    s_cal, s_les = summarize(cal), summarize(les)
    print(f"\n{'backend':8s} {'metric':6s} {'rows':>4s}  {'calibrated median':>17s} {'p90':>6s}   {'lesson median':>13s} {'p90':>6s}")
    for b in s_cal:
        for k in s_cal[b]:
            c, l = s_cal[b][k], s_les[b][k]
            print(f"{b:8s} {k:6s} {c['n']:4d}  {c['median_abs_err']:17.1%} {c['p90_abs_err']:6.1%}   {l['median_abs_err']:13.1%} {l['p90_abs_err']:6.1%}")
    print("\nfitted constants:", json.dumps(fitted_constants()))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"calibrated": s_cal, "lesson": s_les, "constants": fitted_constants(), "rows": cal}, f, indent=2)


if __name__ == "__main__":
    main()

"""The rows of an `inferlab validate --json` run predicted again by the code as it is now, scored
against the same vs-probe speeds: error = new prediction / (the row's predicted / (1 + its matched
error)) - 1. ``--no-profile``: without a machine profile (the stored reference CPU that detect picks
for this CPU); else with this machine's profile, as validate would predict today (a stand-in rule
changed after the run was measured). ``--no-nearest``: the reference chosen as before
nearest_reference (a CPU of a class with no reference took the first entry), for the side-by-side.
Detect measures bandwidth afresh without a profile, so decode figures move between invocations;
run it with an empty config dir there:

    XDG_CONFIG_HOME=$(mktemp -d) python benchmarks/repredict_validate.py validate.json --no-profile [--gguf F] [--no-nearest]
    XDG_CONFIG_HOME=<the calibrated profile's dir> python benchmarks/repredict_validate.py validate.json [--json out.json]

``--refit``: the profile's llama.cpp runs fitted again by calibrate's code as it is now (a rule of
the fit changed after calibrate ran; the profile on disk is left as it is). The Zen 5 cross scores
of benchmarks/results/validate_local_zen5_uncapped.json: each calibration's profile with each
validate run's JSON, ``--refit``.
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("rows", help="the JSON that `inferlab validate --json` printed")
    ap.add_argument("--gguf", help="the real GGUF the run was given with --gguf (its rows are named by its file name)")
    ap.add_argument("--no-nearest", action="store_true", help="AMX/AVX-512 CPUs without their own reference take the first entry")
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--no-profile", action="store_true", help="predict without this machine's profile (the stored reference)")
    ap.add_argument("--json", help="also write the errors here")
    ap.add_argument("--refit", action="store_true", help="fit the profile's llama.cpp runs again with the code as it is now")
    args = ap.parse_args()
    if args.refit and not args.no_profile:
        _use_refitted_profile()

    from inferlab.hardware.detect import detect_machine
    from inferlab.hardware.validate import _predict, toy_model
    import inferlab.perf.cpu_model as cm

    if args.no_nearest:
        cm._ISA_SUBSETS.clear()
    d = json.load(open(args.rows))
    rows = d["rows"] if isinstance(d, dict) else d
    m = detect_machine(profile=not args.no_profile)
    print("rates:", cm.rates_label(m.ram))
    errs: dict[str, list[float]] = {"tg": [], "pp": []}
    out_rows = []
    now = "without profile" if args.no_profile else "now"
    for r in rows:
        if r["model"].endswith(".gguf"):
            if not args.gguf:
                continue
            path = args.gguf
        else:
            path = toy_model(r["model"], r["preset"])
        _, _, limits, pp = _predict(path, m, r["threads"], args.n_prompt)
        for metric, pred in (("tg", limits.tok_s), ("pp", pp)):
            e = vs_probe_error(r, metric, pred)
            if e is None:
                continue
            me, pr = r[f"{metric}_matched_error"], r[f"{metric}_predicted"]
            errs[metric].append(e)
            out_rows.append({"model": r["model"], "preset": r["preset"], "metric": metric, "error_now": e, "error_at_run": me,
                             "predicted_now": pred, "predicted_at_run": pr})
            print(f"{r['model']:32s} {r['preset']:7s} {metric} {now} {e:+.1%}  at the run {me:+.1%}")
    summary = {}
    for k, v in errs.items():
        if v:
            summary[k] = {"median_abs": statistics.median(abs(x) for x in v), "within_15pct": sum(abs(x) <= 0.15 for x in v), "n": len(v)}
            print(k, "median abs", round(summary[k]["median_abs"], 3), "within 15 %", summary[k]["within_15pct"], "of", len(v),
                  "slow", sum(x < 0 for x in v))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rates": cm.rates_label(m.ram), "profile": not args.no_profile, "rows": out_rows, "summary": summary}, f, indent=1)


def vs_probe_error(row: dict, metric: str, pred: float | None) -> float | None:
    """``pred`` against a validate row's vs-probe speed (its prediction at the run / (1 + its matched
    error)), less 1; None where the row or the prediction has no such figure."""
    me, pr = row.get(f"{metric}_matched_error"), row.get(f"{metric}_predicted")
    return None if me is None or pr is None or pred is None else pred / (pr / (1 + me)) - 1


def refitted_machine(profile: dict):
    """This machine as detect sees it with ``profile``'s llama.cpp runs fitted by the code as it is
    now (a temporary XDG_CONFIG_HOME holds that profile; the one on disk is left as it is)."""
    import os
    import tempfile

    from inferlab.hardware.calibrate import llama_cpp_reference
    from inferlab.hardware.detect import detect_machine
    from inferlab.hardware.profile import save_profile

    profile = dict(profile, llama_cpp=dict(profile["llama_cpp"]))
    profile["llama_cpp"]["reference"] = llama_cpp_reference(profile)
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="inferlab-refit-")
    save_profile(profile)
    return detect_machine(profile=True), profile["llama_cpp"]["reference"]


def _use_refitted_profile() -> None:
    """Point XDG_CONFIG_HOME at a temporary copy of the profile whose reference is refitted."""
    from inferlab.hardware.profile import load_profile

    profile = load_profile()
    if not profile or not (profile.get("llama_cpp") or {}).get("runs"):
        raise SystemExit("--refit: the profile holds no llama.cpp runs")
    refitted_machine(profile)


if __name__ == "__main__":
    main()

"""The rows of an `inferlab validate --json` run predicted again without a machine profile (the
stored reference CPU that detect picks for this CPU), scored against the same vs-probe speeds:
error = prediction without a profile / (the row's predicted / (1 + its matched error)) - 1.
``--no-nearest``: the reference chosen as before nearest_reference (a CPU of a class with no
reference took the first entry), for the side-by-side. Detect measures bandwidth afresh without a
profile, so decode figures move between invocations; run it with an empty config dir:

    XDG_CONFIG_HOME=$(mktemp -d) python benchmarks/validate_without_profile.py validate.json [--gguf F] [--no-nearest]
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", help="the JSON that `inferlab validate --json` printed")
    ap.add_argument("--gguf", help="the real GGUF the run was given with --gguf (its rows are named by its file name)")
    ap.add_argument("--no-nearest", action="store_true", help="AMX/AVX-512 CPUs without their own reference take the first entry")
    ap.add_argument("--n-prompt", type=int, default=128)
    args = ap.parse_args()

    from inferlab.hardware.detect import detect_machine
    from inferlab.hardware.validate import _predict, toy_model
    import inferlab.perf.cpu_model as cm

    if args.no_nearest:
        cm._ISA_SUBSETS.clear()
    d = json.load(open(args.rows))
    rows = d["rows"] if isinstance(d, dict) else d
    m = detect_machine(profile=False)
    print("rates:", cm.rates_label(m.ram))
    errs: dict[str, list[float]] = {"tg": [], "pp": []}
    for r in rows:
        if r["model"].endswith(".gguf"):
            if not args.gguf:
                continue
            path = args.gguf
        else:
            path = toy_model(r["model"], r["preset"])
        _, _, limits, pp = _predict(path, m, r["threads"], args.n_prompt)
        for metric, pred in (("tg", limits.tok_s), ("pp", pp)):
            me, pr = r.get(f"{metric}_matched_error"), r.get(f"{metric}_predicted")
            if me is None or pr is None or pred is None:
                continue
            e = pred / (pr / (1 + me)) - 1  # the row's vs-probe speed: predicted / (1 + matched error)
            errs[metric].append(e)
            print(f"{r['model']:32s} {r['preset']:7s} {metric} without profile {e:+.1%}  with profile {me:+.1%}")
    for k, v in errs.items():
        if v:
            print(k, "median abs", round(statistics.median(abs(x) for x in v), 3), "slow", sum(x < 0 for x in v), "of", len(v))


if __name__ == "__main__":
    main()

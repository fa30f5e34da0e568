"""How far each kernel's decode speed has moved since `inferlab calibrate`: the in-cache pure-type toys
calibrate timed (toy-mini of calibrate.STALL_TYPES, toy-wide-2 for the ladder's Q4_K, toy-thin for
the other types with no toy-mini run) timed again here, interleaved round by round, each over its
calibrate figure in this machine's profile. One state for every kernel (validate's machine_state:
one slowdown of the kernels, a cache scale and a stall scale) assumes the ratios agree; on a shared
guest they need not (the Xeon guest, 2026-12-07 18:00 UTC: 1.04 ... 1.32 at one moment, each type
steady within +-3 % over 12 rounds).

    python benchmarks/kernel_drift.py [--rounds 12] [--threads 2] [--types Q4_0,Q3_K,...] [--json out.json]

Run it on the machine the profile was calibrated on, with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def probes(measured: dict, threads: int, types: list[str] | None) -> dict[str, str]:
    """{type: toy} the in-cache toy of each type calibrate timed at ``threads``: toy-mini where it
    ran, the ladder's toy-wide-2 for its type, else toy-thin (in the cache on the Xeon guest's ramp
    for the denser types only: a drift of its cache shows there too)."""
    from inferlab.hardware import validate as v

    have = {t for (_, t, th) in measured if th == threads}
    in_cache: dict[str, str] = {}  # the ladder's in-cache toy of its type: the first (smallest) of its state probes
    for m, t in v.STATE_PROBES:
        if m != v.CACHE_MODEL:
            in_cache.setdefault(t, m)
    out = {}
    for t in sorted(have):
        for m in (v.CACHE_MODEL, in_cache.get(t), "toy-thin"):
            if m and (m, t, threads) in measured:
                out[t] = m
                break
    return {t: m for t, m in out.items() if types is None or t in types}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", help="comma-separated ggml types (default: every type calibrate timed in the cache)")
    ap.add_argument("--json", help="also write the ratios here")
    args = ap.parse_args()

    from inferlab.hardware import validate as v
    from inferlab.hardware.calibrate import LLAMA_CPP_TYPES
    from inferlab.hardware.detect import detect_machine
    from inferlab.perf.cpu_model import attached_rates

    machine = detect_machine(profile=True)
    rates = attached_rates(machine.ram)
    if not rates or not rates.get("measurements"):
        raise SystemExit("no calibrated llama.cpp rates in this machine's profile: run `inferlab calibrate --engine llama.cpp` first")
    measured = {(m["model"], m["type"], m["threads"]): m["tg_tok_s"] for m in rates["measurements"] if m.get("tg_tok_s")}
    pick = probes(measured, args.threads, args.types.split(",") if args.types else None)
    pick = {t: m for t, m in pick.items() if t in LLAMA_CPP_TYPES and t != "F32"}
    paths = {t: v.toy_model(m, LLAMA_CPP_TYPES[t], pure=True) for t, m in pick.items()}
    ratios: dict[str, list[tuple[float, float]]] = {t: [] for t in pick}
    t0 = time.time()
    for _ in range(args.rounds):
        for t, path in paths.items():
            got = v.llama_bench(path, args.threads, 0, 64, 2)
            ratios[t].append((time.time() - t0, statistics.median(got.samples("tg")) / measured[(pick[t], t, args.threads)]))
    rows = []
    for t, xs in sorted(ratios.items(), key=lambda kv: statistics.median(r for _, r in kv[1])):
        r = [x for _, x in xs]
        rows.append({"type": t, "toy": pick[t], "calibrate_tok_s": measured[(pick[t], t, args.threads)], "ratio_median": statistics.median(r),
                     "ratio_min": min(r), "ratio_max": max(r), "ratios": r, "at_s": [s for s, _ in xs]})
        print(f"{t:8s} {pick[t]:10s} now / calibrate: median {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) over {len(r)} rounds")
    meds = [row["ratio_median"] for row in rows]
    print(f"spread of the medians: {min(meds):.2f} ... {max(meds):.2f} (one kernel state would give one ratio)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": rates.get("id"), "threads": args.threads, "rounds": args.rounds, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

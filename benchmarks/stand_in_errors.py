"""How well the CPU stand-in rule (data/cpu_limits.json kernel_families) times a ggml type a CPU's
rates lack: every type a set of measured rates holds is left out in turn and timed by its stand-in
from the rest (leave one out), and, for a profile that measured more than `calibrate --types quick`
times, every other type is timed from the quick types alone (what a quick calibration predicts for
it). Error = the stand-in's figure / the type's own measured figure - 1 (+: the stand-in predicts the
type faster than llama.cpp ran it), for the per-core decode rate (bytes a second, 1 thread), the rate
at the profile's cores (per-core rate x threads x parallel efficiency, as cpu_model times a decode
matmul) and the prompt-matmul share of the fp32 peak.

    python benchmarks/stand_in_errors.py                              # the stored reference CPUs
    python benchmarks/stand_in_errors.py --profile ~/.config/inferlab/machine_profile.json [--json out.json]
    python benchmarks/stand_in_errors.py --rates tests/data/zen4_full_calibration_rates.json

No measurement is taken: it reads rates measured before (a profile from `inferlab calibrate --engine
llama.cpp`, the entries of data/cpu_limits.json).
"""

from __future__ import annotations

import argparse
import json
import statistics


def _rates(ref: dict) -> tuple[dict, dict, dict, int]:
    per_core = dict(ref["per_core_bytes_per_s"])
    eff = dict(ref.get("parallel_efficiency") or {})
    pp = dict(ref.get("prefill_eff_vs_fp32_peak_by_type") or {})
    by_threads = ref.get("rates_bytes_per_s_by_threads") or {}
    n = max((int(k) for k in by_threads), default=1)
    return per_core, eff, pp, n


def _at_threads(per_core: dict, eff: dict, ty: str, n: int) -> float:
    """cpu_model.cpu_decode_rate_bytes_per_s's formula: per-core rate x threads x efficiency."""
    from inferlab.perf.cpu_model import resolve_type

    key = resolve_type(per_core, ty)[0]
    return per_core[key] * n * (eff[resolve_type(eff, key)[0]] if n > 1 and eff else 1.0)


def errors(ref: dict, known: set[str] | None = None) -> list[dict]:
    """One row per type the rates measured: its stand-in's errors when it is left out (``known``:
    time it from these types only, the type itself never among them)."""
    from inferlab.errors import UnknownNameError
    from inferlab.perf.cpu_model import kernel_family, resolve_type

    per_core, eff, pp, n = _rates(ref)
    rows = []
    for ty in sorted(per_core):
        keep = (known if known is not None else set(per_core)) - {ty}
        if known is not None and ty in known:
            continue
        pc = {k: v for k, v in per_core.items() if k in keep}
        ef = {k: v for k, v in eff.items() if k in keep}
        try:
            s, _ = resolve_type(pc, ty)
        except UnknownNameError:  # no other member of its family, and the family falls back to none (float)
            rows.append({"type": ty, "family": kernel_family(ty), "stand_in": None, "per_core_gbps": per_core[ty] / 1e9})
            continue
        row = {"type": ty, "family": kernel_family(ty), "stand_in": s,
               "per_core_gbps": per_core[ty] / 1e9, "stand_in_per_core_gbps": pc[s] / 1e9,
               "decode_1t_error": pc[s] / per_core[ty] - 1,
               "threads": n}
        if n > 1 and eff:
            row["decode_nt_error"] = _at_threads(pc, ef, ty, n) / _at_threads(per_core, eff, ty, n) - 1
        if ty in pp:
            pk = {k: v for k, v in pp.items() if k in keep}
            if pk:
                sp, _ = resolve_type(pk, ty, prefill=True)
                row.update(prefill_stand_in=sp, prefill_share=pp[ty], stand_in_prefill_share=pk[sp],
                           prefill_error=pk[sp] / pp[ty] - 1)
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for k in ("decode_1t_error", "decode_nt_error", "prefill_error"):
        v = [r[k] for r in rows if k in r]
        if v:
            worst = max(rows, key=lambda r: abs(r.get(k, 0.0)))
            out[k] = {"n": len(v), "median_abs": statistics.median(abs(x) for x in v),
                      "within_15pct": sum(abs(x) <= 0.15 for x in v), "worst": [worst["type"], worst[k]]}
    return out


def _print(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"  {'type':8s} {'family':13s} {'stand-in':9s} {'GB/s/core':>9s} {'its':>6s} {'decode 1t':>9s} {'decode nt':>9s}"
          f"  {'pp stand-in':11s} {'share':>5s} {'its':>5s} {'prefill':>8s}")
    for r in rows:
        if r["stand_in"] is None:
            print(f"  {r['type']:8s} {r['family']:13s} {'none':9s} {r['per_core_gbps']:9.2f}   (no measured type of its family or a fallback)")
            continue
        nt = f"{r['decode_nt_error']:+9.1%}" if "decode_nt_error" in r else f"{'':9s}"
        pp = (f"  {r['prefill_stand_in']:11s} {r['prefill_share']:5.2f} {r['stand_in_prefill_share']:5.2f} {r['prefill_error']:+8.1%}"
              if "prefill_error" in r else "")
        print(f"  {r['type']:8s} {r['family']:13s} {r['stand_in']:9s} {r['per_core_gbps']:9.2f} {r['stand_in_per_core_gbps']:6.2f}"
              f" {r['decode_1t_error']:+9.1%} {nt}{pp}")
    for k, s in summary(rows).items():
        print(f"  {k}: median |error| {s['median_abs']:.1%}, {s['within_15pct']} of {s['n']} within 15 %,"
              f" worst {s['worst'][0]} {s['worst'][1]:+.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a machine profile written by `inferlab calibrate --engine llama.cpp`")
    ap.add_argument("--rates", help="a fitted reference alone (tests/data/*_full_calibration_rates.json)")
    ap.add_argument("--json", help="also write the rows and summaries here")
    args = ap.parse_args()

    from inferlab.hardware.calibrate import COMMON_PRESET_TYPES, QUICK_TYPES
    from inferlab.perf.cpu_model import limits

    sources = []
    if args.profile:
        ref = json.load(open(args.profile))["llama_cpp"]["reference"]
        sources.append((f"profile {ref['id']} ({ref['cpu']})", ref))
    elif args.rates:
        ref = json.load(open(args.rates))
        sources.append((f"rates {ref['id']} ({ref['cpu']})", ref))
    else:
        sources += [(f"reference {r['id']}", r) for r in limits()["references"]]
    result = []
    for name, ref in sources:
        loo = errors(ref)
        _print(f"{name}: each type left out, timed by its stand-in from the other {len(ref['per_core_bytes_per_s']) - 1}", loo)
        entry = {"source": name, "leave_one_out": loo, "leave_one_out_summary": summary(loo)}
        if set(ref["per_core_bytes_per_s"]) - set(QUICK_TYPES):
            quick = errors(ref, set(QUICK_TYPES))
            _print(f"{name}: the types `calibrate --types quick` does not time, from the quick types ({','.join(QUICK_TYPES)})", quick)
            common = errors(ref, set(COMMON_PRESET_TYPES))
            _print(f"{name}: from the common presets' types alone (`--types quick` before 2026-12-04)", common)
            entry.update(quick_types=list(QUICK_TYPES), from_quick=quick, from_quick_summary=summary(quick),
                         common_preset_types=list(COMMON_PRESET_TYPES), from_common_presets=common,
                         from_common_presets_summary=summary(common))
        result.append(entry)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""Each calibration's profile, refit by the code as it is now, scored on each validate run's rows
("vs probe": the row's measured speed relative to the level probe around its repetitions, carried to
the probe's calibrated level; benchmarks/repredict_validate.py does one pair): a calibration's rates
are held out from every run (the rows are toys of other shapes and SmolLM2, none in the fit), and a
run scored with every calibration shows which misses follow the run and which the calibration.

    python benchmarks/cross_scores.py CALIBRATIONS.json RUNS.json [--gguf SmolLM2.gguf] [--json out.json]

CALIBRATIONS.json: {name: a machine profile (at least its host, cpu and llama_cpp.runs)}; RUNS.json:
{name: [rows of `inferlab validate --json`, with tg/pp_predicted and tg/pp_matched_error]}.
``--state``: decode scored at the machine's state (`validate --state` runs): each repetition's
recorded level-probe and state-probe speeds re-solved with the calibration's own profile
(validate.machine_state), as validate scores them; prefill vs probe as without it.
``--without-chunks``: the fit and the prediction without the cost of the chunks the threads start in
DRAM (cpu_model.dram_chunk_s), as before 2026-12-07. Run it on the machine the profiles were measured
on: the prediction takes this machine's detected CPU, with each profile's rates attached.
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("calibrations")
    ap.add_argument("runs")
    ap.add_argument("--gguf", help="the real GGUF the runs were given with --gguf (its rows are named by its file name)")
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--without-chunks", action="store_true", help="no chunk-start term in the fit or the prediction")
    ap.add_argument("--state", action="store_true", help="decode at the machine's state (runs of `validate --state`)")
    ap.add_argument("--json", help="also write the matrix here")
    args = ap.parse_args()

    import inferlab.hardware.calibrate as cal
    from inferlab.hardware.validate import _predict, toy_model
    from repredict_validate import refitted_machine, vs_probe_error

    if args.without_chunks:
        fit = cal.llama_cpp_reference

        def reference(profile: dict) -> dict:  # the runs carry no chunk counts: the fit has no such column
            import inferlab.perf.cpu_model as cm

            real, cm.decode_chunks = cm.decode_chunks, lambda *a, **k: 0
            try:
                return fit(profile)
            finally:
                cm.decode_chunks = real
        cal.llama_cpp_reference = reference
    cals, runs = json.load(open(args.calibrations)), json.load(open(args.runs))
    matrix: dict = {}
    fits: dict = {}
    errors: dict = {"tg": [], "pp": []}
    for cname, profile in cals.items():
        machine, ref = refitted_machine(profile)
        # the decode fit's residuals (fitted / measured seconds - 1; below 0: the toy ran slower than the fit):
        # the largest by thread count, and the thin toy's on 2 threads by type
        thin = {m["type"]: m["fit_residual"] for m in ref["measurements"] if (m["model"], m["threads"]) == ("toy-thin", 2) and "fit_residual" in m}
        fits[cname] = {"max_rel_residual_by_threads": ref["max_rel_residual_by_threads"], "toy_thin_2_threads": thin,
                       "dram_chunk_s_by_threads": ref.get("dram_chunk_s_by_threads") or {}}
        state = _state(machine, threads=2) if args.state else None
        line = f"{cname:6s}"
        for rname, rows in runs.items():
            cell: dict = {"tg": [], "pp": []}
            for r in rows:
                path = args.gguf if r["model"].endswith(".gguf") else toy_model(r["model"], r["preset"])
                if path is None:
                    continue
                _, _, limits, pp = _predict(path, machine, r["threads"], args.n_prompt)
                for metric, pred in (("tg", limits.tok_s), ("pp", pp)):
                    e = at_state_error(r, path, machine, state) if metric == "tg" and args.state else vs_probe_error(r, metric, pred)
                    if e is not None:
                        cell[metric].append({"model": r["model"], "preset": r["preset"], "error": e})
                        errors[metric].append(e)
            matrix.setdefault(cname, {})[rname] = {m: {"within_15pct": sum(abs(x["error"]) <= 0.15 for x in v), "n": len(v),
                                                       "misses": [f"{x['model']} {x['preset']} {100 * x['error']:+.1f} %" for x in v
                                                                  if abs(x["error"]) > 0.15]} for m, v in cell.items()}
            line += f" | {rname} {matrix[cname][rname]['tg']['within_15pct']}/{matrix[cname][rname]['pp']['within_15pct']}"
        print(line + "   (decode/prefill rows within 15 %)")
        print("       fit: largest residual " + ", ".join(f"{t} thread(s) {v:.1%}" for t, v in ref["max_rel_residual_by_threads"].items())
              + "; toy-thin on 2 threads " + (f"{min(thin.values()):+.1%} ... {max(thin.values()):+.1%}" if thin else "-")
              + "; chunk start " + (", ".join(f"{t} thread(s) {v * 1e6:.2f} us" for t, v in fits[cname]["dram_chunk_s_by_threads"].items()) or "none"))
    total = {m: {"within_15pct": sum(abs(e) <= 0.15 for e in v), "n": len(v), "median_abs_pct": round(100 * statistics.median(abs(e) for e in v), 1)}
             for m, v in errors.items() if v}
    print("all:", total)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"without_chunks": args.without_chunks, "state": args.state, "fits": fits, "matrix": matrix, "total": total}, f, indent=1)


def _state(machine, threads: int):
    """(the parts of the level probe and the state probes, their speeds at calibrate) with ``machine``'s
    profile, as validate --state takes them."""
    from inferlab.hardware import validate as v

    probe = v.level_probe()
    st = v.state_probes(probe, machine, threads, v.probe_reference(probe, machine, threads, 128)[0])
    if not st:
        raise SystemExit("--state: the profile holds no cache ramp (or no state probe figures)")
    return st[1], st[2]


def at_state_error(row: dict, path: str, machine, state) -> float | None:
    """The row's decode predicted at the machine's state around each repetition (its recorded probe
    speeds re-solved with ``machine``'s profile) over its measured speed, the median, less 1."""
    from inferlab.hardware import validate as v

    samples = row.get("tg_state_probe_samples")
    dp = v.decode_parts(path, machine, row["threads"])
    if not samples or dp is None:
        return None
    parts, refs = state
    solved = [v.machine_state(parts, refs, (p, *(s[i] for s in samples))) for i, p in enumerate(row["tg_probe_samples"])]
    return statistics.median(1 / float(dp.seconds(x, k, g)) / sp for (x, k, g, _), sp in zip(solved, row["tg_samples"])) - 1


if __name__ == "__main__":
    main()

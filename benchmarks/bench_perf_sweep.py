"""Sweep the whole catalog through place + decode_step_time (+ prefill_time) and print
configurations per second. Target (issue 2): the whole sweep in under 2 s on a 2-core machine.

    python benchmarks/bench_perf_sweep.py [--repeat 3] [--json benchmarks/results/perf_sweep.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

PRESETS = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "IQ4_XS"]
CONTEXTS = [2048, 8192, 32768, 131072]


def sweep(models, machines, place, decode_step_time, prefill_time) -> tuple[int, int]:
    n = fits = 0
    for m in models.values():
        for mc in machines.values():
            for q in PRESETS:
                for ctx in CONTEXTS:
                    p = place(m, mc, q, ctx)
                    decode_step_time(p, mc, ctx // 2)
                    n += 1
                    fits += p.fits
    return n, fits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="benchmarks/results/perf_sweep.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    from inferlab.perf_model import CATALOG_MACHINES, MODELS, decode_step_time, prefill_time
    from inferlab.perf.placement import place

    t_import = time.perf_counter() - t0
    runs: list[float] = []
    cpu: list[float] = []  # CPU seconds of this process: what the sweep costs when the machine is shared
    for r in range(args.repeat):
        if r == 0:
            pass  # the first run is cold: tensor plans and KV tables are computed and cached
        t, c = time.perf_counter(), time.process_time()
        n, fits = sweep(MODELS, CATALOG_MACHINES, place, decode_step_time, prefill_time)
        runs.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    out = {"configurations": n, "fitting": fits, "models": len(MODELS), "machines": len(CATALOG_MACHINES), "presets": PRESETS,
           "contexts": CONTEXTS, "import_s": t_import, "cold_s": runs[0], "warm_s": min(runs[1:]) if len(runs) > 1 else None,
           "cold_cpu_s": cpu[0], "warm_cpu_s": min(cpu[1:]) if len(cpu) > 1 else None, "cold_configs_per_s": n / runs[0], "warm_configs_per_s": n / min(runs[1:]) if len(runs) > 1 else None, "cpu_count": os.cpu_count()}
    print(f"{n} configurations ({len(MODELS)} models x {len(CATALOG_MACHINES)} machines x {len(PRESETS)} presets x {len(CONTEXTS)} contexts), {fits} fit")
    print(f"import: {t_import:.2f} s; fresh process (import + cold sweep): {t_import + runs[0]:.2f} s  (target: under 2 s)")
    print(f"cold sweep: {runs[0]:.2f} s wall, {cpu[0]:.2f} s CPU  ({out['cold_configs_per_s']:,.0f} configurations/s, plans computed)")
    if out["warm_s"]:
        print(f"warm sweep: {out['warm_s']:.2f} s wall, {out['warm_cpu_s']:.2f} s CPU  ({out['warm_configs_per_s']:,.0f} configurations/s)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

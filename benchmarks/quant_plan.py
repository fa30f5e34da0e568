"""Tensor plans: how fast they are made, and how far their sizes are from published files.

Prints (1) the time to plan the whole catalog at six presets, cold and cached, and (2) the size
error of every row of ../shared/reference/gguf_sizes_dev.json (a copy lives in tests/quant/data),
then writes both to benchmarks/results/quant_plan.json.

    python benchmarks/quant_plan.py
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from inferlab.models.catalog import MODELS
from inferlab.quant.plan import layer_bytes, weight_bytes
from inferlab.quant.presets import Preset, resolve_quant

ROOT = Path(__file__).resolve().parents[1]
SIZES = ROOT / "tests" / "quant" / "data" / "gguf_sizes_dev.json"
PRESETS = ["Q4_K_M", "Q8_0", "Q6_K", "Q5_K_M", "Q3_K_M", "preset:Q2_K"]
MODEL_IDS = {"Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b", "Qwen2.5-7B-Instruct": "qwen2.5-7b",
             "Llama-2-7B (llama-bench size column)": "llama-2-7b"}


def time_plans() -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    for m in MODELS.values():
        for q in PRESETS:
            weight_bytes(m, q)
            layer_bytes(m, q)
    cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0  # CPU time: this box is shared
    t0 = time.perf_counter()
    n = 0
    for _ in range(20):
        for m in MODELS.values():
            for q in PRESETS:
                weight_bytes(m, q)
                layer_bytes(m, q)
                n += 1
    warm = (time.perf_counter() - t0) / n
    return {"n_models": len(MODELS), "n_presets": len(PRESETS), "cold_s": cold, "cold_cpu_s": cold_cpu, "cached_call_s": warm}


def size_errors() -> list[dict]:
    rows = json.loads(SIZES.read_text())

    def quant(r):
        q = resolve_quant("preset:" + r["quant"].upper())
        if r["quant"] == "Q2_K" and "2023 rules" in r["notes"]:
            return Preset(q.name, rules="2023")  # made with 2023's Q2_K mix
        return Preset(q.name, imatrix=True) if r["uploader"] == "bartowski" and q.imatrix is None and q.display_name is None else q

    meta = {MODEL_IDS[r["model"]]: r["size_bytes"] - weight_bytes(MODELS[MODEL_IDS[r["model"]]], quant(r))["total"]
            for r in rows if "size_bytes" in r}
    out = []
    for r in rows:
        mid = MODEL_IDS[r["model"]]
        q = quant(r)
        tb = weight_bytes(MODELS[mid], q)["total"]
        if "size_bytes" in r:
            pred, actual, unit = tb + meta[mid], r["size_bytes"], "bytes (exact)"
        elif r["size_unit"].startswith("GiB"):
            pred, actual, unit = tb, r["size_listed"] * 2**30, "GiB of tensor data"
        else:
            pred, actual, unit = tb + meta[mid], r["size_listed"] * 1e9, "GB listed (3 s.f.)"
        out.append({"model": mid, "uploader": r["uploader"], "quant": r["quant"], "plan": q.label, "unit": unit,
                    "planned_bytes": pred, "published_bytes": actual, "error": (pred - actual) / actual,
                    "notes": r["notes"]})
    return out


def main() -> None:
    timing = time_plans()
    print(f"plans: {timing['n_models']} models x {timing['n_presets']} presets: cold {timing['cold_s']:.2f} s "
          f"({timing['cold_cpu_s']:.2f} s CPU, inventories included), "
          f"cached weight_bytes+layer_bytes {timing['cached_call_s'] * 1e6:.1f} us per (model, preset)")
    errs = size_errors()
    for e in errs:
        print(f"  {e['model']:12s} {e['uploader']:13s} {e['quant']:9s} {e['unit']:20s} planned {e['planned_bytes'] / 1e9:7.3f} GB "
              f"published {e['published_bytes'] / 1e9:7.3f} GB  error {e['error'] * 100:+6.2f}%")
    a = [abs(e["error"]) for e in errs]
    print(f"size error over {len(a)} rows: median {statistics.median(a) * 100:.3f}%, "
          f"max {max(a) * 100:.3f}%")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant_plan.json").write_text(json.dumps({"timing": timing, "sizes": errs}, indent=1))


if __name__ == "__main__":
    main()

"""Behaviour snapshot for refactorings: digests of everything the core computes.

    python tests/equivalence/snapshot.py --write   # refresh tests/equivalence/golden.json (only on purpose)

It goes through the seed facades only (``inferlab.perf_model``, ``inferlab.kv_managers``,
``inferlab.kv.traces``), whose names outlive any internal cut, so one script runs on the code before
and after a restructuring. Three parts, each a sha256 per group so a difference points at its
place: the catalog sweep (llama.cpp-order placement + decode + prefill under both speed models,
every catalog model x machine x preset x context), every preset's tensor plan on every catalog
model, and the three engines on a window of the Mooncake conversation trace at three capacities
(every request's record and the run summary).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden.json"
TRACE = HERE.parent / "data" / "mooncake_conversation_head.jsonl"
PRESETS = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "IQ4_XS"]
CONTEXTS = [2048, 8192, 32768, 131072]
TRACE_REQUESTS = 1500
CAPACITIES = [32768, 131072, 524288]


def _digest(rows) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=repr).encode()).hexdigest()


def _r(x):
    return None if x is None else float(f"{x:.12g}")  # 12 significant digits: summation order may change the last bits


def sweep_digests() -> dict[str, str]:
    from inferlab import perf_model as pm

    calibrated = pm.CALIBRATED() if callable(pm.CALIBRATED) else pm.CALIBRATED
    out = {}
    for mid, m in pm.MODELS.items():
        rows = []
        for key, mc in pm.CATALOG_MACHINES.items():
            for q in PRESETS:
                for ctx in CONTEXTS:
                    p = pm.place(m, mc, "preset:" + q, ctx, order="llama.cpp")
                    row = [key, q, ctx, p.fits, p.n_gpu_layers, p.n_ctx, [(d.name, d.n_blocks, d.has_output, d.total_bytes) for d in p.devices]]
                    for speed in (pm.LESSON, calibrated):
                        d = pm.decode_step_time(p, mc, ctx // 2, 1, speed)
                        d4 = pm.decode_step_time(p, mc, ctx // 2, 4, speed)
                        f = pm.prefill_time(p, mc, 512, speed)
                        row.append([_r(d["total_s"]), d["bound"], _r(d4["total_s"]), _r(f["total_s"]), _r(f["pcie_s"])])
                    rows.append(row)
        out[mid] = _digest(rows)
    return out


def plan_digests() -> dict[str, str]:
    from inferlab import perf_model as pm
    from inferlab.quant.presets import presets

    out = {}
    for mid, m in pm.MODELS.items():
        rows = []
        for name in sorted(presets()):
            plan = pm.tensor_plan(m, pm.resolve_quant("preset:" + name))
            rows.append([name, [(t.name, t.ggml_type, t.n_bytes) for t in plan]])
        out[mid] = _digest(rows)
    return out


def engine_digests() -> dict[str, str]:
    from inferlab.kv.traces import load_mooncake
    from inferlab.kv_managers import SlotManager, PagedManager, RadixManager, simulate

    reqs = load_mooncake(str(TRACE), limit=TRACE_REQUESTS)
    out = {}
    for cap in CAPACITIES:
        for name, cls in (("llamacpp", SlotManager), ("vllm", PagedManager), ("sglang", RadixManager)):
            run = simulate(reqs, cls(capacity_tokens=cap), record_timeline=False)
            recs = [[r.id, r.cached_tokens, r.computed_prompt_tokens, r.recomputed_tokens, r.preemptions, r.output_tokens,
                     r.ttft_s, r.finish_s, r.rejected, r.truncated] for r in run.requests]
            out[f"{name}@{cap}"] = _digest([recs, {k: v for k, v in run.summary.items() if not k.endswith("wall_s")}])
    return out


def snapshot() -> dict[str, dict[str, str]]:
    return {"sweep": sweep_digests(), "plans": plan_digests(), "engines": engine_digests()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="overwrite the golden file")
    ap.add_argument("--part", choices=["sweep", "plans", "engines"])
    args = ap.parse_args()
    fn = {"sweep": sweep_digests, "plans": plan_digests, "engines": engine_digests}
    snap = {args.part: fn[args.part]()} if args.part else snapshot()
    if args.write:  # one part rewrites only that part
        gold = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        gold.update(snap)
        GOLDEN.write_text(json.dumps(gold, indent=1, sort_keys=True) + "\n")
        return
    gold = json.loads(GOLDEN.read_text())
    bad = [(part, k) for part, d in snap.items() for k, v in d.items() if gold[part].get(k) != v]
    print(f"{sum(len(d) for d in snap.values())} digests, {len(bad)} differ: {bad[:20]}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

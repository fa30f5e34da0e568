"""Tensor plans: how fast they are made, and how far their sizes are from published files.

Prints (1) the time to plan the whole catalog at six presets, cold and cached, (2) the size
error of every row of ../shared/reference/gguf_sizes_dev.json (a copy lives in tests/quant/data),
(3) with llama-cpp-python installed, the error against llama.cpp's own quantizer of every preset
and community variant on every catalog model at its real shape (llama_model_quantize's dry run on
a skeleton GGUF: its types, bytes by gguf-py's block table, and the total it logs), and with
--real the real quantizations of tests/quant/test_real_quantizer.py's scaled models (exact bytes
of the written files); then writes them to benchmarks/results/quant_plan.json.

    python benchmarks/quant_plan.py [--real]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
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
        imatrix = r["uploader"] == "bartowski" or "-i1-GGUF" in r["source_url"] or ".i1-" in r["source_url"]  # mradermacher's i1 repos
        return Preset(q.name, imatrix=True) if imatrix and q.imatrix is None and q.display_name is None else q

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


def imatrix_effect() -> list[dict]:
    """IQ4_XS planned without and with an importance matrix (the only difference: the first n/8
    ffn_down in Q5_K without one), per catalog model: the size of the error when a published
    file's imatrix is assumed wrongly. No llama.cpp rule for IQ4_XS depends on the model's size."""
    out = []
    for mid, m in MODELS.items():
        static = weight_bytes(m, Preset("IQ4_XS", imatrix=False))["total"]
        imat = weight_bytes(m, Preset("IQ4_XS", imatrix=True))["total"]
        out.append({"model": mid, "params_b": m.total_params() / 1e9, "static_bytes": static, "imatrix_bytes": imat,
                    "static_over_imatrix": static / imat - 1})
    return out


def _catalog_quants() -> list[tuple[str, Preset]]:
    """Every preset, both ways where an imatrix changes a rule, and every community variant; master's rules."""
    from inferlab.quant.presets import presets, variants

    out = []
    for name in sorted(presets()):
        for im in ((None, True) if name in ("IQ3_XXS", "IQ4_NL", "IQ4_XS", "Q4_0", "Q5_0") else (None,)):
            out.append((name + ("+imatrix" if im else ""), Preset(name, imatrix=im, rules="master")))
    for v in variants().values():
        out.append((v.name, Preset(v.preset, imatrix=v.imatrix, output_type=v.output_type, token_embd_type=v.token_embd_type,
                                   rules="master", display_name=v.name)))
    return out


def quantizer_errors() -> list[dict]:
    """Planned tensor bytes vs llama.cpp's dry run at each catalog model's real shape."""
    from inferlab.quant.llama_check import CHECKABLE_ARCHITECTURES, dry_run, llama_bytes, write_skeleton
    from inferlab.quant.plan import plan_imatrix, tensor_plan

    out = []
    with tempfile.TemporaryDirectory() as d:
        for mid, m in MODELS.items():
            if m.arch not in CHECKABLE_ARCHITECTURES:
                continue
            src = write_skeleton(m, Path(d) / "skeleton.gguf")
            for label, q in _catalog_quants():
                imatrix = plan_imatrix(m, q)
                types, logged = dry_run(src, q, imatrix=imatrix)
                plan = tensor_plan(m, q)
                planned = sum(e.n_bytes for e in plan)
                real = llama_bytes(m, types)
                out.append({"model": mid, "quant": label, "imatrix": imatrix, "planned_bytes": planned, "llama_cpp_bytes": real,
                            "llama_cpp_logged_mib": logged / 2**20, "error": (planned - real) / real,
                            "tensors_differing": sum(types.get(e.name) != e.ggml_type for e in plan)})
    return out


_IM = {True: "+imatrix", False: ""}


def real_quantizer_errors() -> list[dict]:
    """The real quantizations of tests/quant/test_real_quantizer.py (two worker processes)."""
    sys.path.insert(0, str(ROOT / "tests" / "quant"))
    import test_real_quantizer as T  # noqa: E402

    from inferlab.quant.llama_check import quantize_cases
    from inferlab.quant.plan import tensor_plan

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        seconds: dict = {}
        got = quantize_cases(T.CASES, d, n_workers=2, spread=T._spread, seconds=seconds)
        wall = time.perf_counter() - t0
    per_worker = {}
    for w, t in seconds.values():
        per_worker[w] = per_worker.get(w, 0.0) + t
    slowest = sorted(seconds.items(), key=lambda kv: -kv[1][1])[:6]
    print(f"real quantizations per worker (s): {', '.join(f'{w}: {t:.0f}' for w, t in sorted(per_worker.items()))}; "
          f"slowest: {', '.join(f'{k[0]}/{k[1]}{_IM[k[2]]} {t:.1f}' for k, (_, t) in slowest)}")
    out = []
    for key, (spec, q, im) in T.CASES.items():
        r = got[key]
        if isinstance(r, Exception):
            out.append({"model": key[0], "quant": key[1], "imatrix": im, "refused": str(r)})
            continue
        planned = sum(e.n_bytes for e in tensor_plan(spec, q))
        real = sum(b for _, b in r.values())
        out.append({"model": key[0], "quant": key[1], "imatrix": im, "planned_bytes": planned, "llama_cpp_bytes": real,
                    "error": (planned - real) / real})
    print(f"real quantizations: {len(out)} files in {wall:.0f} s wall")
    return out


def _print_quantizer_table(rows: list[dict], what: str) -> None:
    ok = [r for r in rows if "error" in r]
    by_quant: dict[str, list[float]] = {}
    for r in ok:
        by_quant.setdefault(r["quant"], []).append(abs(r["error"]))
    print(f"{what}: {len(ok)} (model, quant) pairs, {len({r['model'] for r in ok})} models; max |error| per quant:")
    line = []
    for q, errs in by_quant.items():
        line.append(f"{q} {max(errs) * 100:.4f}%")
        if len(line) == 6:
            print("  " + "  ".join(line))
            line = []
    if line:
        print("  " + "  ".join(line))
    worst = max(ok, key=lambda r: abs(r["error"]))
    within = sum(abs(r["error"]) <= 0.003 for r in ok)
    exact = sum(r["planned_bytes"] == r["llama_cpp_bytes"] for r in ok)
    print(f"  byte-exact: {exact}/{len(ok)}; within 0.3 %: {within}/{len(ok)}; worst {worst['model']} {worst['quant']} {worst['error'] * 100:+.4f}%"
          + (f"; refused by llama.cpp: {[(r['model'], r['quant']) for r in rows if 'refused' in r]}" if len(ok) < len(rows) else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="also quantize the scaled test models for real (~2 min)")
    args = ap.parse_args()
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
    result = {"timing": timing, "sizes": errs, "iq4_xs_imatrix_effect": imatrix_effect()}
    big = [r for r in result["iq4_xs_imatrix_effect"] if r["params_b"] > 8.5]
    print(f"IQ4_XS planned static / with imatrix - 1, models > 8.5B params ({len(big)}): "
          f"{min(r['static_over_imatrix'] for r in big) * 100:+.2f}% .. {max(r['static_over_imatrix'] for r in big) * 100:+.2f}%")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed: no comparison with llama.cpp's quantizer")
    else:
        result["quantizer"] = quantizer_errors()
        _print_quantizer_table(result["quantizer"], "llama.cpp's quantizer (dry run) at each catalog model's real shape")
        if args.real:
            result["real_quantizer"] = real_quantizer_errors()
            _print_quantizer_table(result["real_quantizer"], "llama.cpp's quantizer, real files of scaled models")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant_plan.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

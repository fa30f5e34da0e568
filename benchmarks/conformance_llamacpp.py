"""SlotManager against a real llama-server: every conformance case, and the concurrent ones repeated.

Builds (or finds cached) llama-server with scripts/build_llama_server.sh, runs the sequential
cases of tests/conformance/_llama_server_cases.py once and the concurrent ones ``--repeat`` times
(their interleaving varies run to run), prints one summary line and writes
benchmarks/results/conformance_llamacpp.json (engine, llama.cpp commit, cases, requests,
agreement) for the README's table.

    python benchmarks/conformance_llamacpp.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "conformance"))

from _llama_server import (LlamaServer, build_info, compare, compare_concurrent, parse_log,  # noqa: E402
                           run_concurrent, run_sequential, server_binary, simulate_concurrent,
                           simulate_sequential, tiny_gguf)
from _llama_server_cases import CONCURRENT, SEQUENTIAL, SEQUENTIAL_RANDOM  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def _n_differing(diffs: list[str]) -> int:
    return len({d.split(":")[0] for d in diffs})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each concurrent case")
    args = ap.parse_args()
    t0 = time.perf_counter()
    binary = server_binary()
    info = build_info(binary)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tiny_gguf(tmp / "tiny.gguf")
        for case in SEQUENTIAL + SEQUENTIAL_RANDOM:
            with LlamaServer(binary, model, list(case.server_args), tmp / f"{case.name}.log") as srv:
                prompts, replies, seen = run_sequential(srv, case)
            diffs = compare(seen, simulate_sequential(case, prompts, replies))
            n = len(prompts)
            rows.append({"case": case.name, "kind": "sequential", "flags": " ".join(case.server_args),
                         "requests": n, "agree": n - _n_differing(diffs), "differences": diffs, "why": case.why})
        for case in CONCURRENT:
            for rep in range(args.repeat):
                log = tmp / f"{case.name}-{rep}.log"
                with LlamaServer(binary, model, list(case.server_args), log, verbose=True) as srv:
                    _, prompts, replies, seen, _ = run_concurrent(srv, case)
                    trace = parse_log(srv.log_text())
                n = len(prompts)
                row = {"case": case.name, "kind": "concurrent", "run": rep, "flags": " ".join(case.server_args),
                       "requests": n, "why": case.why}
                for mode in ("same_instant", "as_received"):
                    sim, _ = simulate_concurrent(case, prompts, replies, trace, as_received=mode == "as_received")
                    diffs = compare_concurrent(seen, trace, prompts, sim)
                    row[f"agree_{mode}"] = n - _n_differing(diffs)
                    row[f"differences_{mode}"] = diffs
                rows.append(row)
    seq = [r for r in rows if r["kind"] == "sequential"]
    con = [r for r in rows if r["kind"] == "concurrent"]
    s_req, s_ok = sum(r["requests"] for r in seq), sum(r["agree"] for r in seq)
    c_req = sum(r["requests"] for r in con)
    c_inst, c_recv = sum(r["agree_same_instant"] for r in con), sum(r["agree_as_received"] for r in con)
    out = {
        "engine": "llamacpp",
        "engine_version": f"llama.cpp {info.get('llama_cpp_commit', 'unknown')[:7]} "
                          f"(llama-cpp-python {info.get('llama_cpp_python', '?')})",
        "llama_cpp_commit": info.get("llama_cpp_commit"),
        "sequential": {"cases": len(seq), "requests": s_req, "agree": s_ok, "agreement": s_ok / s_req},
        "concurrent": {"cases": len(CONCURRENT), "runs": len(con), "requests": c_req,
                       "agree_as_received": c_recv, "agreement_as_received": c_recv / c_req,
                       "agree_same_instant": c_inst, "agreement_same_instant": c_inst / c_req},
        "compared": ["id_slot", "timings.cache_n", "outcome", "tokens generated", "/slots n_prompt_tokens (sequential)"],
        "rows": rows,
        "wall_s": time.perf_counter() - t0,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "conformance_llamacpp.json").write_text(json.dumps(out, indent=1) + "\n")
    line = (f"conformance llamacpp {out['engine_version']}: sequential {len(seq)} cases, {s_ok}/{s_req} requests agree "
            f"({100 * s_ok / s_req:.1f} %); concurrent {len(CONCURRENT)} cases x {args.repeat} runs, "
            f"{c_recv}/{c_req} agree as received ({100 * c_recv / c_req:.1f} %), {c_inst}/{c_req} at one instant "
            f"({100 * c_inst / c_req:.1f} %); {out['wall_s']:.0f} s")
    print(line)  # noqa: T201


if __name__ == "__main__":
    main()

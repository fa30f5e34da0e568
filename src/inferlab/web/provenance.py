"""Where each number the page shows comes from, in words: the same ORIGINS as the reports.

The reports carry their input figures (``FitReport.figures``); this names the origin of the
computed outputs the page draws (bytes from the quant plan or the file, placement by llama.cpp's
rules, speeds from a named speed model), so a hover and the JSON say the same thing.
"""

from __future__ import annotations

from typing import Any

SPEED_MODELS = {
    "calibrated": "the calibrated speed model (efficiencies and a per-block cost fitted on published llama-bench "
                  "results, data/llama_bench_dev.json; llama.cpp's CPU kernel rates for CPU layers)",
    "bandwidth-only": "the bandwidth-only roofline (the lesson's fixed efficiencies: 70 % of peak bandwidth for decode, "
                      "50 % of peak FP16 for prefill) on vendor figures",
    "lesson": "the bandwidth-only roofline on the lesson's own device approximations",
}


def _p(origin: str, source: str) -> dict[str, str]:
    return {"origin": origin, "source": source}


def fit_provenance(report: Any) -> dict[str, dict[str, str]]:
    """Origin and source of every output of a FitReport the calculator shows."""
    d: dict[str, Any] = report if isinstance(report, dict) else report.to_dict()
    own_tensors = d.get("file") is not None and d["quant"].startswith("the file's own tensors")
    bytes_src = (_p("file", "the tensor table of the model file") if own_tensors else
                 _p("estimated", f"inferlab's tensor plan: the model's tensors x llama-quantize's rules for {d['quant']}"))
    speed_model: str = d["speed_model"]
    speed = _p("estimated", SPEED_MODELS.get(speed_model, speed_model))
    mach = next((f for f in d["figures"] if f["name"].endswith("memory")), None)
    cap = _p("catalog" if mach is None else mach["origin"],
             "device memory" + (f" ({mach['source']})" if mach else "") + ", less llama.cpp's --fit-target margin of 1024 MiB "
             "(Apple: Metal's working-set limit)")
    place = _p("estimated", f"llama.cpp's placement rules ({d['order']} layer order, -ngl {d['n_gpu_layers']}); "
                            "KV from the model's dimensions; compute buffers approximate (n_ubatch x 4 x (3 d_ffn + vocab) bytes)")
    return {"weights_bytes": bytes_src, "bits_per_weight": bytes_src, "devices.weights_bytes": place,
            "devices.kv_bytes": place, "devices.compute_bytes": place, "devices.total_bytes": place,
            "devices.capacity_bytes": cap, "n_gpu_layers": place, "decode": speed, "prefill": speed}


def sim_provenance(report: Any) -> dict[str, dict[str, str]]:
    d = report if isinstance(report, dict) else report.to_dict()
    timed = d.get("time_unit") == "s"
    return {
        "summary": _p("estimated", "inferlab's simulator of each engine's KV manager and scheduler (kv/: llama.cpp's slots, "
                                   "vLLM's paged blocks, SGLang's radix tree) on this workload"),
        "time": _p("estimated", "step times priced by the calibrated speed model on each engine's placement") if timed
                else _p("assumed", "untimed: every engine step lasts one unit"),
        "capacity_tokens": _p("assumed" if d.get("model") is None else "estimated",
                              "the KV pool given (the lesson's 384 token cells)" if d.get("model") is None
                              else "each engine's pool rule on its placement (kv.pool)"),
    }

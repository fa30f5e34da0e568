"""The seed's inference_trace: what happens on the hardware, step by step, as data.

``decode_curve`` (decode speed as the context grows), ``load_steps`` (a llama.cpp-style model
load: mmap, copies over PCIe, KV allocation) and ``request_timeline`` (prefill then decode of one
request). Pure functions over a placement; the CLI and plots draw them.
"""

from __future__ import annotations

from .errors import InvalidValueError
from .hardware.device import Machine
from .perf.placement import Placement
from .perf.speed import BANDWIDTH_ONLY as LESSON, SpeedModel, decode_step_time, prefill_time

NVME_GBPS = 3.5  # a PCIe 3/4 NVMe drive's sequential read, GB/s (the lesson's 3-7 GB/s range)


def decode_curve(placement: Placement, machine: Machine, contexts, batch: int = 1, model: SpeedModel = LESSON) -> list[dict]:
    """Decode speed at each context length: rows with context, tok_s, total_s, gpu_s, cpu_s, kv_read_bytes."""
    rows = []
    for c in contexts:
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise InvalidValueError(f"contexts must be integers >= 0, got {c!r}")
        if c > placement.n_ctx:
            raise InvalidValueError(f"context {c} exceeds the placement's n_ctx {placement.n_ctx}; place with a larger n_ctx")
        d = decode_step_time(placement, machine, c, batch, model)
        rows.append({"context": c, "tok_s": d["tok_per_s"], "total_s": d["total_s"], "gpu_s": d["gpu_s"], "cpu_s": d["cpu_s"],
                     "kv_read_bytes": sum(p["kv_bytes"] for p in d["per_device"]),
                     "weights_read_bytes": sum(p["weights_bytes"] for p in d["per_device"])})
    return rows


def load_steps(placement: Placement, machine: Machine, disk_gbps: float = NVME_GBPS, page_cache: bool = False) -> list[dict]:
    """The steps of a llama.cpp load with their bytes and seconds: the header, mmap of the file,
    copying the offloaded layers to the GPU(s), allocating the KV cache and compute buffers."""
    steps = [{"step": "read header", "bytes": 0, "s": 0.0, "detail": "GGUF metadata and tensor table"}]
    steps.append({"step": "mmap the file", "bytes": 0, "s": 0.0,
                  "detail": "addressable, not read: CPU layers page in on first touch" + (" (already in the page cache)" if page_cache else "")})
    read_bps = (float("inf") if page_cache else disk_gbps * 1e9)
    for g in placement.gpus:
        if not g.weights_bytes:
            continue
        link = machine.pcie_gbs * 1e9 if not machine.unified and machine.pcie_gbs else float("inf")
        rate = min(read_bps, link)  # bounded by the slower of the drive and the link
        steps.append({"step": f"copy {g.n_blocks} blocks{' + output' if g.has_output else ''} to {g.name}", "bytes": g.weights_bytes,
                      "s": g.weights_bytes / rate if rate != float("inf") else 0.0, "detail": "read from the file, copied over PCIe"})
    for d in placement.devices:
        if d.kv_bytes:
            steps.append({"step": f"allocate KV cache on {d.name}", "bytes": d.kv_bytes, "s": 0.0,
                          "detail": f"{placement.n_ctx} tokens × {placement.kv_type}, reserved up front"})
        if d.compute_bytes:
            steps.append({"step": f"compute buffer on {d.name}", "bytes": d.compute_bytes, "s": 0.0, "detail": "activations for one micro-batch"})
    cpu_w = placement.cpu.weights_bytes
    steps.append({"step": "first token touches CPU layers", "bytes": cpu_w, "s": 0.0 if page_cache else cpu_w / read_bps,
                  "detail": "lazy page-in of the mmap'd CPU-resident weights"})
    return steps


def request_timeline(placement: Placement, machine: Machine, prompt_tokens: int, new_tokens: int, model: SpeedModel = LESSON) -> dict:
    """Prefill of the prompt, then decode of new_tokens one at a time: TTFT, per-token times, totals."""
    if new_tokens < 0:
        raise InvalidValueError(f"new_tokens must be >= 0, got {new_tokens!r}")
    pre = prefill_time(placement, machine, prompt_tokens, model)
    steps = [decode_step_time(placement, machine, prompt_tokens + i, 1, model)["total_s"] for i in range(new_tokens)]
    return {"ttft_s": pre["total_s"], "decode_s": steps, "total_s": pre["total_s"] + sum(steps),
            "prefill_tok_per_s": pre["tok_per_s"], "decode_tok_per_s": new_tokens / sum(steps) if steps else 0.0}

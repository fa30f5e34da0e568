"""The seed's inference_trace: what happens on the hardware, step by step, as data.

``decode_curve`` (decode speed as the context grows), ``load_steps`` (a llama.cpp-style model
load: mmap, copies of offloaded layers, KV allocation, page-in) and ``request_timeline`` (prefill
then decode of one request). Thin wrappers, by the seed's names and return shapes, over
``inferlab.perf.trace`` (typed steps; ``inferlab trace`` and ``inferlab.api.trace`` show them).
"""

from __future__ import annotations

from .errors import InvalidValueError
from .hardware.device import Machine
from .perf import trace as _trace
from .perf.placement import Placement
from .perf.speed import BANDWIDTH_ONLY as LESSON, SpeedModel

NVME_GBPS = _trace.NVME_GBPS  # a PCIe 3/4 NVMe drive's sequential read, GB/s (the lesson's 3-7 GB/s range)


def decode_curve(placement: Placement, machine: Machine, contexts, batch: int = 1, model: SpeedModel = LESSON) -> list[dict]:
    """Decode speed at each context length: rows with context, tok_s, total_s, gpu_s, cpu_s, kv_read_bytes."""
    rows = []
    for c in _trace.check_contexts(contexts, placement.n_ctx):
        steps = _trace.decode_steps(placement, machine, c, batch, model)
        total = _trace.total_s(steps)
        cpu_s = _trace.total_s(s for s in steps if s.where == placement.cpu.name)
        rows.append({"context": c, "tok_s": batch / total if total else float("inf"), "total_s": total, "gpu_s": total - cpu_s, "cpu_s": cpu_s,
                     "kv_read_bytes": sum(s.bytes_moved for s in steps if s.name == "read KV cache"),
                     "weights_read_bytes": sum(s.bytes_moved for s in steps if s.name == "read weights")})
    return rows


def load_steps(placement: Placement, machine: Machine, disk_gbps: float = NVME_GBPS, page_cache: bool = False) -> list[dict]:
    """The steps of a llama.cpp load with their bytes and seconds: the header, mmap of the file,
    copying the offloaded layers to the GPU(s) (none on unified memory), allocating the KV cache
    and compute buffers, the lazy page-in of what stays in the mapping. Each row: step, bytes, s,
    detail, and where and bound (what limits it)."""
    return [{"step": s.name, "bytes": s.bytes_moved, "s": s.s, "detail": s.detail, "where": s.where, "bound": s.bound}
            for s in _trace.load_steps(placement, machine, disk_gbps=disk_gbps, page_cache=page_cache, speed=LESSON)]


def request_timeline(placement: Placement, machine: Machine, prompt_tokens: int, new_tokens: int, model: SpeedModel = LESSON) -> dict:
    """Prefill of the prompt, then decode of new_tokens one at a time: TTFT, per-token times, totals."""
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 0:
        raise InvalidValueError(f"new_tokens must be an integer >= 0, got {new_tokens!r}")
    ttft = _trace.total_s(_trace.prefill_steps(placement, machine, prompt_tokens, model))
    steps = [_trace.total_s(_trace.decode_steps(placement, machine, prompt_tokens + i, 1, model)) for i in range(new_tokens)]
    return {"ttft_s": ttft, "decode_s": steps, "total_s": ttft + sum(steps),
            "prefill_tok_per_s": prompt_tokens / ttft, "decode_tok_per_s": new_tokens / sum(steps) if steps else 0.0}

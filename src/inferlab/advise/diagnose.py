"""The lesson's symptom table ("Where Bottlenecks Happen"), and which error messages point at which row."""

from __future__ import annotations

import re

# row id -> (symptom, cause, fix), as the lesson words them
SYMPTOMS = {
    "partial-offload": ("Decode far below bandwidth / model size", "Some layers run from system RAM (partial offload)",
                        "More layers on the GPU: smaller quant, shorter -c, quantized KV cache, --n-cpu-moe for MoE models"),
    "kv-long-context": ("Fine at first, slower as the chat grows", "Each token also reads the whole KV cache; at long context it rivals the weights",
                        "Shorter context, q8_0 KV cache, a model with fewer KV heads"),
    "long-prefill": ("Long wait before the first token", "Prefill of a long prompt; on partial offload, prefill bounded by PCIe",
                     "Keep op offload on, raise -ub/-b if VRAM allows, enable prompt/prefix caching"),
    "allocation-failure": ("Load fails with an allocation error", "Asked for more VRAM than is free (-ngl too high, -c too long, "
                           "vLLM gpu_memory_utilization too high next to a desktop)",
                           "Let llama.cpp's --fit choose, lower -ngl/-c; in vLLM lower --gpu-memory-utilization or --max-model-len"),
    "sysmem-fallback": ("Everything slow on Windows, GPU memory 'full'", "The NVIDIA driver's system-memory fallback (driver 536.40+) "
                        "moved allocations into shared system memory instead of failing",
                        "Fit the model properly; the fallback can be disabled per application in the NVIDIA Control Panel (driver 546.01+)"),
    "disk-paging": ("Machine stutters, disk busy during generation", "Weights + KV exceed RAM; the OS pages the model from disk",
                    "Smaller model or quant; --load-mode mlock only helps if it fits"),
    "cpu-threads": ("CPU-only decode slower than expected", "Too many threads (hyperthreads, efficiency cores) contending for the same memory bus",
                    "Use physical performance cores (-t; the default already counts them)"),
    "capped-concurrency": ("Throughput flat as users are added", "Concurrency capped (-np in llama.cpp, max_num_seqs), or KV pool too small, causing preemptions",
                           "Raise the cap; give the KV pool more memory; check the vLLM concurrency log line"),
}

ERROR_PATTERNS = (
    ("allocation-failure", re.compile(r"out of memory|failed to allocate|cudaMalloc|alloc.*failed|OOM|unable to allocate|"
                                      r"not enough memory|No available memory for the cache blocks|insufficient memory|"
                                      r"less than desired GPU memory utilization|increase --mem-fraction-static", re.I)),
    ("capped-concurrency", re.compile(r"context size has been exceeded|preempt|max_num_seqs|all slots are busy|queue", re.I)),
    ("disk-paging", re.compile(r"page fault|swap|thrash|disk", re.I)),
    ("long-prefill", re.compile(r"timeout|time to first token|ttft", re.I)),
)


def rows_for_error(text: str) -> tuple[str, ...]:
    """Symptom rows an error message points at, most specific first."""
    return tuple(row for row, pat in ERROR_PATTERNS if pat.search(text or ""))

"""The KV-cache case study's experiment functions (seed 004, sections 3.4, 3.5 and 3.7), with
its names, arguments and return shapes, run by the runtime. They accept the case study's
SmallTransformer and a real LlamaModel alike (anything with the runtime's `step` interface).

Times are in milliseconds, memory in MB (10^6 bytes), as in the case study.
"""

from __future__ import annotations

import statistics

import torch

from .device import PeakMemory, TensorBytesPeak
from .generate import SamplingParams, generate


def _random_prompt(model, batch_size: int, n_tokens: int, seed: int | None = None):
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    return torch.randint(0, model.config.vocab_size, (batch_size, n_tokens), generator=g).to(model.device)


def _ids(prompt_ids, result):
    gen = torch.tensor(result.token_ids, dtype=torch.long, device=prompt_ids.device)
    return torch.cat([prompt_ids, gen], dim=1)


def generate_naive(model, prompt_ids, n_new_tokens: int = 32):
    """Greedy, no cache: the whole sequence goes through the model every step.
    Returns (ids (B, n_prefix + n_new_tokens), step_times_ms with one entry per step)."""
    result = generate(model, prompt_ids, n_new_tokens, mode="naive", sampling=SamplingParams())
    return _ids(prompt_ids, result), [t * 1e3 for t in result.step_times_s]


def generate_with_cache(model, prompt_ids, n_new_tokens: int = 32, cache="contiguous"):
    """Greedy with a KV cache. Returns (ids, decode step_times_ms (n_new_tokens - 1 entries),
    prefill_time_ms: the TTFT proxy, a float)."""
    result = generate(model, prompt_ids, n_new_tokens, mode="cached", cache=cache, sampling=SamplingParams())
    return _ids(prompt_ids, result), [t * 1e3 for t in result.step_times_s], float(result.ttft_s * 1e3)


def measure_vram_mb(model, batch_size: int, context_len: int, n_new_tokens: int = 10, use_cache: bool = True, cache="contiguous"):
    """Peak memory of one generation, split as the issue asks.

    Keys: peak_mb (measured: torch.cuda.max_memory_allocated on a GPU, peak RSS on a CPU),
    model_mb (exact weight bytes), cache_mb (exact bytes of the KV cache tensors),
    activations_mb (exact: the peak bytes of the tensors the generation creates beyond the cache,
    counted on a second pass by TensorBytesPeak), source.
    """
    prompt = _random_prompt(model, batch_size, context_len)
    mode = "cached" if use_cache else "naive"
    with PeakMemory(model.device) as mem:
        result = generate(model, prompt, n_new_tokens, mode=mode, cache=cache)
    with TensorBytesPeak() as tensors:  # its own pass: counting slows every op
        counted = generate(model, prompt, n_new_tokens, mode=mode, cache=cache)
    return {
        "peak_mb": mem.peak_bytes / 1e6,
        "model_mb": model.weight_bytes / 1e6,
        "cache_mb": result.cache_bytes / 1e6,
        "activations_mb": (tensors.peak_bytes - counted.cache_bytes) / 1e6,
        "source": mem.source,
    }


def profile_generation_methods(model, context_lengths, n_new_tokens: int = 20, n_warmup: int = 2, batch_size: int = 1, cache="contiguous", seed: int = 0):
    """The case study's sweep: per context length, naive TTFT and mean step time, cached
    prefill time and mean decode step time (ms)."""
    results = {
        "context_lengths": list(context_lengths),
        "naive_ttft_ms": [],
        "naive_mean_step_ms": [],
        "cached_prefill_ms": [],
        "cached_mean_step_ms": [],
    }
    warm = _random_prompt(model, batch_size, min(64, model.n_ctx), seed)
    with torch.inference_mode():
        for _ in range(n_warmup):
            model.step(warm)
    for i, ctx in enumerate(context_lengths):
        prompt = _random_prompt(model, batch_size, ctx, seed + i + 1)
        _, naive_times = generate_naive(model, prompt, n_new_tokens)
        _, cached_times, prefill_ms = generate_with_cache(model, prompt, n_new_tokens, cache=cache)
        results["naive_ttft_ms"].append(naive_times[0])
        results["naive_mean_step_ms"].append(statistics.fmean(naive_times))
        results["cached_prefill_ms"].append(prefill_ms)
        results["cached_mean_step_ms"].append(statistics.fmean(cached_times) if cached_times else 0.0)
    return results


def quantise_kv_cache_int8(cache):
    """The case study's per-tensor int8 (one absmax scale for the whole tensor): kept to compare
    with the runtime's per-token, per-head Int8KVCache."""
    k, v = cache

    def quant(t):
        scale = t.abs().max() / 127.0 + 1e-8
        return (t / scale).round().clamp(-128, 127).to(torch.int8), scale

    (k_q, k_s), (v_q, v_s) = quant(k), quant(v)
    return k_q, v_q, k_s, v_s


def dequantise_kv_cache_int8(k_q, v_q, k_s, v_s, target_dtype=torch.float32):
    return k_q.to(target_dtype) * k_s, v_q.to(target_dtype) * v_s


def apply_sliding_window(cache, window_size: int):
    """The case study's eviction: keep the last window_size positions of (B, H, T, D) tensors."""
    k, v = cache
    if k.shape[2] <= window_size:
        return cache
    return k[:, :, -window_size:, :], v[:, :, -window_size:, :]

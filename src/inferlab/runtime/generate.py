"""Autoregressive generation, naive (recompute the whole sequence every step) or cached
(prefill once, then one token per step against a KV cache), greedy or sampled.

Works with any model exposing `step(tokens, cache=None, *, all_logits=False)` (logits of the last
position, or of every position; without a cache the whole sequence is recomputed),
`new_cache(spec, batch, capacity)`, `n_ctx`, `device` and `config.vocab_size` (LlamaModel, whose
`step` is its `forward`, and SmallTransformer's adapter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import InvalidValueError, UnknownNameError, check_positive
from .kv_cache import CacheSpec, ContiguousKVCache

MODES = ("naive", "cached")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy (argmax). top_k 0 = off; top_p 1.0 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        check_positive("temperature", self.temperature, allow_zero=True)
        check_positive("top_k", self.top_k, allow_zero=True)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 1 << 64):  # torch.manual_seed's range
            raise InvalidValueError(f"seed must be an integer from 0 to 2^64 - 1, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationResult:
    prompt_ids: tuple[tuple[int, ...], ...]  # per sequence
    token_ids: tuple[tuple[int, ...], ...]  # generated, per sequence
    mode: str
    cache: str  # cache label, "none" for naive
    ttft_s: float  # time to the first generated token (prefill + first sampling)
    step_times_s: tuple[float, ...]  # naive: every step (the first is the TTFT); cached: decode steps only
    reused_prefix_tokens: int = 0  # prompt tokens whose KV came from a previous request
    cache_bytes: int = 0
    finish_reason: str = "length"  # "length" or "stop"

    @property
    def n_generated(self) -> int:
        return len(self.token_ids[0]) if self.token_ids else 0

    @property
    def decode_tok_per_s(self) -> float:
        """Tokens per second over the decode steps (all sequences of the batch)."""
        steps = self.step_times_s if self.mode == "cached" else self.step_times_s[1:]
        total = sum(steps)
        return len(steps) * len(self.token_ids) / total if total > 0 else float("nan")

    @property
    def prefill_tok_per_s(self) -> float:
        n = sum(len(p) for p in self.prompt_ids) - self.reused_prefix_tokens * len(self.prompt_ids)
        return n / self.ttft_s if self.ttft_s > 0 else float("nan")


class Sampler:
    """Greedy or temperature/top-k/top-p sampling with its own seeded generator."""

    def __init__(self, params: SamplingParams, device):
        import torch

        self.params = params
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(params.seed if params.seed is not None else int(torch.seed() % 2**63))

    def __call__(self, logits):
        """logits (batch, vocab) -> ids (batch,)"""
        import torch

        p = self.params
        if p.greedy:
            return logits.argmax(dim=-1)
        logits = logits.float() / p.temperature
        if p.top_k:
            kth = torch.topk(logits, min(p.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            probs = torch.softmax(sorted_logits, dim=-1)
            # drop a token when the tokens ranked above it already reach top_p (keeps at least one)
            drop = probs.cumsum(dim=-1) - probs >= p.top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)


class PrefixCache:
    """Keeps the KV caches of finished requests (batch 1, contiguous); a new request that shares
    a prefix with one of them copies that prefix's keys and values instead of recomputing them."""

    def __init__(self, max_entries: int = 4):
        check_positive("max_entries", max_entries)
        self.max_entries = max_entries
        self.entries: list[tuple[tuple[int, ...], ContiguousKVCache]] = []

    def longest_prefix(self, ids) -> tuple[int, ContiguousKVCache | None]:
        best, best_cache = 0, None
        for tokens, cache in self.entries:
            n = 0
            for a, b in zip(tokens, ids):
                if a != b:
                    break
                n += 1
            if n > best:
                best, best_cache = n, cache
        return best, best_cache

    def store(self, ids, cache: ContiguousKVCache) -> None:
        self.entries.append((tuple(ids)[: cache.seq_len], cache))
        del self.entries[: -self.max_entries]


def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


def _as_batch(prompt_ids, vocab_size):
    import torch

    if isinstance(prompt_ids, torch.Tensor):
        rows = prompt_ids.tolist() if prompt_ids.dim() == 2 else [prompt_ids.tolist()]
    elif prompt_ids and isinstance(prompt_ids[0], (list, tuple)):
        rows = [list(r) for r in prompt_ids]
    else:
        rows = [list(prompt_ids)]
    if not rows or any(len(r) == 0 for r in rows):
        raise InvalidValueError("the prompt is empty: give at least one token")
    if len({len(r) for r in rows}) != 1:
        raise InvalidValueError(f"batched prompts must have one length, got lengths {sorted({len(r) for r in rows})}")
    bad = [i for r in rows for i in r if not 0 <= i < vocab_size]
    if bad:
        raise InvalidValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    return rows


def generate(
    model,
    prompt_ids,
    max_new_tokens: int = 32,
    *,
    mode: str = "cached",
    cache: CacheSpec | str = "contiguous",
    sampling: SamplingParams = SamplingParams(),
    stop_ids=(),
    prefix_cache: PrefixCache | None = None,
    on_token=None,
) -> GenerationResult:
    """Generate up to max_new_tokens for each prompt (a list of ids, or equal-length lists).

    on_token(step, ids) is called after each step with the new token of every sequence.
    Stops early only for batch 1, when a token in stop_ids comes out (it is kept in the result).
    """
    import torch

    if mode not in MODES:
        raise UnknownNameError("generation mode", mode, MODES)
    check_positive("max_new_tokens", max_new_tokens)
    rows = _as_batch(prompt_ids, model.config.vocab_size)
    batch, n_prompt = len(rows), len(rows[0])
    total = n_prompt + max_new_tokens
    if total > model.n_ctx:
        raise InvalidValueError(
            f"prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) = {total} exceeds the model's "
            f"context of {model.n_ctx} tokens"
        )
    spec = CacheSpec.parse(cache) if isinstance(cache, str) else cache
    if prefix_cache is not None and (mode != "cached" or spec.kind != "contiguous" or batch != 1):
        raise InvalidValueError("prefix reuse needs mode='cached', a contiguous cache and batch 1")
    sampler = Sampler(sampling, model.device)
    stop = set(stop_ids)
    tokens = torch.tensor(rows, dtype=torch.long, device=model.device)
    generated: list[list[int]] = [[] for _ in range(batch)]
    step_times: list[float] = []
    reused, kv, finish = 0, None, "length"

    with torch.inference_mode():
        if mode == "naive":
            seq = tokens
            for step in range(max_new_tokens):
                _sync(model.device)
                t0 = time.perf_counter()
                logits = model.step(seq, None)  # the whole sequence, every step
                nxt = sampler(logits[:, -1])
                _sync(model.device)
                step_times.append(time.perf_counter() - t0)
                seq = torch.cat([seq, nxt[:, None]], dim=1)
                if _emit(generated, nxt, on_token, step, stop, batch):
                    finish = "stop"
                    break
            ttft = step_times[0]
        else:
            kv = model.new_cache(spec, batch=batch, capacity=total)
            _sync(model.device)
            t0 = time.perf_counter()
            feed = tokens
            if prefix_cache is not None:
                reused, source = prefix_cache.longest_prefix(rows[0])
                reused = min(reused, n_prompt - 1)  # feed at least one token to get logits
                if reused > 0:
                    kv.copy_prefix_from(source, reused)
                    feed = tokens[:, reused:]
            logits = model.step(feed, kv)  # prefill
            nxt = sampler(logits[:, -1])
            _sync(model.device)
            ttft = time.perf_counter() - t0
            done = _emit(generated, nxt, on_token, 0, stop, batch)
            for step in range(1, max_new_tokens):
                if done:
                    finish = "stop"
                    break
                t0 = time.perf_counter()
                logits = model.step(nxt[:, None], kv)  # decode: one token against the cache
                nxt = sampler(logits[:, -1])
                _sync(model.device)
                step_times.append(time.perf_counter() - t0)
                done = _emit(generated, nxt, on_token, step, stop, batch)
            else:
                finish = "stop" if done else "length"
            if prefix_cache is not None:
                prefix_cache.store(rows[0] + generated[0], kv)
    return GenerationResult(
        prompt_ids=tuple(tuple(r) for r in rows),
        token_ids=tuple(tuple(g) for g in generated),
        mode=mode,
        cache=spec.label if mode == "cached" else "none",
        ttft_s=ttft,
        step_times_s=tuple(step_times),
        reused_prefix_tokens=reused,
        cache_bytes=kv.nbytes if kv is not None else 0,
        finish_reason=finish,
    )


def _emit(generated, nxt, on_token, step, stop, batch) -> bool:
    ids = nxt.tolist()
    for g, i in zip(generated, ids):
        g.append(i)
    if on_token is not None:
        on_token(step, ids)
    return batch == 1 and ids[0] in stop

"""What a lossy KV cache costs in quality, measured on a real text against the fp32 cache:
per position, top-1 agreement of the next-token choice and the KL divergence KL(p_ref || p_cache)
of the next-token distributions; over the text, the perplexity change.

One forward pass per cache over the whole text gives every position's logits. That equals
feeding the text token by token: the int8 cache stores first and hands attention the
dequantized keys (a token never sees its own unquantized K/V), and the window cache applies the
same band mask a ring of W slots would (tests check both equivalences).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import InvalidValueError
from .kv_cache import CacheSpec

# Real English prose for the measurement: the KV-cache case study's own account of its problem
# (seed 004, "Context" and "The central insight", lightly normalized to ASCII punctuation).
CASE_STUDY_TEXT = (
    "Imagine you are a senior ML engineer at Lex Machina Legal Systems, a LegalTech startup whose flagship "
    "product, LexDraft, helps attorneys draft contracts in real time. The system is powered by a fine-tuned "
    "7-billion parameter transformer and must return a first token in under 300 milliseconds, even when the "
    "document already contains 8,000 tokens of prior context. Recently the system started cracking. "
    "First-token latency is spiking to 1.4 seconds on long documents. During peak hours the GPU cluster is "
    "crashing with out-of-memory errors. And here is the paradox that makes this mystery worth solving: GPU "
    "compute utilization sits at only 22-35% at the exact moments when things are worst. The GPU is idle, yet "
    "also overwhelmed. The CFO has blocked a quick hardware fix (the cluster already costs $38k/month). We need "
    "to understand the system before we can fix it. The paradox, low GPU utilisation during high latency and "
    "OOM crashes, is fully explained by the roofline model. Decoding with a KV cache is deeply "
    "memory-bandwidth-bound. The GPU's compute units are starved because the bottleneck is reading tens of "
    "gigabytes of cached keys and values from HBM on every single decode step. At 80 concurrent sessions with "
    "8,000 token contexts, the 7B model's KV cache alone requires more than 26 GB, on top of 14 GB of weights, "
    "completely overwhelming a 40 GB card. By combining INT8 KV cache quantisation, which halves cache memory "
    "with negligible quality loss, and sliding window eviction at 2,048 tokens, which bounds per-session memory "
    "regardless of document length, we bring the peak KV cache footprint to under 3 GB per node, comfortably "
    "within the budget remaining after weights."
)


@dataclass(frozen=True)
class QualityCost:
    cache: str
    n_tokens: int  # positions compared (text length - 1)
    top1_agreement: float  # share of positions whose argmax matches the fp32 cache's
    kl_mean_nats: float  # mean KL(p_fp32 || p_cache) over positions
    kl_max_nats: float
    perplexity_ref: float  # the fp32 cache's perplexity on the text
    perplexity: float
    cache_bytes: int
    ref_cache_bytes: int

    @property
    def perplexity_change(self) -> float:
        """Relative change: +0.01 = 1 % higher perplexity than with the fp32 cache."""
        return self.perplexity / self.perplexity_ref - 1.0


def _logits(model, ids, spec: CacheSpec):
    cache = model.new_cache(spec, batch=1, capacity=len(ids))
    with torch.inference_mode():
        logits = model.step(torch.tensor([ids], device=model.device), cache, all_logits=True)
    return logits[0, :-1].float(), cache.nbytes  # position i predicts token i + 1


def quality_cost(model, token_ids, specs, reference: CacheSpec | str = "contiguous") -> list[QualityCost]:
    """QualityCost of each cache spec over token_ids, against `reference` (the fp32 contiguous cache)."""
    ids = list(token_ids)
    if len(ids) < 2:
        raise InvalidValueError(f"quality needs a text of at least 2 tokens, got {len(ids)}")
    if len(ids) > model.n_ctx:
        raise InvalidValueError(f"the text has {len(ids)} tokens, more than the model's context of {model.n_ctx}")
    ref_spec = CacheSpec.parse(reference) if isinstance(reference, str) else reference
    ref_logits, ref_bytes = _logits(model, ids, ref_spec)
    ref_logp = torch.log_softmax(ref_logits, dim=-1)
    target = torch.tensor(ids[1:], device=ref_logits.device)
    ref_nll = -ref_logp.gather(-1, target[:, None]).mean().item()
    out = []
    for spec in specs:
        spec = CacheSpec.parse(spec) if isinstance(spec, str) else spec
        logits, nbytes = _logits(model, ids, spec)
        logp = torch.log_softmax(logits, dim=-1)
        kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)  # KL(p_ref || p) per position, nats
        nll = -logp.gather(-1, target[:, None]).mean().item()
        out.append(QualityCost(
            cache=spec.label,
            n_tokens=len(ids) - 1,
            top1_agreement=(logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item(),
            kl_mean_nats=kl.mean().item(),
            kl_max_nats=kl.max().item(),
            perplexity_ref=math.exp(ref_nll),
            perplexity=math.exp(nll),
            cache_bytes=nbytes,
            ref_cache_bytes=ref_bytes,
        ))
    return out

"""Speculative decoding: a draft model's memory and the expected speedup for an acceptance rate.

With a draft that proposes γ tokens, each accepted independently with probability α (Leviathan et
al., 2023), one verification pass yields E = (1 − α^(γ+1)) / (1 − α) tokens on average. A cycle costs
γ draft steps plus one target pass over γ + 1 tokens; the pass is priced by ``decode_step_time`` at
batch γ + 1 (weights read once, compute and K/V per token: an upper bound on the pass's K/V reads).
Speedup = E · t_target / (γ · t_draft + t_verify). Both models are placed on the same machine by
``perf.placement.place``; the draft's weights and cache come out of the target's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidValueError
from ..perf.placement import place
from ..perf.speed import decode_step_time

LLAMACPP_DRAFT_N_MAX = 3  # llama.cpp --spec-draft-n-max default (the lesson's table)


@dataclass(frozen=True)
class SpeculativeEstimate:
    draft: str
    acceptance_rate: float
    n_draft: int  # γ
    expected_tokens_per_pass: float
    target_step_s: float
    draft_step_s: float
    verify_s: float
    tok_per_s: float
    baseline_tok_per_s: float
    speedup: float
    draft_weights_bytes: float
    draft_kv_bytes: float
    fits: bool  # target + draft on the machine
    note: str


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per verification] = (1 − α^(γ+1)) / (1 − α); γ + 1 when α = 1."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speculative_estimate(setup, draft, context: int, *, acceptance_rate: float, n_draft: int = LLAMACPP_DRAFT_N_MAX,
                         draft_quant=None) -> SpeculativeEstimate:
    if not 0.0 <= acceptance_rate <= 1.0:
        raise InvalidValueError(f"acceptance rate must be in [0, 1], got {acceptance_rate!r}")
    if isinstance(n_draft, bool) or not isinstance(n_draft, int) or n_draft < 1:
        raise InvalidValueError(f"draft length must be an integer >= 1, got {n_draft!r}")
    from ..models.resolve import resolve_model

    dspec = resolve_model(draft)
    if dspec.vocab_size != setup.spec.vocab_size:
        raise InvalidValueError(f"draft {dspec.name} has a vocabulary of {dspec.vocab_size:,} tokens, the target "
                                f"{setup.spec.name} {setup.spec.vocab_size:,}: a draft must share the target's tokenizer")
    m, p = setup.machine, setup.placement
    scheme = draft_quant if draft_quant is not None else setup.scheme
    # the draft gets the GPU memory the target leaves (a machine with that much less memory)
    dp = place(dspec, m, scheme, p.n_ctx, p.kv_type, dspec.n_layers + 1 if m.gpus else None)
    t_target = decode_step_time(p, m, context, 1, setup.speed)["total_s"]
    t_draft = decode_step_time(dp, m, context, 1, setup.speed)["total_s"]
    t_verify = decode_step_time(p, m, context, n_draft + 1, setup.speed)["total_s"]
    e = expected_tokens(acceptance_rate, n_draft)
    cycle = n_draft * t_draft + t_verify
    tok = e / cycle
    dw, dkv = dp.weights_total, dp.kv_total
    fits = p.fits and all(g.free_bytes - (dgu.total_bytes) >= 1024 * 2**20 for g, dgu in zip(p.gpus, dp.gpus)) if m.gpus else p.fits
    note = "" if fits else "the draft does not fit beside the target: lower -c or -ngl of the target, or use a smaller draft"
    return SpeculativeEstimate(dspec.name, acceptance_rate, n_draft, e, t_target, t_draft, t_verify, tok, 1.0 / t_target,
                               tok * t_target, dw, dkv, fits, note)

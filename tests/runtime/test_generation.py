"""Generation with the real SmolLM2-135M-Instruct: cached == naive, paged == contiguous, prefix
reuse == a full prefill, int8/window errors measured, sampling controls."""

import math

import pytest
import torch

from inferlab.errors import InvalidValueError, UnknownNameError
from inferlab.runtime.generate import PrefixCache, Sampler, SamplingParams, generate
from inferlab.runtime.quality import CASE_STUDY_TEXT, quality_cost

PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def prompt_ids(smollm):
    _, tok = smollm
    return tok.encode(PROMPT)


def test_cached_equals_naive(smollm, prompt_ids):
    model, tok = smollm
    naive = generate(model, prompt_ids, 8, mode="naive")
    cached = generate(model, prompt_ids, 8, mode="cached")
    assert naive.token_ids == cached.token_ids
    assert len(naive.step_times_s) == 8 and len(cached.step_times_s) == 7
    assert tok.decode(cached.token_ids[0]).strip()  # real text comes out


def test_paged_logits_equal_contiguous(smollm, prompt_ids):
    model, _ = smollm
    ids = torch.tensor([prompt_ids])
    contiguous = model.new_cache("contiguous", capacity=64)
    paged = model.new_cache("paged:4", capacity=64)
    with torch.inference_mode():
        a = [model.step(ids, contiguous, all_logits=True)]
        b = [model.step(ids, paged, all_logits=True)]
        for t in (284, 1351, 30):
            a.append(model.step(torch.tensor([[t]]), contiguous))
            b.append(model.step(torch.tensor([[t]]), paged))
    # the blocks really are scattered through the pool, not one contiguous run
    table = paged.block_tables[0]
    assert len(table) == -(-(len(prompt_ids) + 3) // 4)
    assert any(b2 != b1 + 1 for b1, b2 in zip(table, table[1:]))
    torch.testing.assert_close(torch.cat(b, 1), torch.cat(a, 1), rtol=1e-5, atol=1e-4)


def test_batched_decode_equals_single(smollm, prompt_ids):
    model, tok = smollm
    other = tok.encode("Water boils at a temperature of")[: len(prompt_ids)]
    other += [tok.encode(" the")[0]] * (len(prompt_ids) - len(other))
    batched = generate(model, [prompt_ids, other], 3)
    assert batched.token_ids[0] == generate(model, prompt_ids, 3).token_ids[0]
    assert batched.token_ids[1] == generate(model, other, 3).token_ids[0]


def test_prefix_reuse_skips_prefill_and_matches(smollm, prompt_ids):
    model, tok = smollm
    store = PrefixCache()
    first = generate(model, prompt_ids, 4, prefix_cache=store)
    assert first.reused_prefix_tokens == 0
    follow_up = prompt_ids + list(first.token_ids[0]) + tok.encode(" and")
    again = generate(model, follow_up, 4, prefix_cache=store)
    # everything but the last prompt token came from the stored request
    assert again.reused_prefix_tokens == len(prompt_ids) + 3
    assert again.token_ids == generate(model, follow_up, 4).token_ids


@pytest.mark.slow
def test_int8_and_window_report_measured_error(smollm):
    model, tok = smollm
    ids = tok.encode(CASE_STUDY_TEXT)[:96]
    int8, window, paged = quality_cost(model, ids, ["int8", "window:24", "paged"])
    assert paged.kl_max_nats < 1e-6 and paged.top1_agreement == 1.0  # lossless control
    assert 0 < int8.kl_mean_nats < 0.05 and int8.top1_agreement > 0.9
    assert window.kl_mean_nats > int8.kl_mean_nats  # forgetting all but 32 tokens costs more
    assert window.perplexity > window.perplexity_ref
    assert math.isfinite(window.perplexity_change)
    assert int8.cache_bytes < 0.3 * int8.ref_cache_bytes  # int8 + one fp32 scale per 64 values


def test_window_one_pass_equals_token_by_token(smollm, prompt_ids):
    """quality_cost scores a whole text in one pass; that must equal decoding it token by token."""
    model, _ = smollm
    ids = prompt_ids * 3
    one = model.new_cache("window:5", capacity=len(ids))
    step = model.new_cache("window:5", capacity=len(ids))
    with torch.inference_mode():
        full = model.step(torch.tensor([ids]), one, all_logits=True)[0]
        each = torch.cat([model.step(torch.tensor([[t]]), step)[0] for t in ids])
    torch.testing.assert_close(each, full, rtol=1e-4, atol=2e-3)


# ── sampling ──────────────────────────────────────────────────────────────────────────────────
def test_seeded_sampling_is_reproducible_and_differs_from_greedy(smollm, prompt_ids):
    model, _ = smollm
    hot = SamplingParams(temperature=1.5, seed=7)
    a, b = generate(model, prompt_ids, 4, sampling=hot), generate(model, prompt_ids, 4, sampling=hot)
    assert a.token_ids == b.token_ids
    c = generate(model, prompt_ids, 4, sampling=SamplingParams(temperature=1.5, seed=8))
    greedy = generate(model, prompt_ids, 4)
    assert a.token_ids != greedy.token_ids or c.token_ids != greedy.token_ids
    top1 = generate(model, prompt_ids, 4, sampling=SamplingParams(temperature=1.0, top_k=1, seed=3))
    assert top1.token_ids == greedy.token_ids


def test_sampler_frequencies_follow_softmax_with_top_k_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    n = 20000
    probs = torch.softmax(logits[0], 0)
    s = Sampler(SamplingParams(temperature=1.0, seed=0), "cpu")
    counts = torch.bincount(torch.stack([s(logits) for _ in range(n)]).flatten(), minlength=5) / n
    torch.testing.assert_close(counts, probs, atol=0.015, rtol=0)
    k2 = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=0), "cpu")
    seen = {int(k2(logits)) for _ in range(500)}
    assert seen == {0, 1}
    # probabilities 0.563, 0.207, 0.126, 0.076, 0.028: with top_p 0.8 tokens 0-1 reach 0.770 < 0.8, so
    # token 2 is kept; 0-2 reach 0.896, so tokens 3 and 4 are dropped
    p = Sampler(SamplingParams(temperature=1.0, top_p=0.8, seed=0), "cpu")
    assert {int(p(logits)) for _ in range(2000)} == {0, 1, 2}


# ── bad input ─────────────────────────────────────────────────────────────────────────────────
def test_bad_generation_input(smollm, prompt_ids):
    model, _ = smollm
    with pytest.raises(InvalidValueError, match="empty"):
        generate(model, [], 4)
    with pytest.raises(InvalidValueError, match="exceeds the model's context of 1024"):
        generate(model, prompt_ids, 1024)
    with pytest.raises(InvalidValueError, match="outside the vocabulary"):
        generate(model, [49152], 1)
    with pytest.raises(UnknownNameError, match="did you mean 'paged'"):
        generate(model, prompt_ids, 1, cache="pagd")
    with pytest.raises(InvalidValueError, match="window:W"):
        generate(model, prompt_ids, 1, cache="window")
    with pytest.raises(InvalidValueError, match="top_p"):
        SamplingParams(temperature=1.0, top_p=0.0)

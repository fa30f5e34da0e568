"""inferlab's runtime against the real llama.cpp (llama-cpp-python) on the same GGUF: tokenizer
ids and a greedy continuation."""

import pytest

pytestmark = pytest.mark.engine

TOKENIZER_STRINGS = [
    "Hello world",
    "The three primary colors are",
    "  two leading spaces and trailing  ",
    "tabs\tand\nnewlines\n\n\nand   runs    of spaces",
    "digits: 12345, 3.14159, 1,000,000 and 2024-11-29",
    "naïve café, Zürich, señor, déjà vu",
    "日本語のテキストと中文",
    "emoji 🤖🚀 and symbols ∑∫√ ≤ ≥ →",
    "it's, I'm, they're, we'll, you'd, can't",
    "def f(x):\n    return x**2  # comment",
    "<|im_start|> not special without parse_special",
]


@pytest.mark.parametrize("text", TOKENIZER_STRINGS)
def test_tokenizer_ids_equal_llama_cpp(smollm, llama_cpp_model, text):
    _, tok = smollm
    expected = llama_cpp_model.tokenize(text.encode(), add_bos=True, special=False)
    assert tok.encode(text, special=False) == expected


def test_chat_template_tokens_equal_llama_cpp(smollm, llama_cpp_model):
    _, tok = smollm
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2? Answer with café ☕."}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    expected = llama_cpp_model.tokenize(text.encode(), add_bos=True, special=True)
    ids = tok.encode(text, special=True)
    assert ids == expected
    assert ids.count(tok.with_special.token_to_id("<|im_start|>")) == 3


def test_decode_round_trips(smollm):
    _, tok = smollm
    for text in TOKENIZER_STRINGS:
        assert tok.decode(tok.encode(text, special=False)) == text


@pytest.mark.slow
def test_greedy_continuation_equals_llama_cpp(smollm, llama_cpp_model):
    """32 greedy tokens from the same prompt: llama.cpp (Q4_1 weights, its own kernels) and
    inferlab (weights dequantized to fp32, torch) pick the same token at every step."""
    from inferlab.runtime.generate import generate

    model, tok = smollm
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
    ids = tok.encode(prompt)
    ours = list(generate(model, ids, 32).token_ids[0])
    llama_cpp_model.reset()
    theirs = []
    for t in llama_cpp_model.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        theirs.append(t)
        if len(theirs) == 32:
            break
    assert ours == theirs, f"first difference at token {next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)}:\n" \
                           f"inferlab : {tok.decode(ours)!r}\nllama.cpp: {tok.decode(theirs)!r}"

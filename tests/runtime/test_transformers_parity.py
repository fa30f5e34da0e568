"""inferlab's runtime against Hugging Face transformers loading the same GGUF (transformers
dequantizes it to fp32, as the runtime does): the same weights through an independent llama
implementation, so logits must agree to float rounding, not just to the greedy token. Tiny
random GGUFs cover the architectures both read (llama, qwen2 with its QKV bias, quantized and
untied); the real SmolLM2 file covers the tokenizer, the chat template and greedy generation."""

import os

import pytest
import torch
from _texts import GREEDY_PROMPT, TOKENIZER_STRINGS

from .conftest import write_tiny_gguf

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it to load a GGUF

# fp32 logits of the same weights differ only by summation order: measured max 4e-6 (tiny models)
# and 7e-5 on SmolLM2 (logits up to 41), 2026-12-01
TINY_TOL, SMOLLM_TOL = 1e-4, 1e-3


def _hf_model(path):
    folder, name = os.path.split(str(path))
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch, kw", [("llama", {}), ("qwen2", {"bias": True}),
                                      ("llama", {"qtype": "Q4_1", "d_model": 64, "ffn": 128, "tied": False})],
                         ids=["llama", "qwen2-bias", "llama-q4_1-untied"])
def test_logits_equal_transformers_on_tiny_models(tmp_path, arch, kw):
    from inferlab.runtime.llama import LlamaModel

    path = tmp_path / f"tiny-{arch}.gguf"
    write_tiny_gguf(path, arch=arch, **kw)
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4, 60, 33]])
    with torch.inference_mode():
        ours = LlamaModel.from_gguf(path).step(ids, None, all_logits=True)
        theirs = _hf_model(path)(ids).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < TINY_TOL


@pytest.fixture(scope="module")
def hf_smollm(smollm_file):
    folder, name = os.path.split(smollm_file)
    return _hf_model(smollm_file), transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.mark.slow
def test_smollm_tokenizer_ids_equal_transformers(smollm, hf_smollm):
    _, tok = smollm
    _, hf_tok = hf_smollm
    for text in TOKENIZER_STRINGS:
        # special=False / split_special_tokens: "<|im_start|>" written in a text is plain text
        assert tok.encode(text, special=False) == hf_tok(text, split_special_tokens=True)["input_ids"], text
    chat = tok.apply_chat_template([{"role": "user", "content": GREEDY_PROMPT}])
    assert tok.encode(chat) == hf_tok(chat)["input_ids"]


@pytest.mark.slow
def test_smollm_logits_and_greedy_tokens_equal_transformers(smollm, hf_smollm):
    from inferlab.runtime.generate import generate

    model, tok = smollm
    hf_model, _ = hf_smollm
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": GREEDY_PROMPT}]))
    with torch.inference_mode():
        ours = model.step(torch.tensor([ids]), None, all_logits=True)[0]
        theirs = hf_model(torch.tensor([ids])).logits[0]
        hf_tokens = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
    assert (ours - theirs).abs().max().item() < SMOLLM_TOL
    assert list(generate(model, ids, 32).token_ids[0]) == hf_tokens

"""The chat template a GGUF carries (tokenizer.chat_template) as the runtime tokenizer applies it, and
the metadata arrays it is read from, on tiny vocabularies written here. Expected strings are worked out
from the template text and llama.cpp's special-token rules (llama_vocab::load: a SentencePiece
vocabulary's BOS defaults to id 1 and EOS to id 2; an id outside the vocabulary is dropped), the way
Hugging Face renders a template: bos_token and eos_token are the tokens' text, add_generation_prompt
defaults to true."""

from __future__ import annotations

import pytest

from inferlab.errors import FileFormatError, NotSupportedError
from inferlab.runtime.gguf_weights import open_gguf
from inferlab.runtime.tokenizer import tokenizer_from_gguf

gguf = pytest.importorskip("gguf")
pytest.importorskip("jinja2")

SPM_TOKENS = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a"]
SPM_TYPES = [2, 3, 3, 1, 1, 1, 1]
SPM_SCORES = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5]
# BOS, every message as <role>content, the assistant's opening on request, EOS
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def _write(path, *, tokens=SPM_TOKENS, model="llama", extra=None, arrays=None, template=TEMPLATE):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if model == "gpt2":
        w.add_tokenizer_pre("default")
    if tokens is not None:
        w.add_token_list(tokens)
    if model == "llama":
        w.add_token_types(SPM_TYPES)
        w.add_token_scores(SPM_SCORES)
    if template is not None:
        w.add_string("tokenizer.chat_template", template)
    for key, (kind, value) in (extra or {}).items():
        getattr(w, f"add_{kind}")(key, value)
    for key, value in (arrays or {}).items():
        w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokenizer_from_gguf(open_gguf(path))


def test_the_template_sees_the_vocabularys_bos_and_eos_text(tmp_path):
    tok = _write(tmp_path / "t.gguf")
    # SentencePiece defaults: BOS id 1 = "<s>", EOS id 2 = "</s>"
    assert tok.apply_chat_template(CHAT) == "<s><system>be brief<user>hi<assistant></s>"
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False) == "<s><system>be brief<user>hi</s>"


def test_the_files_own_special_ids_name_the_tokens(tmp_path):
    # BOS id 4 = "a", EOS id 6 = "▁a" (the file's ids, not the defaults)
    tok = _write(tmp_path / "t.gguf", extra={"tokenizer.ggml.bos_token_id": ("uint32", 4), "tokenizer.ggml.eos_token_id": ("uint32", 6)})
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=False) == "a<user>x\u2581a"


def test_a_dropped_special_id_renders_as_empty_text(tmp_path):
    # 7 tokens: id 7 is outside, so llama.cpp drops BOS; the template gets "" for it; EOS stays "</s>"
    tok = _write(tmp_path / "t.gguf", extra={"tokenizer.ggml.bos_token_id": ("uint32", 7)})
    assert tok.bos_id is None
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<user>x<assistant></s>"


@pytest.mark.parametrize("template", [None, ""])
def test_no_template_or_an_empty_one_is_refused(tmp_path, template):
    tok = _write(tmp_path / "t.gguf", template=template)
    with pytest.raises(NotSupportedError, match="no tokenizer.chat_template"):
        tok.apply_chat_template(CHAT)


def test_a_template_that_is_no_string_counts_as_none(tmp_path):
    tok = _write(tmp_path / "t.gguf", template=None, arrays={"tokenizer.chat_template": ["{{ bos_token }}"]})
    assert tok.chat_template is None
    with pytest.raises(NotSupportedError, match="no tokenizer.chat_template"):
        tok.apply_chat_template(CHAT)


def test_the_template_can_refuse_a_conversation(tmp_path):
    # templates call raise_exception (Hugging Face's helper) on roles they do not know
    refusing = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}{% endfor %}"
    tok = _write(tmp_path / "t.gguf", template=refusing)
    with pytest.raises(FileFormatError, match="chat template error: no system role"):
        tok.apply_chat_template(CHAT)
    assert tok.apply_chat_template(CHAT[1:]) == ""  # without the system message it renders (to nothing)


def test_a_token_list_of_numbers_is_refused(tmp_path):
    # an array, but not of strings: the same error as a string where an array belongs
    with pytest.raises(FileFormatError, match="'tokenizer.ggml.tokens' must be an array of strings"):
        _write(tmp_path / "t.gguf", tokens=None, model="gpt2", arrays={"tokenizer.ggml.tokens": [1, 2, 3]}, template=None)


def test_merges_of_numbers_are_refused(tmp_path):
    with pytest.raises(FileFormatError, match="'tokenizer.ggml.merges' must be an array of strings"):
        _write(tmp_path / "t.gguf", tokens=["a", "b", "ab"], model="gpt2", arrays={"tokenizer.ggml.merges": [7, 8]}, template=None)


def test_a_bos_id_of_zero_is_inside_the_vocabulary(tmp_path):
    # ids 0 … n_tokens - 1 are tokens: BOS = 0 ("<unk>" here) is kept, and the template sees its text;
    # the same for EOS = 0
    tok = _write(tmp_path / "t.gguf", extra={"tokenizer.ggml.bos_token_id": ("uint32", 0)})
    assert tok.bos_id == 0
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=False) == "<unk><user>x</s>"
    tok = _write(tmp_path / "u.gguf", extra={"tokenizer.ggml.eos_token_id": ("uint32", 0)})
    assert tok.eos_id == 0
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=False) == "<s><user>x<unk>"


def test_scores_that_are_booleans_are_refused(tmp_path):
    # a SentencePiece vocabulary's scores are numbers; a bool array (True == 1 in Python) is not
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(SPM_TOKENS)
    w.add_token_types(SPM_TYPES)
    w.add_array("tokenizer.ggml.scores", [True] * len(SPM_TOKENS))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FileFormatError, match="tokenizer.ggml.scores must be numbers"):
        tokenizer_from_gguf(open_gguf(tmp_path / "t.gguf"))

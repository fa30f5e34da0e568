"""The runtime tokenizer's edge rules on tiny vocabularies written here, each expected result worked
out from llama.cpp's rules (llama_vocab::load): special ids outside the vocabulary dropped, a boolean id
refused, the default token type, and prompt ids at the vocabulary's ends."""

from __future__ import annotations

import pytest

from inferlab.errors import FileFormatError, InvalidValueError
from inferlab.runtime.gguf_weights import open_gguf
from inferlab.runtime.tokenizer import check_prompt_ids, tokenizer_from_gguf

gguf = pytest.importorskip("gguf")


def _write(path, model: str, tokens, *, types=None, scores=None, merges=None, extra=None):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if model == "gpt2":
        w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    if types is not None:
        w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for key, (kind, value) in (extra or {}).items():
        getattr(w, f"add_{kind}")(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# SentencePiece: <unk> <s> </s> ▁ a b ▁a (llama.cpp itself needs byte tokens to load one; these tests read ids only)
SPM_TOKENS = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a"]
SPM_TYPES = [2, 3, 3, 1, 1, 1, 1]
SPM_SCORES = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5]


def test_special_ids_outside_the_vocabulary_are_dropped(tmp_path):
    # llama.cpp drops a BOS/EOS id >= n_tokens; 7 tokens here: 7 is outside, 6 inside
    tok = tokenizer_from_gguf(open_gguf(_write(tmp_path / "t.gguf", "llama", SPM_TOKENS, types=SPM_TYPES, scores=SPM_SCORES,
                                               extra={"tokenizer.ggml.bos_token_id": ("uint32", 7),
                                                      "tokenizer.ggml.eos_token_id": ("uint32", 6)})))
    assert tok.bos_id is None and tok.eos_id == 6
    tok = tokenizer_from_gguf(open_gguf(_write(tmp_path / "u.gguf", "llama", SPM_TOKENS, types=SPM_TYPES, scores=SPM_SCORES,
                                               extra={"tokenizer.ggml.eos_token_id": ("uint32", 70)})))
    assert tok.eos_id is None and tok.bos_id == 1  # SPM's default <s> = 1 stays


def test_a_boolean_special_id_is_refused(tmp_path):
    path = _write(tmp_path / "t.gguf", "llama", SPM_TOKENS, types=SPM_TYPES, scores=SPM_SCORES,
                  extra={"tokenizer.ggml.eos_token_id": ("bool", True)})
    with pytest.raises(FileFormatError, match="eos_token_id must be an integer"):
        tokenizer_from_gguf(open_gguf(path))


def test_missing_token_types_mean_normal_tokens(tmp_path):
    # no tokenizer.ggml.token_type: every token is normal (type 1), so "ab" is no special token and,
    # with no merges, BPE leaves "a" "b" apart
    path = _write(tmp_path / "t.gguf", "gpt2", ["a", "b", "ab"], merges=[])
    tok = tokenizer_from_gguf(open_gguf(path))
    assert tok.encode("ab", special=True, add_bos=False) == [0, 1]
    assert tok.encode("ab", special=False, add_bos=False) == [0, 1]


def test_prompt_ids_at_the_ends_of_the_vocabulary():
    check_prompt_ids([0, 9], 10)  # 0 and vocab_size - 1 are tokens
    for bad in ([-1], [10], [3, 10]):
        with pytest.raises(InvalidValueError, match="outside the vocabulary"):
            check_prompt_ids(bad, 10)
    with pytest.raises(InvalidValueError, match="empty"):
        check_prompt_ids([], 10)


def test_token_list_must_be_an_array_of_strings(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_string("tokenizer.ggml.tokens", "abc")  # a string, not an array
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FileFormatError, match="must be an array of strings"):
        tokenizer_from_gguf(open_gguf(tmp_path / "t.gguf"))


def test_chat_template_is_applied_when_the_file_has_one(tmp_path):
    from inferlab.errors import NotSupportedError

    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    path = _write(tmp_path / "t.gguf", "llama", SPM_TOKENS, types=SPM_TYPES, scores=SPM_SCORES,
                  extra={"tokenizer.chat_template": ("string", template)})
    tok = tokenizer_from_gguf(open_gguf(path))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False) == "<user>hi"
    plain = tokenizer_from_gguf(open_gguf(_write(tmp_path / "u.gguf", "llama", SPM_TOKENS, types=SPM_TYPES, scores=SPM_SCORES)))
    with pytest.raises(NotSupportedError, match="no tokenizer.chat_template"):
        plain.apply_chat_template([{"role": "user", "content": "hi"}])

"""The runtime's tokenizers against llama.cpp's own tokenizer tests: the vocab-only GGUFs in
llama.cpp's models/ (ggml-vocab-<name>.gguf) with their test strings (.gguf.inp, separated by a line
"__ggml_vocab_test__") and the original tokenizers' ids (.gguf.out, one line per string), as
llama.cpp's tests/test-tokenizer-0.cpp reads them: no BOS, control tokens not parsed.

The files are vendored in tests/data/llama_cpp_vocab/ (the GGUFs xz-compressed; taken from the
llama-cpp-python 0.3.36 sdist, vendor/llama.cpp/models/, MIT: see tests/data/README.md), so these
tests run offline and never skip; a session fixture unpacks the GGUFs into a temporary folder."""

from __future__ import annotations

import hashlib
import lzma
import shutil
from pathlib import Path

import pytest

from inferlab.runtime.gguf_weights import open_gguf
from inferlab.runtime.tokenizer import tokenizer_from_gguf

SPM_VOCABS = ("llama-spm", "phi-3")  # tokenizer.ggml.model "llama"
BPE_VOCABS = ("gpt-2", "llama-bpe", "qwen2", "starcoder", "refact", "falcon")  # "gpt2", a supported pre
VOCABS = SPM_VOCABS + BPE_VOCABS
SEPARATOR = "\n__ggml_vocab_test__\n"
VENDORED = Path(__file__).resolve().parents[1] / "data" / "llama_cpp_vocab"
# sha256 of each unpacked GGUF as llama.cpp ships it (tests/data/README.md)
SHA256 = {
    "llama-spm": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "phi-3": "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326",
    "gpt-2": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "llama-bpe": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "qwen2": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "starcoder": "fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d",
    "refact": "ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678",
    "falcon": "9f0bf8b0733680398b72e652e90f260f43782f326e75545fc0e49611a5ba35ad",
}


@pytest.fixture(scope="session")
def vocab_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llama_cpp_vocab")
    for name in VOCABS:
        base = f"ggml-vocab-{name}.gguf"
        data = lzma.decompress((VENDORED / f"{base}.xz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == SHA256[name], f"{base}: the vendored copy changed"
        (out / base).write_bytes(data)
        for ext in (".inp", ".out"):
            shutil.copyfile(VENDORED / (base + ext), out / (base + ext))
    return out


def read_tests(vocab_dir: Path, name: str) -> list[tuple[str, list[int]]]:
    base = vocab_dir / f"ggml-vocab-{name}.gguf"
    texts = Path(f"{base}.inp").read_text(encoding="utf-8").split(SEPARATOR)
    lines = Path(f"{base}.out").read_text(encoding="utf-8").split("\n")
    assert len(lines) >= len(texts), f"{name}: {len(texts)} strings but {len(lines)} lines of ids"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


_TOKENIZERS: dict[str, object] = {}


def our_tokenizer(vocab_dir: Path, name: str):
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = tokenizer_from_gguf(open_gguf(vocab_dir / f"ggml-vocab-{name}.gguf"))
    return _TOKENIZERS[name]


@pytest.mark.parametrize("name", VOCABS)
def test_ids_equal_the_original_tokenizers(vocab_dir, name):
    tests = read_tests(vocab_dir, name)
    tok = our_tokenizer(vocab_dir, name)
    wrong = [(text, ids, tok.encode(text, special=False, add_bos=False)) for text, ids in tests]
    wrong = [w for w in wrong if w[1] != w[2]]
    assert len(tests) >= 40
    assert not wrong, f"{len(wrong)} of {len(tests)} strings differ, first: {wrong[0][0]!r} expected {wrong[0][1]} got {wrong[0][2]}"


@pytest.mark.parametrize("name", VOCABS)
def test_decoding_the_original_ids_gives_the_text_back(vocab_dir, name):
    tok = our_tokenizer(vocab_dir, name)
    wrong = [text for text, ids in read_tests(vocab_dir, name) if tok.decode(ids) != text]
    assert not wrong, f"{len(wrong)} strings do not round-trip, first: {wrong[0]!r}"


@pytest.fixture(scope="module")
def llama_cpp_spm(vocab_dir):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(vocab_dir / "ggml-vocab-llama-spm.gguf"), vocab_only=True, verbose=False)


def test_spm_ids_equal_llama_cpp(vocab_dir, llama_cpp_spm):
    tok = our_tokenizer(vocab_dir, "llama-spm")
    texts = [t for t, _ in read_tests(vocab_dir, "llama-spm")]
    texts += ["<s>hi</s> there", "Hello <s> world", " <s>", "a\u2581b", "\u00e9t\u00e9 \U0001f999\U0001f999", "x" * 300]
    for text in texts:
        for special in (False, True):
            for add_bos in (False, True):
                theirs = llama_cpp_spm.tokenize(text.encode(), add_bos=add_bos, special=special)
                assert tok.encode(text, special=special, add_bos=add_bos) == theirs, (text, special, add_bos)


def test_spm_metadata(vocab_dir):
    tok = our_tokenizer(vocab_dir, "llama-spm")
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.vocab_size) == (1, 2, True, 32000)
    assert tok.encode("Hello") == [1, 15043]
    assert tok.decode([1, 15043, 2], skip_special=True) == "Hello"


# ── a tiny SentencePiece vocabulary written here (no download) ───────────────────────────────
def write_spm_gguf(path, *, add_space_prefix=None, scores=None):
    import gguf

    pieces = ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "<|user|>"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * (len(pieces) - 1) + [4]
    if scores is None:
        scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, 0.0]  # "▁ab" (-6) least likely
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_tiny_spm_vocabulary(tmp_path):
    tok = tokenizer_from_gguf(open_gguf(write_spm_gguf(tmp_path / "t.gguf")))
    sp, a, b, sa, ab, sab, user = range(259, 266)
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, True)  # llama.cpp's SPM defaults
    # "▁ab": "▁a" (score -4) merges before "ab" (-5), then "▁a" + "b" -> "▁ab"
    assert tok.encode("ab", add_bos=False) == [sab]
    assert tok.encode("ab b", add_bos=False) == [sab, sp, b]
    assert tok.encode("c", add_bos=False) == [sp, 3 + ord("c")]  # byte fallback: <0x63>
    assert tok.encode("\u00e9", add_bos=False) == [sp, 3 + 0xC3, 3 + 0xA9]
    assert tok.encode("bab", add_bos=False) == [sp, b, ab]
    assert tok.encode("a<|user|>b", add_bos=True) == [1, sa, user, sp, b]  # user-defined split out, "▁" after it
    assert tok.encode("<s>a", special=True, add_bos=False) == [1, sa]
    assert tok.encode("<s>a", special=False, add_bos=False) != [1, sa]
    for text in ("ab b", "c\u00e9 ab", "  a"):
        assert tok.decode(tok.encode(text)[1:]) == text


def test_a_tiny_spm_vocabulary_as_llama_cpp_reads_it(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_spm_gguf(tmp_path / "t.gguf")
    tok = tokenizer_from_gguf(open_gguf(path))
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in ("ab", "ab b", "bab", "c\u00e9 ab", "  a", "a<|user|>b", "<s>ab</s>b", "babab abba"):
        for special in (False, True):
            assert tok.encode(text, special=special) == llm.tokenize(text.encode(), add_bos=True, special=special), text


def test_spm_without_a_space_prefix(tmp_path):
    tok = tokenizer_from_gguf(open_gguf(write_spm_gguf(tmp_path / "t.gguf", add_space_prefix=False)))
    assert tok.encode("ab", add_bos=False) == [263]  # "ab", no "▁" in front
    assert tok.decode([263, 259, 261]) == "ab b"


def test_spm_scores_must_match_the_tokens(tmp_path):
    from inferlab.errors import FileFormatError

    path = write_spm_gguf(tmp_path / "t.gguf", scores=[0.0] * 10)
    with pytest.raises(FileFormatError, match=r"tokenizer\.ggml\.scores has 10 entries for 266 tokens"):
        tokenizer_from_gguf(open_gguf(path))


@pytest.mark.parametrize("name", VOCABS)
def test_bos_by_default_as_llama_cpp_adds_it(vocab_dir, name):
    """Whether a plain encode adds BOS: the file's add_bos_token, else llama.cpp's default for the
    vocabulary (SentencePiece and the llama3-style BPE pre-tokenizers add it; other BPE do not)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(vocab_dir / f"ggml-vocab-{name}.gguf"), vocab_only=True, verbose=False)
    tok = our_tokenizer(vocab_dir, name)
    for text in ("Hello world", " two  spaces", "3.14159"):
        assert tok.encode(text, special=False) == llm.tokenize(text.encode(), add_bos=True, special=False), (name, text)

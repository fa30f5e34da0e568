"""The runtime's tokenizers against llama.cpp's own tokenizer tests: the vocab-only GGUFs in
llama.cpp's models/ (ggml-vocab-<name>.gguf) with their test strings (.gguf.inp, separated by a line
"__ggml_vocab_test__") and the original tokenizers' ids (.gguf.out, one line per string), as
llama.cpp's tests/test-tokenizer-0.cpp reads them: no BOS, control tokens not parsed.

The files ship in the llama-cpp-python sdist (vendor/llama.cpp/models/). A session fixture extracts
the ones needed into ~/.cache/inferlab/vocab/<llama-cpp-python version>/, taking the sdist from
$INFERLAB_LLAMA_CPP_SDIST or `pip download` (served from pip's cache after llama-cpp-python's source
build); the tests skip, saying why, when it cannot be had."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

import pytest

from inferlab.runtime.gguf_weights import open_gguf
from inferlab.runtime.tokenizer import tokenizer_from_gguf

SPM_VOCABS = ("llama-spm", "phi-3")  # tokenizer.ggml.model "llama"
BPE_VOCABS = ("gpt-2", "llama-bpe", "qwen2", "starcoder", "refact", "falcon")  # "gpt2", a supported pre
VOCABS = SPM_VOCABS + BPE_VOCABS
SEPARATOR = "\n__ggml_vocab_test__\n"


def _wanted(name: str) -> list[str]:
    return [f"ggml-vocab-{name}.gguf", f"ggml-vocab-{name}.gguf.inp", f"ggml-vocab-{name}.gguf.out"]


def _find_sdist(version: str, work: Path) -> Path:
    given = os.environ.get("INFERLAB_LLAMA_CPP_SDIST")
    if given:
        if not os.path.isfile(given):
            pytest.skip(f"INFERLAB_LLAMA_CPP_SDIST={given} is not a file")
        return Path(given)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
           f"llama-cpp-python=={version}", "-d", str(work)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip download of the llama-cpp-python {version} sdist took over 180 s")
    found = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if run.returncode != 0 or not found:
        tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no sdist written"]
        pytest.skip(f"cannot get the llama-cpp-python {version} sdist (pip download: {tail[0]})")
    return found[0]


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    try:
        version = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        pytest.skip("llama-cpp-python is not installed: its sdist carries llama.cpp's vocab test files")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferlab" / "vocab" / version
    names = [f for v in VOCABS for f in _wanted(v)]
    if all((cache / n).is_file() for n in names):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = _find_sdist(version, Path(tmp))
        with tarfile.open(sdist) as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and base in names and "/vendor/llama.cpp/models/" in member.name:
                    data = tar.extractfile(member).read()
                    part = cache / (base + ".part")
                    part.write_bytes(data)
                    part.replace(cache / base)
    missing = [n for n in names if not (cache / n).is_file()]
    if missing:
        pytest.skip(f"the llama-cpp-python {version} sdist lacks {', '.join(missing)}")
    return cache


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

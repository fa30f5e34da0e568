"""open_gguf reads a GGUF with inferlab's own header parser and one memory map; the gguf package's
GGUFReader (an independent parser, what the runtime used before) is the reference: every metadata
value, every tensor's type, shape, raw view and dequantized values must be equal. Then bad input:
each problem is a typed error that names it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from inferlab.errors import FileFormatError, InferlabError, NotSupportedError
from inferlab.models.gguf_reader import GGUFArray, read_gguf_header
from inferlab.runtime.gguf_weights import KEPT_METADATA, GGUFFile, open_gguf, read_config, tensor_to_torch
from inferlab.runtime.llama import LlamaModel, load_gguf
from inferlab.runtime.tokenizer import tokenizer_from_gguf

from .conftest import write_tiny_gguf

gguf = pytest.importorskip("gguf")

TINY = {
    "llama-f32": dict(arch="llama"),
    "llama-f16": dict(arch="llama", qtype="F16"),
    "llama-bf16": dict(arch="llama", qtype="BF16"),
    "llama-q8_0": dict(arch="llama", qtype="Q8_0", d_model=64, n_kv_heads=1, ffn=64),
    "llama-q4_1-untied": dict(arch="llama", qtype="Q4_1", d_model=64, ffn=64, tied=False),
    "llama-q5_0": dict(arch="llama", qtype="Q5_0", d_model=64, ffn=64),
    "qwen2-bias": dict(arch="qwen2", bias=True),
    "mistral-untied": dict(arch="mistral", tied=False, n_kv_heads=4),
}


def assert_same_as_ggufreader(path) -> None:
    """Every metadata value and every tensor of open_gguf(path) equal to gguf.GGUFReader's."""
    ref = gguf.GGUFReader(str(path), "r")
    ref_md = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    got = open_gguf(path)
    assert isinstance(got, GGUFFile)
    assert list(got.metadata) == list(ref_md)
    whole = read_gguf_header(path, keep=list(ref_md)).metadata  # every array kept: all values comparable
    for key, value in ref_md.items():
        mine = whole[key]
        assert (list(mine.values) if isinstance(mine, GGUFArray) else mine) == value, key
        if not isinstance(got.metadata[key], GGUFArray) or got.metadata[key].values is not None:
            assert got.get(key) == value, key  # what the runtime reads: short arrays and the tokenizer's
    for key in KEPT_METADATA:
        if key in ref_md:
            assert got.get(key) == ref_md[key]
    assert [t.name for t in got.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(got.tensors, ref.tensors):
        assert mine.tensor_type == theirs.tensor_type, mine.name
        assert mine.shape == tuple(int(d) for d in theirs.shape), mine.name
        assert (mine.data.shape, mine.data.dtype) == (theirs.data.shape, theirs.data.dtype), mine.name
        assert np.array_equal(mine.data, theirs.data), mine.name
        assert not mine.data.flags.writeable
        a, b = tensor_to_torch(mine, torch.float32), tensor_to_torch(theirs, torch.float32)
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), mine.name


@pytest.mark.parametrize("case", sorted(TINY))
def test_tiny_gguf_reads_as_ggufreader_reads_it(tmp_path, case):
    path = tmp_path / f"{case}.gguf"
    write_tiny_gguf(path, **(dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn=48, vocab=64) | TINY[case]))
    assert_same_as_ggufreader(path)
    got = open_gguf(path)
    assert read_config(got).architecture == TINY[case]["arch"]


@pytest.mark.slow  # GGUFReader takes ~2.5 s on this file, each dequantization ~1 s
def test_smollm_reads_as_ggufreader_reads_it(smollm_file):
    assert_same_as_ggufreader(smollm_file)


def test_smollm_tokenizer_arrays_are_kept_whole_and_the_perf_path_counts_them(smollm_file):
    got = open_gguf(smollm_file)
    tokens, merges = got.get("tokenizer.ggml.tokens"), got.get("tokenizer.ggml.merges")
    assert (len(tokens), len(merges), len(got.get("tokenizer.ggml.token_type"))) == (49152, 48900, 49152)
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and merges[0] == "Ġ t"
    plain = read_gguf_header(smollm_file).metadata  # the perf model's default: long arrays counted only
    assert plain["tokenizer.ggml.tokens"] == GGUFArray("STRING", 49152, None)
    assert plain["tokenizer.ggml.token_type"].values is None
    with pytest.raises(NotSupportedError, match="does not read"):
        GGUFFile(got.path, read_gguf_header(smollm_file), ()).get("tokenizer.ggml.tokens")


# ── bad input ─────────────────────────────────────────────────────────────────────────────────
def write_tokenizer_gguf(path, *, tokens=("a", "b", "ab", "<|x|>"), merges=("a b",), types=None, model="gpt2", **extra):
    """A GGUF with tokenizer metadata only (no tensors); extra: key -> value (strings or ints)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_token_list(list(tokens))
    if merges is not None:
        w.add_token_merges(list(merges))
    w.add_token_types(list(types) if types is not None else [1] * (len(tokens) - 1) + [3])
    for key, value in extra.items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_int32(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_tokenizer_only_file_opens_and_encodes(tmp_path):
    got = open_gguf(write_tokenizer_gguf(tmp_path / "t.gguf", **{"tokenizer.ggml.bos_token_id": 3}))
    tok = tokenizer_from_gguf(got)
    assert got.tensors == ()
    assert tok.encode("ab<|x|>", add_bos=True) == [3, 2, 3]
    assert tok.encode("ab<|x|>", special=False) != [2, 3]


@pytest.mark.parametrize("kw, error, message", [
    (dict(tokens=("a", b"\xff\xfe", "ab", "x")), FileFormatError, r"tokenizer\.ggml\.tokens\[1\] is not valid UTF-8"),
    (dict(types=(1, 1)), FileFormatError, "token_type has 2 entries for 4 tokens"),
    (dict(merges=("ab",)), FileFormatError, "merges entry 'ab' is not two tokens"),
    (dict(model="bert"), NotSupportedError, r"'bert' is not supported.*supported: 'gpt2'.*'llama'"),
    (dict(model="llama"), FileFormatError, r"tokenizer\.ggml\.scores has NoneType entries for 4 tokens"),
    ({"tokenizer.ggml.pre": "nonesuch"}, NotSupportedError, "'nonesuch' is not supported; supported: default"),
    ({"tokenizer.ggml.bos_token_id": "one"}, FileFormatError, "bos_token_id must be an integer"),
])
def test_bad_tokenizer_metadata_is_named(tmp_path, kw, error, message):
    path = write_tokenizer_gguf(tmp_path / "t.gguf", **kw)
    with pytest.raises(error, match=message):
        tokenizer_from_gguf(open_gguf(path))


def test_a_special_token_id_outside_the_vocabulary_is_dropped_as_llama_cpp_does(tmp_path):
    tok = tokenizer_from_gguf(open_gguf(write_tokenizer_gguf(tmp_path / "t.gguf", **{"tokenizer.ggml.eos_token_id": 99})))
    assert tok.eos_id is None


def test_a_file_without_a_tokenizer(tmp_path):
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path)
    with pytest.raises(FileFormatError, match=r"t\.gguf: GGUF has no tokenizer"):
        tokenizer_from_gguf(open_gguf(path))


def test_truncated_token_list_names_the_string(tmp_path):
    path = write_tokenizer_gguf(tmp_path / "t.gguf", tokens=[f"tok{i}" for i in range(5000)], merges=None,
                                types=[1] * 5000)
    data = path.read_bytes()
    cut = data.index(b"tok4000")
    path.write_bytes(data[:cut])
    with pytest.raises(FileFormatError, match=r"tokenizer\.ggml\.tokens\[4000\] runs past the end"):
        open_gguf(path)
    # the perf path (long arrays skipped, not decoded) finds the same fault
    with pytest.raises(FileFormatError, match=r"tokenizer\.ggml\.tokens\[4000\] runs past the end"):
        read_gguf_header(path)


@pytest.mark.parametrize("key, value, message", [
    ("llama.attention.head_count", "four", r"head_count' must be one int, got 'four'"),
    ("llama.attention.head_count", 0, "must be positive"),
    ("llama.block_count", GGUFArray("UINT32", 2, (2, 2)), r"block_count' must be one int, got \[2, 2\]"),
    ("llama.attention.layer_norm_rms_epsilon", True, "layer_norm_rms_epsilon' must be one float, got True"),
    ("llama.context_length", None, "lacks 'llama.context_length'"),
    ("general.architecture", 7, "architecture 7 is not supported"),
])
def test_bad_hyperparameters_are_named(tmp_path, key, value, message):
    """The tiny file's header with one metadata value replaced (or removed: None)."""
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path)
    f = open_gguf(path)
    md = {k: v for k, v in f.metadata.items() if k != key} | ({} if value is None else {key: value})
    bad = GGUFFile(f.path, dataclasses.replace(f.header, metadata=md), f.tensors)
    with pytest.raises((FileFormatError, NotSupportedError), match=message):
        read_config(bad)


def test_an_integer_tensor_type_is_not_supported_and_named(tmp_path):
    path = tmp_path / "i32.gguf"
    write_tiny_gguf(path, tensor_type_override=True)
    with pytest.raises(NotSupportedError, match=r"blk\.0\.attn_q\.weight.*I32 \(id 26\).*supported: F32, F16"):
        open_gguf(path)


def test_one_part_of_a_split_model_is_refused(tmp_path):
    path = write_tokenizer_gguf(tmp_path / "t.gguf", **{"split.count": 3})
    with pytest.raises(NotSupportedError, match="one part of a 3-part split GGUF"):
        open_gguf(path)


@pytest.mark.parametrize("cut", [10, 100, 1000, -100])
def test_truncated_files_are_file_format_errors(tmp_path, cut):
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path)
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut > 0 else data[:cut])
    with pytest.raises(FileFormatError, match=r"t\.gguf"):
        load_gguf(path)


def test_every_error_is_typed(tmp_path):
    """A sweep of single-byte corruptions of the header: each open either succeeds or raises an
    InferlabError (never a numpy, struct or Unicode error)."""
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path)
    data = path.read_bytes()
    header_end = read_gguf_header(path).data_offset
    for pos in range(0, header_end, 7):
        b = bytearray(data)
        b[pos] ^= 0xA5
        path.write_bytes(bytes(b))
        try:
            f = open_gguf(path)
            read_config(f)
        except InferlabError:
            pass

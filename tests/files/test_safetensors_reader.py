"""Safetensors headers and config.json: checkpoints written with the safetensors package, their
bytes checked against the arrays written (independent truth) and the spec's parameter count."""

from __future__ import annotations

import json
import struct

import pytest

from inferlab.errors import ConfigError, FileFormatError
from inferlab.models.safetensors_reader import (
    model_from_hf_folder,
    quantization_summary,
    read_checkpoint,
    read_safetensors_header,
)

np = pytest.importorskip("numpy")
st_numpy = pytest.importorskip("safetensors.numpy")

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 96, "max_position_embeddings": 1024,
         "torch_dtype": "float16"}


def hf_llama_tensors(c: dict, dtype=np.float16) -> dict[str, "np.ndarray"]:
    """The tensors transformers' LlamaForCausalLM saves, in PyTorch [out, in] order."""
    E, F, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    hd = E // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    t = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,), "lm_head.weight": (V, E)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": (E, E), p + "self_attn.k_proj.weight": (kv, E),
                  p + "self_attn.v_proj.weight": (kv, E), p + "self_attn.o_proj.weight": (E, E),
                  p + "mlp.gate_proj.weight": (F, E), p + "mlp.up_proj.weight": (F, E), p + "mlp.down_proj.weight": (E, F),
                  p + "input_layernorm.weight": (E,), p + "post_attention_layernorm.weight": (E,)})
    return {k: np.zeros(s, dtype) for k, s in t.items()}


def test_plain_checkpoint_bytes_and_params(tmp_path):
    arrays = hf_llama_tensors(LLAMA)
    st_numpy.save_file(arrays, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    spec = model_from_hf_folder(tmp_path)
    assert spec.extra["checkpoint_bytes"] == sum(a.nbytes for a in arrays.values())
    assert spec.extra["checkpoint_dtypes"] == {"F16": sum(a.nbytes for a in arrays.values())}
    # the GGUF inventory of the spec counts exactly the checkpoint's weights
    assert spec.total_params() == sum(a.size for a in arrays.values())
    assert spec.extra["quantization"] is None and spec.extra["checkpoint_complete"]
    tensors, metadata = read_safetensors_header(tmp_path / "model.safetensors")
    assert metadata == {"format": "pt"}
    assert {t.name: (t.shape, t.n_bytes) for t in tensors} == {k: (a.shape, a.nbytes) for k, a in arrays.items()}
    # the config.json path reads the same folder
    assert model_from_hf_folder(tmp_path / "config.json").extra["checkpoint_bytes"] == spec.extra["checkpoint_bytes"]


def test_sharded_checkpoint_through_index(tmp_path):
    arrays = hf_llama_tensors(LLAMA, np.float32)
    names = sorted(arrays)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for f, ns in shards.items():
        st_numpy.save_file({n: arrays[n] for n in ns}, str(tmp_path / f))
    total = sum(a.nbytes for a in arrays.values())
    index = {"metadata": {"total_size": total}, "weight_map": {n: f for f, ns in shards.items() for n in ns}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    ck = read_checkpoint(tmp_path)
    assert ck.files == tuple(shards) and ck.complete
    assert ck.total_bytes == total and len(ck.tensors) == len(arrays)
    # a partial download: the missing shard is reported and the index's total used
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    ck = read_checkpoint(tmp_path)
    assert ck.missing_files == ("model-00002-of-00002.safetensors",) and not ck.complete
    assert ck.total_bytes == total
    assert sum(t.n_bytes for t in ck.tensors) == sum(arrays[n].nbytes for n in shards["model-00001-of-00002.safetensors"])


def test_awq_checkpoint(tmp_path):
    """AutoAWQ GEMM layout: qweight int32 [in, out/8] (8 int4 per int32), qzeros int32 [in/g, out/8], scales f16 [in/g, out]."""
    g = 32
    cfg = {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True, "version": "gemm"}}
    arrays = {}
    expect = 0
    for name, a in hf_llama_tensors(LLAMA).items():
        if name.endswith("proj.weight"):
            out_f, in_f = a.shape
            base = name.removesuffix(".weight")
            arrays[base + ".qweight"] = np.zeros((in_f, out_f // 8), np.int32)
            arrays[base + ".qzeros"] = np.zeros((in_f // g, out_f // 8), np.int32)
            arrays[base + ".scales"] = np.zeros((in_f // g, out_f), np.float16)
            expect += in_f * out_f // 2 + (in_f // g) * (out_f // 8) * 4 + (in_f // g) * out_f * 2  # int4 weights, zeros, f16 scales
        else:
            arrays[name] = a
            expect += a.nbytes
    st_numpy.save_file(arrays, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = model_from_hf_folder(tmp_path)
    assert spec.extra["checkpoint_bytes"] == expect
    assert spec.extra["quantization"]["label"] == "AWQ 4-bit g32"
    assert set(spec.extra["checkpoint_dtypes"]) == {"I32", "F16"}


def test_mxfp4_experts_gpt_oss_layout(tmp_path):
    """gpt-oss: expert weights as U8 blocks (two FP4 per byte) and U8 E8M0 scales, one per 32 weights."""
    X, F, E = 4, 64, 128
    arrays = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": np.zeros((X, 2 * F, E // 32, 16), np.uint8),
        "model.layers.0.mlp.experts.gate_up_proj_scales": np.zeros((X, 2 * F, E // 32), np.uint8),
        "model.layers.0.mlp.experts.down_proj_blocks": np.zeros((X, E, F // 32, 16), np.uint8),
        "model.layers.0.mlp.experts.down_proj_scales": np.zeros((X, E, F // 32), np.uint8),
    }
    st_numpy.save_file(arrays, str(tmp_path / "model.safetensors"))
    tensors, _ = read_safetensors_header(tmp_path / "model.safetensors")
    n_weights = X * 2 * F * E + X * E * F
    assert sum(t.n_bytes for t in tensors) == n_weights // 2 + n_weights // 32  # 4.25 bits per weight
    q = quantization_summary({"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}})
    assert q["label"] == "MXFP4 4-bit g32"


def test_fp8_and_bf16_with_torch(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    tensors = {"w": torch.zeros(256, 128, dtype=torch.float8_e4m3fn), "w_scale_inv": torch.zeros(2, 1, dtype=torch.float32),
               "norm": torch.zeros(128, dtype=torch.bfloat16)}
    st_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    got = {t.name: (t.dtype, t.n_bytes) for t in read_safetensors_header(tmp_path / "model.safetensors")[0]}
    assert got == {k: ({torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32", torch.bfloat16: "BF16"}[v.dtype],
                       v.numel() * v.element_size()) for k, v in tensors.items()}
    q = quantization_summary({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}})
    assert q["label"] == "FP8 8-bit block 128x128"
    ct = {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                  "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 128, "type": "int"}}}}}
    assert quantization_summary(ct)["label"] == "compressed-tensors 4-bit g128"


# --- malformed inputs ------------------------------------------------------------------------------
def _header_file(tmp_path, header: bytes, data: bytes = b"", length: int | None = None):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return p


GOOD = {"t": {"dtype": "F16", "shape": [2, 4], "data_offsets": [0, 16]}}
BAD_HEADERS = [
    (b"[1, 2]", "JSON object"),
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{}", "JSON object"),
    (b'{"t": 5}', "must be an object"),
    (json.dumps({"t": {**GOOD["t"], "dtype": "F12"}}).encode(), "unknown dtype 'F12'"),
    (json.dumps({"t": {**GOOD["t"], "shape": [2, -4]}}).encode(), "non-negative integers"),
    (json.dumps({"t": {**GOOD["t"], "shape": "2x4"}}).encode(), "non-negative integers"),
    (json.dumps({"t": {**GOOD["t"], "data_offsets": [0, 15]}}).encode(), "span 15 bytes but F16 [2, 4] needs 16"),
    (json.dumps({"t": {**GOOD["t"], "data_offsets": [16, 0]}}).encode(), "0 <= begin <= end"),
    (json.dumps({"t": {**GOOD["t"], "data_offsets": [0]}}).encode(), "[begin, end]"),
    (json.dumps({"t": {**GOOD["t"], "data_offsets": [1024, 1040]}}).encode(), "past the file"),
    (json.dumps({"t": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}).encode(), "whole bytes"),
    (json.dumps({**GOOD, "__metadata__": [1]}).encode(), "__metadata__"),
]


@pytest.mark.parametrize("header,fragment", BAD_HEADERS)
def test_malformed_safetensors_header(tmp_path, header, fragment):
    p = _header_file(tmp_path, header, b"\0" * 16)
    with pytest.raises(FileFormatError, match=None) as exc:
        read_safetensors_header(p)
    assert fragment in str(exc.value) and str(p) in str(exc.value)


def test_safetensors_lengths(tmp_path):
    good = _header_file(tmp_path, json.dumps(GOOD).encode(), b"\0" * 16)
    assert read_safetensors_header(good)[0][0].n_bytes == 16
    for length in (10**6, 2**64 - 1, 2**63):
        with pytest.raises(FileFormatError, match="larger than the rest"):
            read_safetensors_header(_header_file(tmp_path, b"{}", length=length))
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(FileFormatError, match="shorter than the 8-byte"):
        read_safetensors_header(short)
    with pytest.raises(FileFormatError, match="no such"):
        read_safetensors_header(tmp_path / "absent.safetensors")


@pytest.mark.parametrize("text,error,fragment", [
    ("{", ConfigError, "not valid JSON"),
    ("[]", ConfigError, "must be a JSON object"),
    ('{"model_type": "llama"}', ConfigError, "missing the field"),
    ('{"model_type": "bert", "num_hidden_layers": 2}', ConfigError, "'bert' is not supported"),
    (json.dumps({**LLAMA, "hidden_size": -64}), ConfigError, "positive integer"),
    (json.dumps({**LLAMA, "quantization_config": "awq"}), ConfigError, "quantization_config must be an object"),
    (json.dumps({**LLAMA, "rope_scaling": "llama3"}), ConfigError, "'rope_scaling' must be an object"),
    (json.dumps({**LLAMA, "model_type": "gemma3_text", "sliding_window": 64, "sliding_window_pattern": "x"}), ConfigError, "'sliding_window_pattern' must be"),
])
def test_malformed_config_json(tmp_path, text, error, fragment):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(error) as exc:
        model_from_hf_folder(tmp_path)
    assert fragment in str(exc.value) and str(tmp_path / "config.json") in str(exc.value)


def test_bad_index_and_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        model_from_hf_folder(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(FileFormatError, match="plain file name"):
        read_checkpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": [1]}))
    with pytest.raises(FileFormatError, match="weight_map"):
        read_checkpoint(tmp_path)


def test_fuzz_safetensors_and_config(tmp_path):
    """Hundreds of mutated and truncated headers and configs: valid, or a typed error; never a crash."""
    import random
    import tracemalloc

    from inferlab.errors import InferlabError

    rng = random.Random(7)
    arrays = hf_llama_tensors(LLAMA)
    st_numpy.save_file(arrays, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (n_header,) = struct.unpack("<Q", data[:8])
    config = json.dumps(LLAMA).encode()
    folder = tmp_path / "m"
    folder.mkdir()
    errors = 0
    for i in range(600):
        blob = bytearray(data)
        if i % 3 == 0:
            blob = blob[: rng.randrange(8 + n_header + 64)]
        else:
            for _ in range(rng.randint(1, 6)):
                blob[rng.randrange(8 + n_header)] = rng.randrange(256)
        cfg = bytearray(config)
        for _ in range(rng.randint(0, 3)):
            cfg[rng.randrange(len(cfg))] = rng.choice(b'{}[]",:0123456789-e. x')
        (folder / "model.safetensors").write_bytes(bytes(blob))
        (folder / "config.json").write_bytes(bytes(cfg))
        tracemalloc.start()
        try:
            model_from_hf_folder(folder)
        except InferlabError as exc:
            errors += 1
            assert str(folder) in str(exc), str(exc)  # every message names the file
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert peak < 8 * 2**20
    assert errors > 300

"""Fixtures that write real GGUF, safetensors and config.json files with the gguf and
safetensors packages, from a ModelSpec's tensor inventory, the way llama.cpp's converter lays
them out (norms and biases F32, matrices in the source type)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlab.models.hf_config import model_from_hf_config
from inferlab.models.inventory import tensor_inventory
from inferlab.models.spec import ModelSpec

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

# small Hugging Face configs, one per family model_from_hf_config supports
_BASE = dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=384,
             max_position_embeddings=2048, intermediate_size=256)
HF_CONFIGS: dict[str, dict] = {
    "llama": {**_BASE, "model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
    "llama_tied_mha": {**_BASE, "model_type": "llama", "num_key_value_heads": 4, "tie_word_embeddings": True},
    "mistral": {**_BASE, "model_type": "mistral", "num_key_value_heads": 1, "head_dim": 64},
    "mixtral": {**_BASE, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {**_BASE, "model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {**_BASE, "model_type": "qwen3", "head_dim": 64, "num_key_value_heads": 1},
    "gemma2": {**_BASE, "model_type": "gemma2", "head_dim": 64, "sliding_window": 512},
    "gemma3": {**_BASE, "model_type": "gemma3_text", "num_hidden_layers": 7, "head_dim": 32, "sliding_window": 256},
    "phi3": {**_BASE, "model_type": "phi3", "num_key_value_heads": 4, "rope_scaling": {"type": "longrope"}},
    "qwen2_moe": {**_BASE, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128},
    "qwen3_moe": {**_BASE, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64},
    "gpt_oss": {**_BASE, "model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 32,
                "num_attention_heads": 8, "sliding_window": 128},
    "deepseek_v2": {**_BASE, "model_type": "deepseek_v2", "num_key_value_heads": 4, "qk_nope_head_dim": 32,
                    "qk_rope_head_dim": 32, "v_head_dim": 32, "kv_lora_rank": 64, "q_lora_rank": None,
                    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 2,
                    "first_k_dense_replace": 1},
    "deepseek_v3": {**_BASE, "model_type": "deepseek_v3", "num_key_value_heads": 4, "qk_nope_head_dim": 32,
                    "qk_rope_head_dim": 32, "v_head_dim": 32, "kv_lora_rank": 64, "q_lora_rank": 96,
                    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 1,
                    "first_k_dense_replace": 2, "topk_method": "noaux_tc"},
}


def spec_for(family: str) -> ModelSpec:
    return model_from_hf_config(HF_CONFIGS[family], name=f"tiny-{family}")


def gguf_metadata(spec: ModelSpec) -> dict[str, tuple[object, object]]:
    """key -> (value, GGUFValueType) as convert_hf_to_gguf.py writes them, using gguf's own key names."""
    K, A, T = gguf.Keys.LLM, gguf.Keys.Attention, gguf.GGUFValueType
    a = spec.arch
    md: dict[str, tuple[object, object]] = {}

    def put(key: str, value: object, vtype=T.UINT32) -> None:
        md[key.format(arch=a)] = (value, vtype)

    put(K.BLOCK_COUNT, spec.n_layers)
    put(K.CONTEXT_LENGTH, spec.n_ctx_train)
    put(K.EMBEDDING_LENGTH, spec.d_model)
    put(K.FEED_FORWARD_LENGTH, spec.d_ff or spec.d_ff_expert)
    put(A.HEAD_COUNT, spec.n_heads)
    put(A.HEAD_COUNT_KV, 1 if spec.is_mla else spec.n_kv_heads)
    put(A.LAYERNORM_RMS_EPS, 1e-5, T.FLOAT32)
    put("{arch}.rope.freq_base", 10000.0, T.FLOAT32)
    put("{arch}.rope.dimension_count", spec.qk_rope_head_dim or spec.head_dim)
    if spec.is_mla:  # the absorbed layout, as convert writes it since 2025
        put(A.KEY_LENGTH, spec.kv_lora_rank + spec.qk_rope_head_dim)
        put(A.VALUE_LENGTH, spec.kv_lora_rank)
        put(A.KEY_LENGTH_MLA, spec.head_dim)
        put(A.VALUE_LENGTH_MLA, spec.head_dim_v)
        put(A.KV_LORA_RANK, spec.kv_lora_rank)
        if spec.q_lora_rank:
            put(A.Q_LORA_RANK, spec.q_lora_rank)
    else:
        put(A.KEY_LENGTH, spec.head_dim)
        put(A.VALUE_LENGTH, spec.head_dim_v)
    if spec.is_moe:
        put(K.EXPERT_COUNT, spec.n_experts)
        put(K.EXPERT_USED_COUNT, spec.n_experts_used)
        if spec.arch != "llama":  # mixtral files carry only feed_forward_length
            put(K.EXPERT_FEED_FORWARD_LENGTH, spec.d_ff_expert)
        if spec.n_shared_experts and spec.arch == "deepseek2":
            put(K.EXPERT_SHARED_COUNT, spec.n_shared_experts)
        if spec.d_ff_shared and spec.arch == "qwen2moe":
            put(K.EXPERT_SHARED_FEED_FORWARD_LENGTH, spec.d_ff_shared)
        if spec.n_dense_layers:
            put(K.LEADING_DENSE_BLOCK_COUNT, spec.n_dense_layers)
    if spec.sliding_window:
        put(A.SLIDING_WINDOW, spec.sliding_window)
    return md


def write_spec_gguf(spec: ModelSpec, path: Path, dtype: str = "F16", *, types: dict[str, str] | None = None,
                    sparse: bool = False, extra_tensors: dict | None = None, metadata: dict | None = None,
                    n_vocab_tokens: int | None = None, chat_template: str | None = "{{ messages }}", seed: int = 0,
                    drop: tuple[str, ...] = (), **writer_kw) -> Path:
    """Write spec's tensors to a GGUF: 1-D tensors F32, others in dtype (F16/F32), or the raw type
    named in types (bytes are random); sparse: write the header and extend the file without data;
    metadata: extra or replaced keys (key -> (value, GGUFValueType)); drop: keys not to write."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), spec.arch, **writer_kw)
    w.add_name(spec.name)
    w.add_file_type(0 if dtype == "F32" else 1)
    for k, (v, t) in {**gguf_metadata(spec), **(metadata or {})}.items():
        if k not in drop:
            w.add_key_value(k, v, t)
    n_tok = n_vocab_tokens or spec.vocab_size
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(n_tok)])
    w.add_token_types([1] * n_tok)
    w.add_token_merges(["t 1"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    shapes = {t.name: t.shape for t in tensor_inventory(spec)}
    shapes.update(extra_tensors or {})
    types = types or {}
    total = 0
    for name, ne in shapes.items():
        np_shape = tuple(reversed(ne))
        if name in types:
            gt = gguf.GGMLQuantizationType[types[name]]
            block, size = gguf.GGML_QUANT_SIZES[gt]
            byte_shape = (*np_shape[:-1], np_shape[-1] // block * size)
            if sparse:
                w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=gt)
            else:
                w.add_tensor(name, rng.integers(0, 255, byte_shape, dtype=np.uint8), raw_shape=byte_shape, raw_dtype=gt)
            continue
        np_dtype = np.float32 if (len(ne) == 1 or dtype == "F32") else np.float16
        nbytes = int(np.prod(ne)) * np.dtype(np_dtype).itemsize
        total += nbytes
        if sparse:
            w.add_tensor_info(name, np_shape, np.dtype(np_dtype), nbytes)
        else:
            scale = 1.0 if name.endswith("norm.weight") else 0.02
            w.add_tensor(name, (rng.standard_normal(np_shape) * scale).astype(np_dtype))
    if sparse:
        w.write_header_to_file(path=Path(path))
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        # the tensor data region, never written: a hole of the full size
        data_start = -(-Path(path).stat().st_size // 32) * 32
        padded = sum(-(-ti.nbytes // 32) * 32 for ti in w.tensors[0].values())
        with open(path, "r+b") as f:
            f.truncate(data_start + padded)
    else:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return Path(path)


@pytest.fixture
def gguf_file(tmp_path):
    """gguf_file(spec, name="m.gguf", **kw) -> path of a GGUF written from spec."""

    def make(spec: ModelSpec, name: str = "model.gguf", **kw) -> Path:
        return write_spec_gguf(spec, tmp_path / name, **kw)

    return make


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("parametrize")
    if "family" in metafunc.fixturenames and not (marker and "family" in str(marker.args[0])):
        metafunc.parametrize("family", list(HF_CONFIGS))


@pytest.fixture(scope="session")
def kit():
    """The helpers above, for test modules (conftest cannot be imported under importlib mode)."""

    class Kit:
        pass

    k = Kit()
    k.HF_CONFIGS, k.spec_for, k.write_spec_gguf, k.gguf_metadata = HF_CONFIGS, spec_for, write_spec_gguf, gguf_metadata
    return k

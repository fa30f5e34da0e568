"""ModelSpec from Hugging Face configs: parameter counts against the published model cards."""

import pytest

from inferlab.errors import ConfigError, UnknownNameError
from inferlab.models.catalog import MODELS
from inferlab.models.hf_config import model_from_hf_config

# published totals (model cards / papers), in billions, with the active count for MoE models
PUBLISHED = {
    "llama-2-7b": (6.74, None),
    "llama-3.1-8b": (8.03, None),
    "llama-3.1-70b": (70.6, None),
    "llama-3.1-405b": (405.9, None),
    "llama-3.2-1b": (1.24, None),
    "qwen2.5-7b": (7.61, None),
    "qwen2.5-72b": (72.7, None),
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.1, 22.2),
    "mixtral-8x7b": (46.7, 12.9),
    "mixtral-8x22b": (140.6, 39.1),
    "gemma-2-9b": (9.24, None),
    "phi-3.5-mini": (3.82, None),
    "gpt-oss-120b": (116.8, 5.7),  # OpenAI: 116.83B total, 5.13B active excluding embeddings (+0.58B unembedding)
    "deepseek-v2-lite": (15.7, 2.7),  # "15.7B total, 2.4B activated" (the 2.4B excludes embeddings)
    "deepseek-v3": (671.0, 37.5),  # "671B total, 37B activated" (61 blocks; MTP module excluded)
}


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_parameter_counts_match_the_model_cards(key):
    total, active = PUBLISHED[key]
    m = MODELS[key]
    assert m.total_params() / 1e9 == pytest.approx(total, rel=0.01)
    if active:
        assert m.active_params() / 1e9 == pytest.approx(active, rel=0.06)


def test_catalog_size_and_sources():
    assert len(MODELS) >= 30
    archs = {m.arch for m in MODELS.values()}
    assert archs >= {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe", "gpt-oss", "deepseek2"}
    assert all(m.source.startswith("https://huggingface.co/") for m in MODELS.values())


def test_families():
    g3 = model_from_hf_config({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 12, "hidden_size": 256,
                               "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "intermediate_size": 512,
                               "vocab_size": 1000, "sliding_window": 512}})
    assert g3.arch == "gemma3" and g3.tied_embeddings and g3.qk_norm
    assert g3.swa_layers == tuple(i % 6 != 5 for i in range(12))  # five local layers, then one global
    ds = MODELS["deepseek-v2-lite"]
    assert ds.is_mla and ds.kv_elements_per_token(0) == 576 and ds.n_dense_layers == 1 and not ds.layer_is_moe(0)
    oss = MODELS["gpt-oss-20b"]
    assert oss.sliding_window == 128 and sum(oss.swa_layers) == 12 and oss.attn_sinks
    assert MODELS["qwen2.5-0.5b"].tied_embeddings and MODELS["qwen2.5-0.5b"].attn_bias


def test_bad_configs():
    base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}
    with pytest.raises(ConfigError, match="hidden_size"):
        model_from_hf_config({k: v for k, v in base.items() if k != "hidden_size"})
    with pytest.raises(ConfigError, match="model_type 'bert'.*llama"):
        model_from_hf_config({**base, "model_type": "bert"})
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_from_hf_config({**base, "num_hidden_layers": -2})
    with pytest.raises(ConfigError, match="multiple"):
        model_from_hf_config({**base, "num_key_value_heads": 3})
    with pytest.raises(ConfigError, match="rope_scaling"):
        model_from_hf_config({**base, "rope_scaling": "llama3"})
    with pytest.raises(ConfigError, match="sliding_window_pattern"):
        model_from_hf_config({**base, "model_type": "gemma3_text", "head_dim": 16, "sliding_window": 8, "sliding_window_pattern": "six"})
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        model_from_hf_config({**base, "num_key_value_heads": "4"})
    with pytest.raises(ConfigError, match="JSON object"):
        model_from_hf_config(["not", "a", "dict"])
    with pytest.raises(UnknownNameError, match="llama-3.1-8b"):
        MODELS["llama-3.1-8"]

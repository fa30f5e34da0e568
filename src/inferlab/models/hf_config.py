"""ModelSpec from a Hugging Face ``config.json`` dict, for the families llama.cpp converts.

Field names are those of transformers' configuration classes; defaults are theirs too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .spec import ModelSpec

# HF model_type -> GGUF architecture
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "gpt_oss": "gpt-oss",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2",
}


def _swa_pattern(n_layers: int, period: int) -> tuple[bool, ...]:
    """llama.cpp's set_swa_pattern(period): layer i is windowed unless i % period == period - 1."""
    return tuple(i % period < period - 1 for i in range(n_layers))


# Sizes beyond any published model: a config declaring more is broken or hostile (minutes of work
# or a MemoryError otherwise). The largest published figures are far below: 126 layers (Llama 3.1
# 405B), hidden 18,432 (Nemotron-4 340B), 256k vocab (Gemma), 384 experts (Kimi K2).
FIELD_CAPS = {"num_hidden_layers": 1024, "hidden_size": 131072, "intermediate_size": 1 << 20, "moe_intermediate_size": 1 << 20,
              "num_attention_heads": 4096, "num_key_value_heads": 4096, "head_dim": 16384, "vocab_size": 1 << 23,
              "num_local_experts": 65536, "num_experts": 65536, "n_routed_experts": 65536, "num_experts_per_tok": 65536,
              "max_position_embeddings": 1 << 27, "sliding_window": 1 << 27}


def model_from_hf_config(config: Mapping[str, Any], name: str | None = None, source: str = "") -> ModelSpec:
    """Build a ModelSpec from a parsed config.json. Raises ConfigError on a missing field."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"a config must be a JSON object (dict), got {type(config).__name__}")
    outer = config
    if isinstance(config.get("text_config"), Mapping):  # multimodal wrappers (gemma3, llava...)
        config = {**config["text_config"]}
        config.setdefault("model_type", outer.get("model_type"))
        if "tie_word_embeddings" not in config and "tie_word_embeddings" in outer:
            config["tie_word_embeddings"] = outer["tie_word_embeddings"]
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(MODEL_TYPES))}")
    arch = MODEL_TYPES[model_type]
    label = name or config.get("_name_or_path") or outer.get("_name_or_path") or model_type

    def capped(key: str, v: int) -> int:
        cap = FIELD_CAPS.get(key)
        if cap is not None and v > cap:
            raise ConfigError(f"config of {label!r}: field {key!r} = {v} is beyond any published model (at most {cap})")
        return v

    def req(key: str) -> Any:
        v = config.get(key)
        if v is None:
            raise ConfigError(f"config of {label!r} ({model_type}) is missing the field {key!r}")
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(f"config of {label!r}: field {key!r} must be a positive integer, got {v!r}")
        return capped(key, v)

    def opt(key: str, default: Any) -> Any:
        v = config.get(key)
        if v is None:
            return default
        if isinstance(default, bool):
            if not isinstance(v, bool):  # "false" is a string, and a non-empty string is true in Python
                raise ConfigError(f"config of {label!r}: field {key!r} must be true or false, got {v!r}")
            return v
        if isinstance(default, int) and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ConfigError(f"config of {label!r}: field {key!r} must be a non-negative integer, got {v!r}")
        return capped(key, v) if isinstance(v, int) else v

    n_layers = req("num_hidden_layers")
    d_model = req("hidden_size")
    n_heads = req("num_attention_heads")
    n_kv = opt("num_key_value_heads", n_heads) or n_heads
    head_dim = opt("head_dim", d_model // n_heads) or d_model // n_heads
    vocab = req("vocab_size")
    kw: dict[str, Any] = dict(
        name=str(label),
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_ff=0,
        vocab_size=vocab,
        n_ctx_train=opt("max_position_embeddings", 4096),
        tied_embeddings=bool(opt("tie_word_embeddings", arch in ("gemma2", "gemma3"))),
        source=source,
        hf_id=str(config.get("_name_or_path") or ""),
    )
    rope_scaling = config.get("rope_scaling") or {}
    if not isinstance(rope_scaling, Mapping):
        raise ConfigError(f"config of {label!r}: field 'rope_scaling' must be an object, got {rope_scaling!r}")
    rope_type = rope_scaling.get("rope_type") or rope_scaling.get("type")

    if arch == "llama":
        kw["rope_freqs"] = rope_type == "llama3"  # convert writes the llama3 frequency factors as a tensor
        if model_type == "mixtral":
            kw.update(n_experts=req("num_local_experts"), n_experts_used=req("num_experts_per_tok"), d_ff_expert=req("intermediate_size"))
        else:
            kw["d_ff"] = req("intermediate_size")
    elif arch in ("qwen2", "qwen3"):
        kw["d_ff"] = req("intermediate_size")
        kw["attn_bias"] = arch == "qwen2"
        kw["qk_norm"] = arch == "qwen3"
    elif arch in ("gemma2", "gemma3"):
        kw["d_ff"] = req("intermediate_size")
        kw["post_norms"] = True
        kw["qk_norm"] = arch == "gemma3"
        kw["tied_embeddings"] = True  # gemma never has a separate output head
        window = opt("sliding_window", 0)
        if window:
            period = 2 if arch == "gemma2" else int(opt("sliding_window_pattern", 6))
            kw["sliding_window"] = window
            kw["swa_layers"] = _swa_pattern(n_layers, period)
    elif arch == "phi3":
        kw["d_ff"] = req("intermediate_size")
        kw["rope_factors"] = rope_type in ("longrope", "su")
    elif arch in ("qwen2moe", "qwen3moe"):
        kw.update(n_experts=req("num_experts"), n_experts_used=req("num_experts_per_tok"), d_ff_expert=req("moe_intermediate_size"))
        kw["d_ff"] = 0
        if arch == "qwen2moe":
            kw["attn_bias"] = True
            shared = opt("shared_expert_intermediate_size", 0)
            kw.update(d_ff_shared=shared, n_shared_experts=1 if shared else 0, shared_expert_gate=bool(shared))
        else:
            kw["qk_norm"] = True
        if opt("mlp_only_layers", []) or opt("decoder_sparse_step", 1) != 1:
            raise ConfigError(f"config of {label!r}: mixed dense/MoE layer layouts (mlp_only_layers, decoder_sparse_step) are not supported")
    elif arch == "gpt-oss":
        kw.update(n_experts=req("num_local_experts"), n_experts_used=opt("num_experts_per_tok", opt("experts_per_token", 4)), d_ff_expert=req("intermediate_size"))
        kw.update(attn_bias=True, attn_out_bias=True, attn_sinks=True, expert_bias=True)
        window = opt("sliding_window", 128)
        layer_types = config.get("layer_types")
        if layer_types is not None and (not isinstance(layer_types, list) or len(layer_types) != n_layers):
            raise ConfigError(f"config of {label!r}: 'layer_types' must list one type per layer ({n_layers}), got {layer_types!r}")
        swa = tuple(t == "sliding_attention" for t in layer_types) if layer_types else _swa_pattern(n_layers, 2)
        kw.update(sliding_window=window, swa_layers=swa)
    elif arch == "deepseek2":
        nope, rope, v = req("qk_nope_head_dim"), req("qk_rope_head_dim"), req("v_head_dim")
        kw.update(
            head_dim=nope + rope,  # per-head query/key size
            v_head_dim=v,
            n_kv_heads=n_heads,  # MLA expands the latent into every head
            q_lora_rank=opt("q_lora_rank", 0),
            kv_lora_rank=req("kv_lora_rank"),
            qk_rope_head_dim=rope,
            qk_nope_head_dim=nope,
            n_experts=req("n_routed_experts"),
            n_experts_used=req("num_experts_per_tok"),
            d_ff_expert=req("moe_intermediate_size"),
            n_shared_experts=opt("n_shared_experts", 0),
            d_ff_shared=opt("n_shared_experts", 0) * req("moe_intermediate_size"),
            n_dense_layers=opt("first_k_dense_replace", 0),
            d_ff=opt("intermediate_size", 0),
            router_bias=opt("topk_method", "") == "noaux_tc",
        )
    return ModelSpec(**kw)

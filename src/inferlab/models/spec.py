"""ModelSpec: the hyperparameters of one model, whatever it was read from.

Field names follow llama.cpp's hparams where they exist. Sizes are in elements, not bytes.
A spec read from a file also carries that file's real tensor table (``tensors``), which the
tensor plan then uses instead of the llama-quantize rules.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field, fields

from ..errors import ConfigError

# GGUF architecture names (general.architecture) that inferlab can lay out.
# mistral and mixtral are "llama" in GGUF; qwen2_moe is "qwen2moe", gpt_oss is "gpt-oss".
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe", "gpt-oss", "deepseek2")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a model file: GGUF name, shape as GGUF ne[] (innermost first), type, bytes."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelSpec:
    name: str  # display name, e.g. "Llama 3.1 8B"
    arch: str  # GGUF architecture name, one of ARCHITECTURES
    n_layers: int  # transformer blocks
    d_model: int  # hidden size (n_embd)
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA: n_heads / n_kv_heads queries share one)
    head_dim: int  # size of one query/key head
    d_ff: int  # dense FFN intermediate size (0 when every layer is MoE)
    vocab_size: int
    n_ctx_train: int = 4096  # trained context length, tokens
    v_head_dim: int | None = None  # size of one value head (None: head_dim)
    tied_embeddings: bool = False  # output head shares token_embd (no output.weight)
    attn_bias: bool = False  # q/k/v biases (qwen2)
    attn_out_bias: bool = False  # attn_output bias (gpt-oss)
    qk_norm: bool = False  # per-head RMSNorm on q and k (qwen3, gemma3)
    post_norms: bool = False  # post-attention and post-FFN norms (gemma2/3)
    rope_freqs: bool = False  # a rope_freqs.weight tensor (llama 3.x rope scaling)
    rope_factors: bool = False  # rope_factors_long/short tensors (phi3 longrope)
    # sliding-window attention: per-layer flags (True = windowed) and the window in tokens
    sliding_window: int | None = None
    swa_layers: tuple[bool, ...] = ()
    # mixture of experts
    n_experts: int = 0
    n_experts_used: int = 0
    d_ff_expert: int = 0  # intermediate size of one routed expert
    n_shared_experts: int = 0
    d_ff_shared: int = 0  # intermediate size of the shared expert(s), all together
    shared_expert_gate: bool = False  # qwen2moe: a sigmoid gate on the shared expert
    n_dense_layers: int = 0  # leading layers with a dense FFN (deepseek first_k_dense_replace)
    expert_bias: bool = False  # biases on router and experts (gpt-oss)
    router_bias: bool = False  # exp_probs_b (deepseek v3 noaux_tc)
    # multi-head latent attention (deepseek2)
    q_lora_rank: int = 0  # 0: q is a plain projection (V2-Lite)
    kv_lora_rank: int = 0  # compressed KV latent size (0: not MLA)
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    attn_sinks: bool = False  # gpt-oss learned attention sinks
    source: str = ""  # where the figures come from
    hf_id: str = ""  # Hugging Face repository id, when known
    # from a file: its real tensors and llama.cpp file type (None for a spec built from a config)
    tensors: tuple[TensorInfo, ...] | None = field(default=None, repr=False, compare=False)
    file_type: str | None = None
    extra: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ConfigError(f"architecture {self.arch!r} of {self.name!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "n_ctx_train"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{self.name!r}: {f} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"{self.name!r}: n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.swa_layers and len(self.swa_layers) != self.n_layers:
            raise ConfigError(f"{self.name!r}: swa_layers has {len(self.swa_layers)} entries for {self.n_layers} layers")
        if self.n_experts and not (0 < self.n_experts_used <= self.n_experts and self.d_ff_expert > 0):
            raise ConfigError(f"{self.name!r}: MoE needs 0 < n_experts_used <= n_experts and d_ff_expert > 0")

    def __hash__(self) -> int:
        # specs key many caches (plans, KV tables); hash the fields once, not on every lookup
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare))
            object.__setattr__(self, "_hash", h)
        return h

    # --- derived sizes -------------------------------------------------------------------
    @property
    def head_dim_v(self) -> int:
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim

    @property
    def n_gqa(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def layer_is_moe(self, i: int) -> bool:
        return self.is_moe and i >= self.n_dense_layers

    def layer_is_swa(self, i: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[i]

    def kv_elements_per_token(self, i: int) -> int:
        """K plus V elements one token adds to layer i's cache."""
        if self.is_mla:
            # llama.cpp caches the compressed latent (kv_lora_rank) and the shared rope key
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.n_kv_heads * (self.head_dim + self.head_dim_v)

    def total_params(self) -> int:
        from .inventory import tensor_inventory

        return sum(t.n_elements for t in tensor_inventory(self))

    def active_params(self) -> int:
        """Parameters read to decode one token (MoE: only the routed experts in use)."""
        from .inventory import tensor_inventory

        total = 0
        for t in tensor_inventory(self):
            n = t.n_elements
            if t.is_expert:
                n = n // self.n_experts * self.n_experts_used
            total += n
        return total

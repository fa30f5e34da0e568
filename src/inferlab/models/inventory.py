"""The GGUF tensor inventory that follows from a ModelSpec: every tensor llama.cpp's converter
(convert_hf_to_gguf.py) writes, with its name and its shape as GGUF ne[] (innermost first).

Shapes follow llama.cpp's src/llama-model.cpp create_tensor calls per architecture.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from .spec import ModelSpec


class TensorShape(NamedTuple):
    """One tensor the converter writes (an immutable record: a catalog sweep lays out ~20k)."""

    name: str
    shape: tuple[int, ...]  # GGUF ne[]: ne[0] is the row length
    layer: int | None = None  # block index, None for global tensors
    is_expert: bool = False  # a stacked routed-expert tensor (only n_experts_used of n_experts are read per token)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


def tensor_inventory(spec: ModelSpec) -> tuple[TensorShape, ...]:
    return _inventory(spec)


class BlockTensor(NamedTuple):
    """One tensor of a block by its role: its name without the "blk.N." prefix."""

    role: str  # e.g. "attn_q.weight"
    shape: tuple[int, ...]  # GGUF ne[]
    is_expert: bool = False


def block_roles(spec: ModelSpec, i: int) -> tuple[BlockTensor, ...]:
    """Block i's tensors, in the converter's order. Blocks of one kind (dense or MoE) hold the same
    roles and shapes; only the block index in their names differs."""
    return _block_roles(spec, spec.layer_is_moe(i))


@lru_cache(maxsize=512)
def global_tensors(m: ModelSpec) -> tuple[tuple[TensorShape, ...], tuple[TensorShape, ...]]:
    """The tensors written before the blocks (token_embd, rope tables) and after them (output_norm, output)."""
    E, V = m.d_model, m.vocab_size
    head: list[TensorShape] = [TensorShape("token_embd.weight", (E, V))]
    if m.rope_freqs:
        head.append(TensorShape("rope_freqs.weight", (m.head_dim // 2,)))
    if m.rope_factors:
        head.append(TensorShape("rope_factors_long.weight", (m.head_dim // 2,)))
        head.append(TensorShape("rope_factors_short.weight", (m.head_dim // 2,)))
    tail = [TensorShape("output_norm.weight", (E,))]
    if not m.tied_embeddings:
        tail.append(TensorShape("output.weight", (E, V)))
    return tuple(head), tuple(tail)


@lru_cache(maxsize=512)
def _inventory(m: ModelSpec) -> tuple[TensorShape, ...]:
    head, tail = global_tensors(m)
    out: list[TensorShape] = list(head)
    for i in range(m.n_layers):
        p = f"blk.{i}."
        out.extend([TensorShape(p + t.role, t.shape, i, t.is_expert) for t in block_roles(m, i)])
    out.extend(tail)
    return tuple(out)


@lru_cache(maxsize=1024)
def _block_roles(m: ModelSpec, moe: bool) -> tuple[BlockTensor, ...]:
    E = m.d_model
    q_dim = m.n_heads * m.head_dim  # all query heads
    kv_dim = m.n_kv_heads * m.head_dim  # all key heads
    v_dim = m.n_kv_heads * m.head_dim_v  # all value heads
    o_in = m.n_heads * m.head_dim_v  # attention output before the output projection
    t: list[BlockTensor] = []

    def add(role: str, *shape: int, expert: bool = False) -> None:
        t.append(BlockTensor(role, tuple(shape), expert))

    add("attn_norm.weight", E)
    # --- attention ---
    if m.is_mla:
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim  # per-head query/key size
        if m.q_lora_rank:
            add("attn_q_a.weight", E, m.q_lora_rank)  # compress q
            add("attn_q_a_norm.weight", m.q_lora_rank)
            add("attn_q_b.weight", m.q_lora_rank, m.n_heads * qk_head)  # expand q
        else:
            add("attn_q.weight", E, m.n_heads * qk_head)
        add("attn_kv_a_mqa.weight", E, m.kv_lora_rank + m.qk_rope_head_dim)  # latent + shared rope key
        add("attn_kv_a_norm.weight", m.kv_lora_rank)
        add("attn_k_b.weight", m.qk_nope_head_dim, m.kv_lora_rank, m.n_heads)  # latent -> nope keys (absorbed)
        add("attn_v_b.weight", m.kv_lora_rank, m.head_dim_v, m.n_heads)  # latent -> values
        add("attn_output.weight", m.n_heads * m.head_dim_v, E)
    elif m.arch == "phi3":
        add("attn_qkv.weight", E, q_dim + kv_dim + v_dim)  # fused q, k, v
        add("attn_output.weight", o_in, E)
    else:
        add("attn_q.weight", E, q_dim)
        add("attn_k.weight", E, kv_dim)
        add("attn_v.weight", E, v_dim)
        add("attn_output.weight", o_in, E)
        if m.attn_bias:
            add("attn_q.bias", q_dim)
            add("attn_k.bias", kv_dim)
            add("attn_v.bias", v_dim)
        if m.attn_out_bias:
            add("attn_output.bias", E)
        if m.qk_norm:
            add("attn_q_norm.weight", m.head_dim)
            add("attn_k_norm.weight", m.head_dim)
    if m.attn_sinks:
        add("attn_sinks.weight", m.n_heads)
    if m.post_norms:
        add("post_attention_norm.weight", E)
    # --- feed-forward ---
    if m.arch == "gpt-oss":
        add("post_attention_norm.weight", E)  # gpt-oss names its pre-FFN norm this way
    else:
        add("ffn_norm.weight", E)
    if moe:
        X, F = m.n_experts, m.d_ff_expert
        add("ffn_gate_inp.weight", E, X)  # router
        if m.expert_bias:
            add("ffn_gate_inp.bias", X)
        if m.router_bias:
            add("exp_probs_b.bias", X)
        add("ffn_gate_exps.weight", E, F, X, expert=True)
        add("ffn_up_exps.weight", E, F, X, expert=True)
        add("ffn_down_exps.weight", F, E, X, expert=True)
        if m.expert_bias:
            add("ffn_gate_exps.bias", F, X, expert=True)
            add("ffn_up_exps.bias", F, X, expert=True)
            add("ffn_down_exps.bias", E, X, expert=True)
        if m.d_ff_shared:
            if m.shared_expert_gate:
                add("ffn_gate_inp_shexp.weight", E)
            add("ffn_gate_shexp.weight", E, m.d_ff_shared)
            add("ffn_up_shexp.weight", E, m.d_ff_shared)
            add("ffn_down_shexp.weight", m.d_ff_shared, E)
    elif m.arch == "phi3":
        add("ffn_up.weight", E, 2 * m.d_ff)  # fused gate and up
        add("ffn_down.weight", m.d_ff, E)
    else:
        add("ffn_gate.weight", E, m.d_ff)
        add("ffn_up.weight", E, m.d_ff)
        add("ffn_down.weight", m.d_ff, E)
    if m.post_norms:
        add("post_ffw_norm.weight", E)
    return tuple(t)

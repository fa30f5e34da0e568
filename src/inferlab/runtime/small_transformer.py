"""The KV-cache case study's SmallTransformer (seed 004, cells 11 and 13): a GPT-style decoder with
learned positions, LayerNorm, fused QKV and a GELU MLP, random weights (d_model 512, 8 heads,
6 layers, vocabulary 32000, 4096 positions by default).

`forward(token_ids, kv_caches=None, position_offset=0) -> (logits, new_caches)` is the case
study's own interface: kv_caches is a list of (keys, values) tuples grown with torch.cat.
`step(tokens, cache)` is the runtime's interface (the same one LlamaModel has), which lets the
runtime's preallocated caches (contiguous, paged, int8, window) and `generate()` drive it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import InvalidValueError


@dataclass(frozen=True)
class SmallConfig:
    vocab_size: int = 32000
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    max_seq_len: int = 4096

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_kv_heads(self) -> int:  # plain multi-head attention: every head has its own K and V
        return self.n_heads

    @property
    def n_ctx_train(self) -> int:
        return self.max_seq_len

    @property
    def ffn_dim(self) -> int:
        return 4 * self.d_model

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return 2 * self.n_layers * self.n_heads * self.head_dim * dtype_bytes


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise InvalidValueError(f"d_model {d_model} must be divisible by n_heads {n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.W_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.W_out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, kv_cache=None, use_causal_mask=True, *, runtime_cache=None, layer=0, position_offset=0):
        B, T, _ = x.shape
        q, k, v = self.W_qkv(x).split(self.d_model, dim=-1)
        q, k, v = (t.view(B, -1, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        key_pos = None
        if runtime_cache is not None:  # the runtime's preallocated caches
            k, v, key_pos = runtime_cache.update(layer, k, v)
            new_cache = None
        else:  # the case study's: grow the history with torch.cat
            if kv_cache is not None:
                k = torch.cat([kv_cache[0], k], dim=2)
                v = torch.cat([kv_cache[1], v], dim=2)
            new_cache = (k, v)
        T_kv = k.shape[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if use_causal_mask and (T > 1 or key_pos is not None):
            q_pos = torch.arange(position_offset, position_offset + T, device=x.device)[:, None]
            k_pos = (key_pos if key_pos is not None else torch.arange(T_kv, device=x.device))[None, :]
            mask = k_pos <= q_pos  # with a full history this is the case study's tril
            window = getattr(runtime_cache, "window", None)
            if window is not None:
                mask &= k_pos > q_pos - window
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(F.softmax(scores, dim=-1), v)
        out = out.transpose(1, 2).contiguous().view(B, T, self.d_model)
        return self.W_out(out), new_cache

class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, ffn_mult: int = 4):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(
            nn.Linear(d_model, ffn_mult * d_model, bias=False), nn.GELU(), nn.Linear(ffn_mult * d_model, d_model, bias=False)
        )

    def forward(self, x, kv_cache=None, **runtime):
        attn_out, new_cache = self.attn(self.ln1(x), kv_cache=kv_cache, **runtime)
        x = x + attn_out
        return x + self.ffn(self.ln2(x)), new_cache

class SmallTransformer(nn.Module):
    """The case study's model. `SmallTransformer()` is its default 26M-parameter size."""

    def __init__(self, vocab_size=32000, d_model=512, n_heads=8, n_layers=6, max_seq_len=4096):
        super().__init__()
        self.config = SmallConfig(vocab_size, d_model, n_heads, n_layers, max_seq_len)
        self.d_model, self.n_heads, self.n_layers = d_model, n_heads, n_layers
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_seq_len, d_model)
        self.blocks = nn.ModuleList([TransformerBlock(d_model, n_heads) for _ in range(n_layers)])
        self.ln_final = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    # the case study's interface
    def forward(self, token_ids, kv_caches=None, position_offset: int = 0):
        B, T = token_ids.shape
        self._check_positions(position_offset + T)
        positions = torch.arange(position_offset, position_offset + T, device=token_ids.device)
        x = self.embed(token_ids) + self.pos_embed(positions)
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, new_cache = block(x, kv_cache=kv_caches[i] if kv_caches is not None else None, position_offset=position_offset)
            new_caches.append(new_cache)
        return self.lm_head(self.ln_final(x)), new_caches

    # the runtime's interface
    @property
    def n_ctx(self) -> int:
        return self.config.max_seq_len

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def dtype(self):
        return next(self.parameters()).dtype

    @property
    def weight_bytes(self) -> int:
        return sum(p.nbytes for p in self.parameters())

    @property
    def decode_weight_bytes(self) -> int:
        # every matrix and norm, one row of each embedding table
        rows = (self.embed.weight.shape[1] + self.pos_embed.weight.shape[1]) * self.embed.weight.element_size()
        return self.weight_bytes - self.embed.weight.nbytes - self.pos_embed.weight.nbytes + rows

    def new_cache(self, spec="contiguous", batch: int = 1, capacity: int | None = None):
        from .kv_cache import CacheSpec, make_cache

        spec = CacheSpec.parse(spec) if isinstance(spec, str) else spec
        return make_cache(spec, self.config, batch, capacity or self.n_ctx, self.dtype, self.device)

    def step(self, tokens, cache=None, *, all_logits: bool = False):
        if cache is None:
            logits, _ = self.forward(tokens)
        else:
            B, T = tokens.shape
            start = cache.seq_len
            self._check_positions(start + T)
            cache.reserve(T)
            positions = torch.arange(start, start + T, device=tokens.device)
            x = self.embed(tokens) + self.pos_embed(positions)
            for i, block in enumerate(self.blocks):
                x, _ = block(x, runtime_cache=cache, layer=i, position_offset=start)
            cache.advance(T)
            logits = self.lm_head(self.ln_final(x if all_logits else x[:, -1:]))
        return logits if all_logits else logits[:, -1:]

    def _check_positions(self, n: int) -> None:
        if n > self.config.max_seq_len:
            raise InvalidValueError(
                f"context of {n} tokens exceeds the model's {self.config.max_seq_len} learned positions"
            )

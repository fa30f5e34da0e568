"""A llama-family decoder (llama, mistral, qwen2) in plain torch, written for decode speed:
fused QKV and gate/up matrices, a precomputed RoPE table, preallocated KV caches, no autograd.

    x = embed(tokens)
    per layer:  h = x + Wo · attn(rope(Wq·rmsnorm(x)), rope(Wk·rmsnorm(x)), Wv·rmsnorm(x))
                x = h + Wdown · (silu(Wgate·rmsnorm(h)) * Wup·rmsnorm(h))
    logits = Wout · rmsnorm(x)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError, UnknownNameError
from .gguf_weights import LlamaConfig, load_state, open_gguf, read_config
from .kv_cache import CacheSpec, KVCache, make_cache
from .linear import WEIGHT_DTYPES, WeightArena, make_linear

__all__ = ["WEIGHT_DTYPES", "LlamaModel", "load_gguf"]



@dataclass
class _Layer:
    attn_norm: Any
    wqkv: Any  # (q_dim + 2 * kv_dim, d_model)
    bqkv: Any
    wo: Any
    ffn_norm: Any
    w_gate_up: Any  # (2 * ffn_dim, d_model)
    w_down: Any


def _nbytes(w) -> int:
    return w.nbytes if w is not None else 0


class LlamaModel:
    """Weights and forward of a llama-family GGUF. Build with `LlamaModel.from_gguf(path)`."""

    def __init__(self, config: LlamaConfig, state: dict, *, device="cpu", dtype="float32", n_ctx: int | None = None, path: str = ""):
        import torch

        if dtype not in WEIGHT_DTYPES:
            raise UnknownNameError("weight dtype", dtype, WEIGHT_DTYPES)
        self.config, self.path, self.weight_dtype_name = config, path, dtype
        self.device = torch.device(device)
        self.dtype = torch.float32 if dtype in ("int8", "int4") else getattr(torch, dtype)  # activation dtype
        self.n_ctx = n_ctx or config.n_ctx_train
        # fp16/bf16 on a CPU: attention in fp32 (the cache stays in the half type): torch's half-precision
        # CPU attention is slow; SmolLM2 fp16 decode step at 900 cached tokens 19.8 vs 44.7 ms, bf16
        # 37.0 vs 51.8 ms (AMD EPYC Zen 4, in one process, interleaved; equal at 40 tokens)
        self._attn_fp32 = self.device.type == "cpu" and self.dtype in (torch.float16, torch.bfloat16)
        if self.n_ctx > config.n_ctx_train:
            raise InvalidValueError(
                f"context {self.n_ctx} exceeds the model's trained context of {config.n_ctx_train} tokens"
            )
        dev, act = self.device, self.dtype

        arena = None
        if dtype not in ("int8", "int4"):  # dense matrices: one buffer in reading order (huge pages)
            names = self._matrix_names(config)
            n_elements = sum(state[n].numel() for n in names)
            arena = WeightArena(n_elements * getattr(torch, dtype).itemsize + 64 * len(names), dev)  # + alignment

        def matrix(w):  # (out, in) from the file -> its held form (linear.py)
            return make_linear(w, dtype, dev, arena)

        def weight(name):
            return matrix(state[name])

        self.output_norm = state["output_norm.weight"].to(dev, torch.float32)
        # a tied embedding looks its rows up in the head: one copy in memory, whatever its dtype
        self.tok_embd = None if config.tied_embeddings else state["token_embd.weight"].to(device=dev, dtype=self.dtype)
        self.layers: list[_Layer] = []
        for i in range(config.n_layers):
            p = f"blk.{i}."
            wqkv = torch.cat([state[p + "attn_q.weight"], state[p + "attn_k.weight"], state[p + "attn_v.weight"]])
            bqkv = None
            if config.attention_bias:
                bqkv = torch.cat([state[p + "attn_q.bias"], state[p + "attn_k.bias"], state[p + "attn_v.bias"]]).to(dev, act)
            w_gate_up = torch.cat([state[p + "ffn_gate.weight"], state[p + "ffn_up.weight"]])
            self.layers.append(
                _Layer(
                    attn_norm=state[p + "attn_norm.weight"].to(dev, torch.float32),
                    wqkv=matrix(wqkv),
                    bqkv=bqkv,
                    wo=weight(p + "attn_output.weight"),
                    ffn_norm=state[p + "ffn_norm.weight"].to(dev, torch.float32),
                    w_gate_up=matrix(w_gate_up),
                    w_down=weight(p + "ffn_down.weight"),
                )
            )
        # weight-only int8/int4 hold the head as int8 (per-row scales): GGUF files keep it at 6-8 bits
        # (SmolLM2's Q4_1 file: Q8_0) and rounding it to 4 bits changes the greedy tokens; int8 keeps
        # llama.cpp's greedy tokens and reads a quarter of fp32's bytes (SmolLM2: 28 of 113 MB a step)
        head = state["token_embd.weight" if config.tied_embeddings else "output.weight"]
        self.lm_head = make_linear(head, "int8", dev) if dtype in ("int8", "int4") else matrix(head)
        self._rope_cos, self._rope_sin = self._rope_table(self.n_ctx)
        self._rope_cis = torch.complex(self._rope_cos, self._rope_sin)  # e^(i*angle), (positions, head_dim/2)

    @staticmethod
    def _matrix_names(config: LlamaConfig) -> list[str]:
        """The weight matrices the model holds, the LM head included (a tied one is token_embd)."""
        head = "token_embd.weight" if config.tied_embeddings else "output.weight"
        per_layer = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
        return [f"blk.{i}.{n}.weight" for i in range(config.n_layers) for n in per_layer] + [head]

    # ── construction ──────────────────────────────────────────────────────────────────────────
    @classmethod
    def from_gguf(cls, path, *, device="cpu", dtype="float32", n_ctx: int | None = None) -> "LlamaModel":
        import torch

        reader = open_gguf(path)
        config = read_config(reader, os.fspath(path))
        state = load_state(reader, config, torch.float32)
        return cls(config, state, device=device, dtype=dtype, n_ctx=n_ctx, path=os.fspath(path))

    def _rope_table(self, n_positions: int):
        import torch

        c = self.config
        half = c.head_dim // 2
        # theta_i = base^(-2i/d); linear scaling divides positions by the factor
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, half, dtype=torch.float64) * 2 / c.head_dim))
        pos = torch.arange(n_positions, dtype=torch.float64) / c.rope_scale
        angles = torch.outer(pos, inv_freq)  # (positions, half)
        return angles.cos().float().to(self.device), angles.sin().float().to(self.device)

    # ── sizes ─────────────────────────────────────────────────────────────────────────────────
    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight tensor as held in memory (a tied LM head counted once)."""
        total = _nbytes(self.lm_head) + self.output_norm.nbytes + _nbytes(self.tok_embd)
        for layer in self.layers:
            total += sum(_nbytes(w) for w in (layer.attn_norm, layer.wqkv, layer.bqkv, layer.wo, layer.ffn_norm, layer.w_gate_up, layer.w_down))
        return total

    @property
    def decode_weight_bytes(self) -> int:
        """Weight bytes one decode step streams, in the dtype held: all matrices (with their
        scales) and norms, plus one embedding row."""
        if self.tok_embd is not None:
            row = self.tok_embd[0].nbytes
        else:  # a row of the tied head: its share of the head's bytes
            row = -(-self.lm_head.nbytes // self.config.vocab_size)
        layers = sum(
            _nbytes(w) for blk in self.layers for w in (blk.attn_norm, blk.wqkv, blk.bqkv, blk.wo, blk.ffn_norm, blk.w_gate_up, blk.w_down)
        )
        return layers + self.output_norm.nbytes + _nbytes(self.lm_head) + row

    def new_cache(self, spec: CacheSpec | str = "contiguous", batch: int = 1, capacity: int | None = None) -> KVCache:
        spec = CacheSpec.parse(spec) if isinstance(spec, str) else spec
        capacity = capacity or self.n_ctx
        if capacity > self.n_ctx:
            raise InvalidValueError(f"cache capacity {capacity} exceeds the model context {self.n_ctx}")
        return make_cache(spec, self.config, batch, capacity, self.dtype, self.device)

    # ── forward ───────────────────────────────────────────────────────────────────────────────
    def _rms_norm(self, x, weight):
        import torch

        if self.dtype == torch.float32:
            if x.numel() == weight.numel() and self.device.type == "cpu":
                # one row (a decode step): its mean square as a Python float, then two multiplies;
                # torch.rms_norm spends several small aten ops (each a thread dispatch) on it
                flat = x.view(-1)
                scale = 1.0 / math.sqrt(float(torch.dot(flat, flat)) / flat.numel() + self.config.rms_eps)
                return torch.mul(x, weight).mul_(scale)
            return torch.rms_norm(x, weight.shape, weight, self.config.rms_eps)  # one aten call, no dtype round trip
        return torch.rms_norm(x.float(), weight.shape, weight, self.config.rms_eps).to(self.dtype)

    def _rope_qk(self, qkv, start: int, b: int, t: int, cis):
        """Rotated queries and keys, (batch, heads, T, head_dim), from the fused QKV output.
        Adjacent-pair RoPE in fp32 rotates q and k together as complex numbers times e^(i*angle)
        (cis: the positions' rows of that table, (T, 1, head_dim/2), sliced once per forward)."""
        import torch

        c = self.config
        hd, q_dim, kv_dim = c.head_dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        if c.rope_style == "norm" and self.dtype == torch.float32:
            qk = torch.view_as_complex(qkv[..., : q_dim + kv_dim].unflatten(-1, (c.n_heads + c.n_kv_heads, hd // 2, 2)))
            rotated = torch.view_as_real(qk * cis).flatten(-2)  # (b, t, heads, hd)
            return rotated[:, :, : c.n_heads].transpose(1, 2), rotated[:, :, c.n_heads :].transpose(1, 2)
        cos = self._rope_cos[start : start + t].to(self.dtype)
        sin = self._rope_sin[start : start + t].to(self.dtype)
        q = qkv[..., :q_dim].view(b, t, c.n_heads, hd).transpose(1, 2)
        k = qkv[..., q_dim : q_dim + kv_dim].view(b, t, c.n_kv_heads, hd).transpose(1, 2)
        return self._rope(q, cos, sin), self._rope(k, cos, sin)

    def _rope(self, x, cos, sin):
        """Rotate (batch, heads, T, head_dim) by the positions' angles (cos, sin: (T, head_dim/2))."""
        import torch

        if self.config.rope_style == "norm":  # adjacent pairs (x[2i], x[2i+1])
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
        half = x.shape[-1] // 2  # neox: pairs (x[i], x[i + d/2])
        x0, x1 = x[..., :half], x[..., half:]
        return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)

    def forward(self, tokens, cache: KVCache | None = None, *, all_logits: bool = False):
        """tokens: (batch, T) ids at positions cache.seq_len..+T (0..T without a cache).
        Returns logits (batch, T or 1, vocab) in fp32."""
        import torch.nn.functional as F

        c = self.config
        b, t = tokens.shape
        start = cache.seq_len if cache is not None else 0
        if start + t > self.n_ctx:
            raise InvalidValueError(
                f"context of {start + t} tokens exceeds the model's context of {self.n_ctx} tokens "
                f"(trained for {c.n_ctx_train})"
            )
        if cache is not None:
            cache.reserve(t)
        q_dim, kv_dim, hd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.head_dim
        window = getattr(cache, "window", None)
        mask_cache: dict = {}

        cis = self._rope_cis[start : start + t, None]  # this pass's positions, shared by every layer
        x = self._embed(tokens)
        for i, layer in enumerate(self.layers):
            h = self._rms_norm(x, layer.attn_norm)
            qkv = layer.wqkv(h)
            if layer.bqkv is not None:
                qkv = qkv + layer.bqkv
            q, k = self._rope_qk(qkv, start, b, t, cis)
            v = qkv[..., q_dim + kv_dim :].view(b, t, c.n_kv_heads, hd).transpose(1, 2)
            key_pos = None
            if cache is not None:
                k, v, key_pos = cache.update(i, k, v)
            mask = self._mask(t, start, k.shape[2], key_pos, window, mask_cache)  # None for a decode step
            if self._attn_fp32:
                attn = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                      enable_gqa=c.n_kv_heads != c.n_heads).to(self.dtype)
            else:
                attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=c.n_kv_heads != c.n_heads)
            x = x + layer.wo(attn.transpose(1, 2).reshape(b, t, q_dim))
            h = self._rms_norm(x, layer.ffn_norm)
            gate, up = layer.w_gate_up(h).split(c.ffn_dim, dim=-1)
            x = x + layer.w_down(F.silu(gate) * up)
        if cache is not None:
            cache.advance(t)
        if not all_logits:
            x = x[:, -1:]
        return self.lm_head(self._rms_norm(x, self.output_norm)).float()

    def _embed(self, tokens):
        if self.tok_embd is None:  # tied: the rows of the head, the one copy
            return self.lm_head.rows(tokens).to(self.dtype)
        return self.tok_embd[tokens]

    def _mask(self, t, start, n_keys, key_pos, window, memo):
        """Boolean (T, keys) mask, True = attend; None when every key is visible (one query, no window)."""
        import torch

        if t == 1 and key_pos is None:
            return None
        if "m" not in memo:
            q_pos = torch.arange(start, start + t, device=self.device)[:, None]
            k_pos = key_pos[None, :] if key_pos is not None else torch.arange(n_keys, device=self.device)[None, :]
            mask = k_pos <= q_pos  # causal
            if window is not None:
                mask &= k_pos > q_pos - window  # only the last `window` positions
            memo["m"] = mask
        return memo["m"]

    __call__ = forward
    step = forward


def load_gguf(path, *, device: Any = "cpu", dtype: str = "float32", n_ctx: int | None = None):
    """(LlamaModel, GGUFTokenizer) from one GGUF, reading its header once (parsing the
    tokenizer arrays is most of the open time)."""
    import torch

    from .tokenizer import tokenizer_from_gguf

    reader = open_gguf(path)
    config = read_config(reader, os.fspath(path))
    tokenizer = tokenizer_from_gguf(reader)
    state = load_state(reader, config, torch.float32)
    return LlamaModel(config, state, device=device, dtype=dtype, n_ctx=n_ctx, path=os.fspath(path)), tokenizer

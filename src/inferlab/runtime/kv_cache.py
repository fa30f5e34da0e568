"""KV caches for the torch runtime, all behind one interface.

A cache holds, per layer, the keys and values of every sequence in a batch (all sequences in a
batch have the same length). The model calls, per forward pass of T new tokens:

    cache.reserve(T)                       # room for T more tokens (paged: allocate blocks)
    k, v, key_pos = cache.update(layer, k_new, v_new)   # per layer: store, return what to attend to
    cache.advance(T)                       # after the last layer

`update` takes and returns (batch, n_kv_heads, tokens, head_dim) tensors; key_pos is None when
the keys are positions 0..seq_len+T-1 in order, else a 1-D tensor of their positions (the model
builds its mask from it). Caches allocate everything up front: no reallocation per step.

Kinds: contiguous (one preallocated tensor per layer), paged (a block pool with per-sequence
block tables; attention reads through the table), int8 (per-token, per-head absmax scales),
window (a ring of the last W positions: sliding-window attention).
"""

from __future__ import annotations

from typing import Any

from dataclasses import dataclass

from ..errors import InvalidValueError, UnknownNameError, check_positive

CACHE_KINDS = ("contiguous", "paged", "int8", "window")


@dataclass(frozen=True)
class CacheSpec:
    """What cache to build: kind, and the window (tokens) or the page size (tokens per block)."""

    kind: str = "contiguous"
    window: int | None = None
    block_size: int = 16

    @classmethod
    def parse(cls, text: str) -> "CacheSpec":
        """'contiguous', 'paged', 'paged:32' (block size), 'int8', 'window:256'."""
        name, _, arg = text.strip().partition(":")
        if name not in CACHE_KINDS:
            raise UnknownNameError("KV cache kind", name, CACHE_KINDS)
        if name == "window":
            if not arg:
                raise InvalidValueError("a window cache needs its size: window:W, e.g. window:256")
            return cls("window", window=_positive_int("window size", arg))
        if name == "paged" and arg:
            return cls("paged", block_size=_positive_int("block size", arg))
        if arg:
            raise InvalidValueError(f"KV cache kind {name!r} takes no argument, got {text!r}")
        return cls(name)

    @property
    def label(self) -> str:
        return f"window:{self.window}" if self.kind == "window" else self.kind


def _positive_int(what: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidValueError(f"{what} must be a positive integer, got {text!r}") from None
    check_positive(what, value)
    return value


class KVCache:
    """Shared bookkeeping; subclasses store the tensors."""

    kind = "base"

    def __init__(self, n_layers, batch, n_kv_heads, head_dim, capacity, dtype, device):
        check_positive("batch", batch)
        check_positive("cache capacity", capacity)
        self.n_layers, self.batch, self.n_kv_heads, self.head_dim = n_layers, batch, n_kv_heads, head_dim
        self.capacity, self.dtype, self.device = capacity, dtype, device
        self.seq_len = 0

    def reserve(self, n_new: int) -> None:
        if self.seq_len + n_new > self.capacity:
            raise InvalidValueError(
                f"context of {self.seq_len + n_new} tokens exceeds the KV cache capacity of {self.capacity} tokens"
            )

    def advance(self, n_new: int) -> None:
        self.seq_len += n_new

    def update(self, layer, k, v):
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Exact bytes of every tensor the cache allocated."""
        return sum(t.nbytes for t in self._tensors())

    def _tensors(self):
        return []


class ContiguousKVCache(KVCache):
    """One preallocated (batch, kv_heads, capacity, head_dim) tensor per layer for K and for V."""

    kind = "contiguous"

    def __init__(self, *args):
        import torch

        super().__init__(*args)
        shape = (self.n_layers, self.batch, self.n_kv_heads, self.capacity, self.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._k_layers, self._v_layers = self.k.unbind(0), self.v.unbind(0)  # per-layer views

    def update(self, layer, k, v):
        t, kl, vl = k.shape[2], self._k_layers[layer], self._v_layers[layer]
        kl.narrow(2, self.seq_len, t).copy_(k)  # narrow: one dispatch (a decode step makes 2 per layer)
        vl.narrow(2, self.seq_len, t).copy_(v)
        return kl.narrow(2, 0, self.seq_len + t), vl.narrow(2, 0, self.seq_len + t), None

    def copy_prefix_from(self, other: "ContiguousKVCache", n_tokens: int) -> None:
        """Take the first n_tokens of another cache (prefix reuse): a copy, no recomputation."""
        if n_tokens > min(other.seq_len, self.capacity):
            raise InvalidValueError(f"cannot reuse {n_tokens} tokens from a cache holding {other.seq_len}")
        self.k[:, :, :, :n_tokens] = other.k[:, :, :, :n_tokens]
        self.v[:, :, :, :n_tokens] = other.v[:, :, :, :n_tokens]
        self.seq_len = n_tokens

    def _tensors(self):
        return [self.k, self.v]


class PagedKVCache(KVCache):
    """vLLM-style paging: a pool of fixed-size blocks shared by the batch, a block table per
    sequence mapping logical block i to a physical block, and a free list.

    The free list starts in a seeded random order (as a long-running server's list is after
    many frees), so a sequence's blocks are scattered through the pool and attention really
    reads through the block table (gathering the slots of each position).
    """

    kind = "paged"

    def __init__(self, *args, block_size: int = 16, num_blocks: int | None = None, shuffle_seed: int | None = 0):
        import torch

        super().__init__(*args)
        check_positive("block size", block_size)
        self.block_size = block_size
        blocks_per_seq = -(-self.capacity // block_size)
        self.num_blocks = num_blocks or blocks_per_seq * self.batch
        # pool rows are slots: block * block_size + offset
        shape = (self.n_layers, self.num_blocks * block_size, self.n_kv_heads, self.head_dim)
        self.k_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.free_blocks = list(range(self.num_blocks - 1, -1, -1))
        if shuffle_seed is not None:
            import random

            random.Random(shuffle_seed).shuffle(self.free_blocks)
        self.block_tables: list[list[int]] = [[] for _ in range(self.batch)]
        self._slots = None  # (batch, seq_len + T) slot of every position, rebuilt by reserve()
        self._new_slots: Any = None

    def reserve(self, n_new: int) -> None:
        import torch

        super().reserve(n_new)
        end = self.seq_len + n_new
        needed = -(-end // self.block_size)
        for _ in range(needed - len(self.block_tables[0])):
            for table in self.block_tables:
                if not self.free_blocks:
                    raise InvalidValueError(
                        f"KV block pool exhausted: {self.num_blocks} blocks of {self.block_size} tokens are all in use"
                    )
                table.append(self.free_blocks.pop())
        tables = torch.tensor(self.block_tables, dtype=torch.long, device=self.device)
        pos = torch.arange(end, device=self.device)
        # slot_mapping: physical block of each position times block size, plus the offset in it
        self._slots = tables[:, pos // self.block_size] * self.block_size + pos % self.block_size
        self._new_slots = self._slots[:, self.seq_len :].reshape(-1)

    def update(self, layer, k, v):
        b, h, t, d = k.shape
        self.k_pool[layer].index_copy_(0, self._new_slots, k.transpose(1, 2).reshape(b * t, h, d))
        self.v_pool[layer].index_copy_(0, self._new_slots, v.transpose(1, 2).reshape(b * t, h, d))
        slots = self._slots
        keys = self.k_pool[layer][slots].transpose(1, 2)  # (b, h, seq, d): read through the table
        values = self.v_pool[layer][slots].transpose(1, 2)
        return keys, values, None

    def free(self) -> None:
        for table in self.block_tables:
            self.free_blocks.extend(reversed(table))
            table.clear()
        self.seq_len = 0

    def _tensors(self):
        return [self.k_pool, self.v_pool]


class Int8KVCache(KVCache):
    """Keys and values stored as int8 with one fp32 absmax scale per token and per head
    (the case study uses one scale for the whole tensor; per-token scales follow the outliers)."""

    kind = "int8"

    def __init__(self, *args):
        import torch

        super().__init__(*args)
        shape = (self.n_layers, self.batch, self.n_kv_heads, self.capacity, self.head_dim)
        self.k_q = torch.zeros(shape, dtype=torch.int8, device=self.device)
        self.v_q = torch.zeros(shape, dtype=torch.int8, device=self.device)
        self.k_scale = torch.zeros(shape[:-1] + (1,), dtype=torch.float32, device=self.device)
        self.v_scale = torch.zeros(shape[:-1] + (1,), dtype=torch.float32, device=self.device)

    @staticmethod
    def quantize(x):
        import torch

        scale = x.abs().amax(dim=-1, keepdim=True).float() / 127.0  # absmax of each token's head vector
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        return (x.float() / scale).round().clamp(-127, 127).to(torch.int8), scale

    def update(self, layer, k, v):
        start, end = self.seq_len, self.seq_len + k.shape[2]
        kq, ks = self.quantize(k)
        vq, vs = self.quantize(v)
        self.k_q[layer, :, :, start:end], self.k_scale[layer, :, :, start:end] = kq, ks
        self.v_q[layer, :, :, start:end], self.v_scale[layer, :, :, start:end] = vq, vs
        keys = (self.k_q[layer, :, :, :end].to(self.dtype) * self.k_scale[layer, :, :, :end].to(self.dtype))
        values = (self.v_q[layer, :, :, :end].to(self.dtype) * self.v_scale[layer, :, :, :end].to(self.dtype))
        return keys, values, None

    def _tensors(self):
        return [self.k_q, self.v_q, self.k_scale, self.v_scale]


class SlidingWindowKVCache(KVCache):
    """A ring of the last `window` positions; each query attends to keys in (pos - window, pos].

    Keys are stored after RoPE, so their positions stay absolute and the ring order does not
    matter to attention. Capacity (the longest context) is unbounded by memory: only W slots exist.
    """

    kind = "window"

    def __init__(self, *args, window: int):
        import torch

        super().__init__(*args)
        check_positive("window", window)
        self.window = window
        shape = (self.n_layers, self.batch, self.n_kv_heads, window, self.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.slot_pos = torch.full((window,), -1, dtype=torch.long, device=self.device)  # position held by each slot

    def update(self, layer, k, v):
        import torch

        t, w, start = k.shape[2], self.window, self.seq_len
        filled = min(start, w)
        new_pos = torch.arange(start, start + t, device=self.device)
        if t == 1:  # decode: overwrite the oldest slot; every slot is then inside the window
            slot = start % w
            self.k[layer, :, :, slot] = k[:, :, 0]
            self.v[layer, :, :, slot] = v[:, :, 0]
            if layer == self.n_layers - 1:
                self.slot_pos[slot] = start
            n = min(start + 1, w)
            return self.k[layer, :, :, :n], self.v[layer, :, :, :n], None
        # prefill: attend over the ring plus the whole chunk (masked to the window), then keep the tail
        keys = torch.cat([self.k[layer, :, :, :filled], k], dim=2)
        values = torch.cat([self.v[layer, :, :, :filled], v], dim=2)
        key_pos = torch.cat([self.slot_pos[:filled], new_pos])
        keep = min(t, w)  # the last `keep` new positions go into the ring
        slots = (new_pos[-keep:] % w)
        self.k[layer, :, :, slots] = k[:, :, -keep:]
        self.v[layer, :, :, slots] = v[:, :, -keep:]
        if layer == self.n_layers - 1:
            self.slot_pos[slots] = new_pos[-keep:]
        return keys, values, key_pos

    def reserve(self, n_new: int) -> None:
        pass  # a ring never fills up

    def _tensors(self):
        return [self.k, self.v, self.slot_pos]


def make_cache(spec: CacheSpec, config, batch: int, capacity: int, dtype, device) -> KVCache:
    """Build the cache `spec` names for a model config (LlamaConfig-like: n_layers, n_kv_heads, head_dim)."""
    args = (config.n_layers, batch, config.n_kv_heads, config.head_dim, capacity, dtype, device)
    if spec.kind == "contiguous":
        return ContiguousKVCache(*args)
    if spec.kind == "paged":
        return PagedKVCache(*args, block_size=spec.block_size)
    if spec.kind == "int8":
        return Int8KVCache(*args)
    if spec.kind == "window":
        return SlidingWindowKVCache(*args, window=int(spec.window or 0))  # CacheSpec.parse requires a window for this kind
    raise UnknownNameError("KV cache kind", spec.kind, CACHE_KINDS)

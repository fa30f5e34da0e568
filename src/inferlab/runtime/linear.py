"""Weight matrices as the runtime holds them, and the matmul each one uses at decode (one row per
sequence) and at prefill (many rows).

A decode step is a chain of matrix-vector products, so its speed is how fast the weights stream
from memory. Every float matrix is held as in the file, W (N, K) row-major, and multiplied as
W @ x^T. On CPUs MKL runs a one-row product (gemv) on one core at about 10 GB/s (AMD EPYC Zen 4),
while W @ x^T with two to eight rows takes its small-N gemm path, which streams W on every core at
20-30 GB/s; so `DenseLinear` gives a decode step's one row a zero row for company. x @ W^T with
the weight as the second operand (F.linear) packs W for a few rows and runs 3-5x slower; with
more rows (prefill) packing pays off and F.linear is used.

Kinds (`WEIGHT_DTYPES`): float32, bfloat16, float16 (dense), int8 (per-row absmax scales, torch's
aten._weight_int8pack_mm), int4 (groups of 32 with a scale and zero, as GGUF's Q4_1 stores them;
torch's aten._weight_int4pack_mm_for_cpu). Both weight-only kernels are fast on CPUs only with
bf16 activations, so their matmul inputs are rounded to bf16; outputs come back as fp32.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidValueError, NotSupportedError, UnknownNameError

WEIGHT_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")
INT4_GROUP = 32  # weights per scale/zero pair, as in GGUF's Q4_0/Q4_1 blocks
FEW_ROWS = 8  # up to this many rows (a decode batch): W @ x^T; more (prefill): F.linear


HUGE_PAGE_BYTES = 2 * 1024 * 1024  # x86-64 and arm64 Linux transparent huge pages
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux


class WeightArena:
    """One buffer for every dense weight matrix, filled in the order a decode step reads them and
    backed by transparent huge pages where the OS allows (Linux, THP in "madvise" or "always"
    mode). A decode step streams the weights once: with 4 KiB pages the CPU's prefetchers stop at
    every page boundary and each page costs a TLB miss. fp32 decode of SmolLM2 on an AMD EPYC Zen 4:
    median step 26.65 ms with the arena vs 27.57 ms with separate tensors (one process, the two
    models interleaved over 8 rounds). Where madvise is missing the arena is an ordinary buffer."""

    def __init__(self, n_bytes: int, device):
        import torch

        self.huge_pages = False  # whether the OS took the advice (madvise succeeded)
        # room to start the used part on a huge-page boundary; the pages before it are never touched
        self._buf = torch.empty(n_bytes + HUGE_PAGE_BYTES, dtype=torch.uint8, device=device)
        addr, on_cpu = self._buf.data_ptr(), self._buf.device.type == "cpu"
        self._start = (-addr) % HUGE_PAGE_BYTES if on_cpu else 0
        self._end, self._next = self._start + n_bytes, self._start
        if on_cpu:
            self.huge_pages = _advise_huge_pages(addr + self._start, n_bytes)

    def take(self, shape, dtype):
        """An uninitialised tensor of shape and dtype carved from the arena (64-byte aligned)."""
        import math

        n = math.prod(shape) * dtype.itemsize
        start = -(-self._next // 64) * 64
        if start + n > self._end:
            raise InvalidValueError(f"weight arena overflow: {start + n - self._start} bytes asked of {self._end - self._start}")
        self._next = start + n
        return self._buf[start : start + n].view(dtype).view(shape)


def _advise_huge_pages(addr: int, n_bytes: int) -> bool:
    """madvise(MADV_HUGEPAGE) on [addr, addr + n_bytes) before the pages are first touched."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(n_bytes), _MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


class DenseLinear:
    """A float matrix W (N, K) as in the file. fp32 on a CPU: W @ x^T for up to FEW_ROWS rows, one
    row padded to two (see the module docstring); fp16 on a CPU: more rows in fp32; otherwise
    F.linear. Against the K-split batched matmul (W^T as (threads, K/threads, N)) this replaced,
    SmolLM2-135M fp32 on an AMD EPYC Zen 4 with 2 threads, 2026-12-01: median decode step 22.3 vs
    26.2 ms in one process (faster in 14 of 16 interleaved rounds; the K-split copies sat outside
    the arena, which is worth ~3 %); batch 4 45-52 vs 78-89 ms and batch 8 55-90 vs 101-123 ms in
    alternating processes (the K-split packed W for a few rows)."""

    def __init__(self, weight, dtype, *, arena: WeightArena | None = None):
        import torch

        n, k = weight.shape
        self.shape = (n, k)  # (out, in), as in the file
        if arena is not None:
            self.w = arena.take((n, k), dtype)
            self.w.copy_(weight)  # converts the dtype in the same pass
        else:
            self.w = weight.to(dtype).contiguous()
        on_cpu = self.w.device.type == "cpu"
        self._few_rows = on_cpu and dtype == torch.float32
        # fp16 on a CPU without fp16 arithmetic: torch's fp16 gemm is 3x slower than converting W to
        # fp32 and using MKL's (prefill of 256 rows, 30 576x3072 matrices, AMD EPYC Zen 4: 857 vs
        # 271 ms); one-row products stay fp16 (F.linear streams fp16 W at ~22 GB/s there)
        self._upcast_many = on_cpu and dtype == torch.float16
        # the decode row and its zero partner; only row 0 is ever written (views made once: a
        # decode step makes ~120 products, and each aten view costs a dispatch)
        self._pair: Any = torch.zeros((2, k), dtype=dtype, device=self.w.device) if self._few_rows else None
        self._row: Any = self._pair[0] if self._few_rows else None
        self._pair_t: Any = self._pair.T if self._few_rows else None

    @property
    def nbytes(self) -> int:
        return self.w.nbytes

    def rows(self, ids):
        """Rows ids of the (out, in) matrix (a tied embedding looks its tokens up here)."""
        return self.w[ids]

    def __call__(self, x):
        import torch
        import torch.nn.functional as F

        n, k = self.shape
        rows = x.numel() // k
        if self._upcast_many and rows > FEW_ROWS:
            return F.linear(x.float(), self.w.float()).to(self.w.dtype)
        if not self._few_rows or rows > FEW_ROWS:
            return F.linear(x, self.w)
        if rows == 1:
            self._row.copy_(x.reshape(k))
            y = torch.mm(self.w, self._pair_t)[:, 0]  # (N, 2): the first column is W x
        else:
            y = torch.mm(self.w, x.reshape(rows, k).T).T  # (rows, N), transposed
        return y.contiguous().view(*x.shape[:-1], n)


class Int8Linear:
    """Weight-only int8: per-output-row absmax scales, torch's CPU kernel
    (aten._weight_int8pack_mm). Like int4's, the kernel is fast only with bf16 activations
    (7x slower with fp32 ones on AVX2), so inputs and scales are bf16. Reads a quarter of the
    fp32 bytes."""

    def __init__(self, weight):
        import torch

        weight = weight.float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.q = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16).contiguous()
        self.shape = tuple(weight.shape)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    def rows(self, ids):
        return self.q[ids].float() * self.scale[ids].float()[..., None]

    def __call__(self, x):
        import torch

        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        return out.view(*x.shape[:-1], self.shape[0]).float()


def _int4_block_n() -> int:
    """Rows per tile of torch's CPU int4 packing: byte k*16 + j of a tile holds row j (low
    nibble) and row j + 16... of column k. Found by packing a probe and checking which layout
    gives it back; raises if torch packs some other way."""
    import torch

    probe = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    for block_n in (32, 64):
        if torch.equal(_unpack_int4(packed, 128, 64, block_n), probe):
            return block_n
    raise NotSupportedError("torch packs int4 weights in a layout the runtime does not know; use --dtype float32")


def _unpack_int4(packed, n: int, k: int, block_n: int, rows=None):
    """int32 (n or len(rows), k) values of torch's CPU int4 packing. A tile of block_n rows is
    k * block_n/2 bytes; byte (col, j) holds row j in its low nibble and row j + block_n/2 in its
    high nibble."""
    import torch

    tiles = packed.reshape(n // block_n, k, block_n // 2)
    if rows is None:
        both = torch.cat([tiles & 15, tiles >> 4], dim=-1)  # (tiles, k, block_n)
        return both.transpose(1, 2).reshape(n, k).int()
    half = block_n // 2
    tile, j = rows // block_n, rows % block_n
    byte = tiles[tile, :, j % half]  # (len(rows), k)
    return torch.where((j >= half)[:, None], byte >> 4, byte & 15).int()


class Int4Linear:
    """Weight-only int4, groups of INT4_GROUP weights along K with a scale and a zero each:
    w = (q - 8) * scale + zero, q in 0..15 (asymmetric min/max, as Q4_1). torch packs q for its
    CPU kernel (aten._weight_int4pack_mm_for_cpu); scale and zero are bf16 because that kernel
    is fast only with bf16 activations (fp32 ones take a scalar path 10x slower)."""

    _block_n: int | None = None

    def __init__(self, weight):
        import torch

        n, k = weight.shape
        if k % INT4_GROUP or n % 64:
            raise NotSupportedError(f"int4 weights need rows in multiples of 64 and columns in multiples of {INT4_GROUP}, "
                                    f"got a {n}x{k} matrix; use --dtype float32")
        if Int4Linear._block_n is None:
            Int4Linear._block_n = _int4_block_n()
        groups = weight.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
        lo, hi = groups.amin(-1), groups.amax(-1)
        scale = ((hi - lo) / 15).clamp(min=1e-12)  # step between the 16 levels of a group
        q = ((groups - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).reshape(n, k)
        zero = lo + 8 * scale  # the value of q = 8
        self.shape = (n, k)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        self.scale_zero = torch.stack([scale.T, zero.T], dim=-1).to(torch.bfloat16).contiguous()  # (k/32, n, 2)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale_zero.nbytes

    def rows(self, ids):
        """Dequantized rows (a tied embedding's lookups), read from the packed copy."""
        import torch

        flat = ids.reshape(-1)
        q = _unpack_int4(self.packed, *self.shape, int(self._block_n or _int4_block_n()), rows=flat).float()
        sz = self.scale_zero[:, flat].float().repeat_interleave(INT4_GROUP, dim=0)  # (k, rows, 2)
        w = (q - 8) * sz[..., 0].T + sz[..., 1].T
        return w.view(*ids.shape, self.shape[1]).to(torch.float32)

    def __call__(self, x):
        import torch

        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, INT4_GROUP, self.scale_zero)
        return out.view(*x.shape[:-1], self.shape[0]).float()


def make_linear(weight, dtype: str, device, arena: WeightArena | None = None):
    """The held form of one (out, in) weight matrix for a weight dtype name (dense kinds are
    carved from arena when one is given)."""
    import torch

    if dtype not in WEIGHT_DTYPES:
        raise UnknownNameError("weight dtype", dtype, WEIGHT_DTYPES)
    if dtype in ("int8", "int4") and getattr(device, "type", str(device)) != "cpu":
        raise NotSupportedError(f"{dtype} weights use torch's CPU kernels; on {device} use float32, bfloat16 or float16")
    weight = weight.to(device)
    if dtype == "int8":
        return Int8Linear(weight)
    if dtype == "int4":
        return Int4Linear(weight)
    return DenseLinear(weight, getattr(torch, dtype), arena=arena)

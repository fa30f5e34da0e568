"""A LoRA adapter served at runtime versus merged weights: its memory and its extra matmul time per token.

An adapter adds, to each target matrix W (d_out x d_in), two factors A (r x d_in) and B (d_out x r):
r · (d_in + d_out) values, and 2 · r · (d_in + d_out) FLOPs per token (x·Aᵀ, then ·Bᵀ). Decode reads
the factors every step like the weights, so their extra time is their bytes over the GPU's
effective bandwidth (the speed model's η). vLLM preallocates ``--max-loras`` slots of
``--max-lora-rank`` (default 16) for every target module; llama.cpp (``--lora``) and SGLang
(``--lora-paths``) hold each loaded adapter at its own rank. Merged weights cost nothing extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidValueError
from ..models.inventory import block_roles

# the linear layers adapters usually target (PEFT's "all-linear" for Llama-style blocks)
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
VLLM_MAX_LORA_RANK = 16  # vllm LoRAConfig.max_lora_rank default (data/engines/vllm.json)
VLLM_MAX_LORAS = 1


@dataclass(frozen=True)
class LoraCost:
    rank: int
    targets: tuple[str, ...]
    n_matrices: int
    params: int  # adapter values, one adapter
    adapter_bytes: float  # one adapter at its rank, in the adapter's dtype
    vllm_reserved_bytes: float  # vLLM's preallocated slots: max_loras x max_lora_rank
    extra_flops_per_token: float
    extra_decode_s: float  # per token, read at the GPU's effective bandwidth
    base_decode_s: float
    slowdown: float  # (base + extra) / base
    note: str


def lora_params(spec, rank: int, targets: tuple[str, ...] = TARGETS) -> tuple[int, int]:
    """(values of one adapter of ``rank`` on ``targets``, matrices it touches); routed experts are left out."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidValueError(f"LoRA rank must be an integer >= 1, got {rank!r}")
    total = n = 0
    for i in range(spec.n_layers):
        for t in block_roles(spec, i):
            role = t.role.split(".")[0]
            if role in targets and not t.is_expert and len(t.shape) == 2:
                d_in, d_out = t.shape  # GGUF ne[]: input size first
                total += rank * (d_in + d_out)
                n += 1
    return total, n


def lora_cost(setup, base_decode_s: float, rank: int, *, targets: tuple[str, ...] = TARGETS, dtype_bytes: float = 2.0,
              max_loras: int = VLLM_MAX_LORAS, max_lora_rank: int = VLLM_MAX_LORA_RANK) -> LoraCost:
    params, n = lora_params(setup.spec, rank, targets)
    slot_params, _ = lora_params(setup.spec, max(rank, max_lora_rank), targets)
    gpu = setup.machine.gpus[0] if setup.machine.gpus else setup.machine.ram
    bw = gpu.bandwidth_bytes_per_s * setup.speed.eta(gpu)  # the speed model's effective bandwidth on that device
    adapter_bytes = params * dtype_bytes
    extra = adapter_bytes / bw  # factors read once per step, like the weights
    note = ""
    if rank > max_lora_rank:
        note = f"vLLM refuses rank {rank} above --max-lora-rank {max_lora_rank}: pass --max-lora-rank {_vllm_rank(rank)}"
    if setup.spec.is_moe:
        note = (note + "; " if note else "") + "routed experts are not counted (adapters on experts vary by engine)"
    return LoraCost(rank, targets, n, params, adapter_bytes, max_loras * slot_params * dtype_bytes, 2.0 * params, extra,
                    base_decode_s, (base_decode_s + extra) / base_decode_s if base_decode_s else float("nan"), note)


def _vllm_rank(rank: int) -> int:
    from .flags import flag_table

    ch = flag_table("vllm").option("--max-lora-rank").choices or ()
    ok = sorted(int(c) for c in ch if int(c) >= rank)
    return ok[0] if ok else rank

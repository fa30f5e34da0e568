"""The KV pool an engine gets for a model on a machine, in tokens, and the placement it runs with.

Rules (documented assumptions; the engines size their pools at startup):
* vLLM: ``gpu_memory_utilization`` (default 0.92) x GPU memory, minus the weights and the
  activation peak (taken as the compute buffer of the placement), divided by KV bytes per token.
* SGLang: ``mem_fraction_static`` x GPU memory minus the weights (SGLang's static fraction
  already leaves the activations outside it); default 0.88 (assumption: the value SGLang picks
  for 24-80 GB GPUs in the 0.5 series; it varies with GPU memory and parallelism).
* llama.cpp: the context ``-c`` the placement chose (``place(..., n_ctx=None)`` fits the context
  to the memory left, llama.cpp's ``--fit``); every slot shares it (unified KV).
GPU memory is the catalog's ``memory_gb`` x 10^9 bytes, as the placement counts it.

``engine_placement`` is the one placement a simulated engine runs with: its KV pool is read off it
and its step times are priced on it (``TimeModel.from_placement``), so the two always agree.
"""

from __future__ import annotations

from typing import Any

from ..errors import DoesNotFitError
from ..hardware.resolve import resolve_machine
from ..models.resolve import resolve_model
from ..perf.kv_size import kv_bytes_per_token
from ..perf.placement import Placement, place
from ..quant.plan import weight_bytes
from .registry import ENGINES, manager_class

VLLM_GPU_MEMORY_UTILIZATION = 0.92  # vllm EngineArgs default
SGLANG_MEM_FRACTION_STATIC = 0.88  # assumption, see module docstring
VLLM_PROFILE_CTX = 4096  # the context whose compute buffer stands for vLLM's activation peak


def engine_placement(engine: str, model, machine, quant: Any = "Q4_K_M", kv_type: str = "f16") -> Placement:
    """Where ``engine`` keeps ``model`` on ``machine`` (llama.cpp's layer order): llama.cpp with
    ``--fit`` (context and -ngl chosen to fit, possibly a partial offload); vLLM and SGLang hold
    every layer on the GPU (they do not offload layers to the CPU)."""
    manager_class(engine)  # unknown engines raise UnknownNameError
    model, machine = resolve_model(model), resolve_machine(machine)
    if engine == "llamacpp":
        p = place(model, machine, quant, None, kv_type=kv_type)  # llama.cpp's own order and --fit
    else:
        if machine.cpu_only:
            raise DoesNotFitError(f"{engine} needs a GPU; {machine.name} has none (llama.cpp runs on CPUs)")
        p = place(model, machine, quant, VLLM_PROFILE_CTX, kv_type=kv_type, n_gpu_layers=model.n_layers + 1)
    if engine == "llamacpp" and not p.fits:
        raise DoesNotFitError(f"{model.name} {quant} does not fit on {machine.name}: {p.reason}")
    return p


def kv_pool_tokens(engine: str, model, machine, quant: Any = "Q4_K_M", kv_type: str = "f16", *,
                   gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
                   mem_fraction_static: float = SGLANG_MEM_FRACTION_STATIC, placement: Placement | None = None) -> int:
    """KV pool in tokens for ``engine`` serving ``model`` (catalog name or spec) on ``machine``
    (read off ``placement`` when given: the one from ``engine_placement``)."""
    model, machine = resolve_model(model), resolve_machine(machine)
    p = placement if placement is not None else engine_placement(engine, model, machine, quant, kv_type)
    if engine == "llamacpp":
        return int(p.n_ctx)
    if machine.gpu is None:
        raise DoesNotFitError(f"{engine} needs a GPU; {machine.name} has none (llama.cpp runs on CPUs)")
    gpu_bytes = machine.gpu.memory_gb * 1e9
    weights = weight_bytes(model, p.scheme if p.scheme is not None else quant)["total"]
    per_token = kv_bytes_per_token(model, kv_type)
    if engine == "vllm":
        activations = sum(d.compute_bytes for d in p.devices if d.kind == "gpu")
        free = gpu_memory_utilization * gpu_bytes - weights - activations
    else:
        free = mem_fraction_static * gpu_bytes - weights
    if free < per_token:
        raise DoesNotFitError(f"{model.name} {quant} leaves no KV pool on {machine.name} for {engine} "
                              f"({free / 1e9:.2f} GB after weights)")
    return int(free // per_token)


__all__ = ["ENGINES", "engine_placement", "kv_pool_tokens", "VLLM_GPU_MEMORY_UTILIZATION", "SGLANG_MEM_FRACTION_STATIC"]

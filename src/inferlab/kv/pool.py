"""The KV pool an engine gets for a model on a machine, in tokens.

Rules (documented assumptions; the engines size their pools at startup):
* vLLM: ``gpu_memory_utilization`` (default 0.92) x GPU memory, minus the weights and the
  activation peak (taken as the compute buffer of the placement), divided by KV bytes per token.
* SGLang: ``mem_fraction_static`` x GPU memory minus the weights (SGLang's static fraction
  already leaves the activations outside it); default 0.88 (assumption: the value SGLang picks
  for 24-80 GB GPUs in the 0.5 series; it varies with GPU memory and parallelism).
* llama.cpp: the context ``-c`` the placement chose (``place(..., n_ctx=None)`` fits the context
  to the memory left, llama.cpp's ``--fit``); every slot shares it (unified KV).
GPU memory is the catalog's ``memory_gb`` x 10^9 bytes, as the placement counts it.
"""

from __future__ import annotations

from ..errors import DoesNotFitError, UnknownNameError

VLLM_GPU_MEMORY_UTILIZATION = 0.92  # vllm EngineArgs default
SGLANG_MEM_FRACTION_STATIC = 0.88  # assumption, see module docstring
ENGINES = ("llamacpp", "vllm", "sglang")


def kv_pool_tokens(engine: str, model, machine, quant: str = "Q4_K_M", kv_type: str = "f16", *,
                   gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
                   mem_fraction_static: float = SGLANG_MEM_FRACTION_STATIC) -> int:
    """KV pool in tokens for ``engine`` serving ``model`` (catalog name or spec) on ``machine``."""
    from .. import perf_model as pm
    from ..perf.placement import place

    if engine not in ENGINES:
        raise UnknownNameError("engine", engine, ENGINES)
    model, machine = resolve_model_machine(model, machine)
    if engine == "llamacpp":
        p = place(model, machine, quant, None, kv_type=kv_type)  # llama.cpp's own order and --fit
        if not p.fits:
            raise DoesNotFitError(f"{model.name} {quant} does not fit on {machine.name}: {p.reason}")
        return int(p.n_ctx)
    gpu_bytes = machine.gpu.memory_gb * 1e9
    weights = pm.weight_bytes(model, quant)["total"]
    per_token = pm.kv_bytes_per_token(model, kv_type)
    if engine == "vllm":
        p = place(model, machine, quant, 4096, kv_type=kv_type)
        activations = sum(d.compute_bytes for d in p.devices if d.kind == "gpu")
        free = gpu_memory_utilization * gpu_bytes - weights - activations
    else:
        free = mem_fraction_static * gpu_bytes - weights
    if free < per_token:
        raise DoesNotFitError(f"{model.name} {quant} leaves no KV pool on {machine.name} for {engine} "
                              f"({free / 1e9:.2f} GB after weights)")
    return int(free // per_token)


def resolve_model_machine(model, machine):
    """A catalog model and machine by name (unknown names raise UnknownNameError with the closest
    ones), or the objects as given. Machines come from the vendor-figure catalog."""
    from ..hardware.catalog import MACHINES
    from ..models.catalog import MODELS

    return (MODELS[model] if isinstance(model, str) else model), (MACHINES[machine] if isinstance(machine, str) else machine)

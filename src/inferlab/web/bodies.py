"""The request bodies the web API accepts, as strict pydantic models.

Strict: a number must be a JSON number of the right kind (``"8192"`` or ``8192.5`` is not a
context length, ``true`` is not a count), floats must be finite, unknown fields are refused, and
every number has a range. Names (model, machine) are checked against what the server offers in
``app.py``: a client never names a path.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_CONTEXT_TOKENS = 1 << 24  # 16.8 M tokens, above every trained context in the catalog
MAX_LAYERS = 1024
MAX_NAME = 120

Speed = Literal["calibrated", "bandwidth-only", "lesson"]
Order = Literal["llama.cpp", "first-blocks"]
Engine = Literal["llamacpp", "vllm", "sglang"]
Workload = Literal["seed-chat", "shared-prefix", "multi-turn"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, protected_namespaces=())


class Configuration(_Body):
    """One model on one machine: the calculator's controls (``inferlab fit``'s options)."""

    model: str = Field(min_length=1, max_length=MAX_NAME)
    machine: str = Field(min_length=1, max_length=MAX_NAME)
    quant: str | None = Field(None, min_length=1, max_length=40)
    n_ctx: int | None = Field(None, ge=1, le=MAX_CONTEXT_TOKENS)
    kv_type: str = Field("f16", min_length=1, max_length=20)
    n_gpu_layers: int | None = Field(None, ge=0, le=MAX_LAYERS)
    n_cpu_moe: int = Field(0, ge=0, le=MAX_LAYERS)
    speed: Speed = "calibrated"
    order: Order = "llama.cpp"


class FitBody(Configuration):
    context: int | None = Field(None, ge=0, le=MAX_CONTEXT_TOKENS)
    n_prompt: int = Field(512, ge=1, le=1 << 20)


class LoadBody(Configuration):
    """Figure 1: the load of one configuration."""

    disk_gbps: float = Field(3.5, gt=0, le=1000)


class PhasesBody(Configuration):
    """Figure 3: a prompt's prefill, then one decode step."""

    n_prompt: int = Field(2000, ge=1, le=1 << 17)
    context: int | None = Field(None, ge=0, le=MAX_CONTEXT_TOKENS)


class DecodeBody(Configuration):
    """Figure 2: one decode step at ``context`` cached tokens and the curve as the context grows."""

    context: int | None = Field(None, ge=0, le=MAX_CONTEXT_TOKENS)
    batch: int = Field(1, ge=1, le=4096)


class RooflineBody(Configuration):
    """Figure 4: the device's roofline with the model's decode and prefill on it."""

    batch: int = Field(1, ge=1, le=4096)
    context: int = Field(512, ge=0, le=1 << 20)


class SimBody(_Body):
    """One workload through the engines' KV managers (figure 6)."""

    workload: Workload = "seed-chat"
    engines: list[Engine] = Field(default_factory=lambda: ["llamacpp", "vllm", "sglang"], min_length=1, max_length=3)
    capacity_tokens: int | None = Field(384, ge=16, le=10_000_000)
    model: str | None = Field(None, min_length=1, max_length=MAX_NAME)
    machine: str | None = Field(None, min_length=1, max_length=MAX_NAME)
    quant: str = Field("Q4_K_M", min_length=1, max_length=40)
    kv_type: str = Field("f16", min_length=1, max_length=20)
    limit: int | None = Field(None, ge=1, le=2048)
    events: bool = True

"""The performance model's prediction for what the runtime measures: the same GGUF (as a
ModelSpec), the machine it runs on (detected), weights and KV in the dtype the runtime holds them
in, blocks placed in order (the runtime holds every layer on one device).

Anything missing (a model without a GGUF such as the case study's SmallTransformer, a file the
reader cannot describe) leaves the predictions empty with a note saying why; it never fails the
measurement.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..errors import InferlabError

# runtime weight dtype -> the GGML type the performance model sizes weights with; KV cache kind -> kv_type
_QUANT_BY_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "int8": "Q8_0",
                   "int4": "Q4_1"}  # int4: 4-bit groups of 32 with a scale and zero, as Q4_1 (the head int8)
_KV_TYPE_BY_CACHE = {"contiguous": "f32", "paged": "f32", "window": "f32", "int8": "q8_0"}


@dataclass
class Predictor:
    """Wraps the performance model for one runtime model on one device; `available` False means no predictions."""

    spec: Any = None  # the ModelSpec of the GGUF
    machine: Any = None  # the Machine it runs on
    quant: str = "F32"
    gpu: bool = False
    note: str = ""
    speed_model_name: str = "lesson"

    @property
    def available(self) -> bool:
        return self.spec is not None and self.machine is not None

    @classmethod
    def for_model(cls, model, device, machine=None) -> "Predictor":
        path = getattr(model, "path", "")
        quant = _QUANT_BY_DTYPE.get(getattr(model, "weight_dtype_name", "float32"), "F32")
        if not path:
            return cls(note=f"no prediction: {type(model).__name__} is not read from a GGUF")
        try:
            from ..models.gguf_reader import model_from_gguf

            spec = model_from_gguf(path)
        except InferlabError as exc:  # a file the reader cannot describe must not stop a measurement
            return cls(note=f"no prediction: the GGUF reader could not describe the file ({exc})")
        if machine is None:
            try:
                from ..hardware.detect import detect_machine

                machine = detect_machine()
            except InferlabError as exc:
                return cls(spec=spec, note=f"no prediction: machine detection failed ({exc})")
        gpu = getattr(device, "type", "cpu") == "cuda"
        return cls(spec=spec, machine=machine, quant=quant, gpu=gpu,
                   note=f"the performance model (bandwidth-only speed model) for {quant} weights on {machine.gpu.name if gpu and machine.gpu else machine.ram.name}")

    def _placement(self, n_ctx: int, cache_kind: str, batch: int):
        from ..perf.placement import place

        n_gpu_layers = (self.spec.n_layers + 1) if self.gpu else 0
        return place(self.spec, self.machine, self.quant, n_ctx=max(n_ctx, 1), kv_type=_KV_TYPE_BY_CACHE.get(cache_kind, "f32"),
                     n_gpu_layers=n_gpu_layers, n_seq=batch, order="first-blocks")

    def decode_step_s(self, context: int, batch: int = 1, cache_kind: str = "contiguous", window: int | None = None) -> float | None:
        if not self.available:
            return None
        from ..perf.speed import decode_step_time

        ctx = min(context, window) if window else context  # a window reads at most W cached tokens
        placement = self._placement(context + 1, cache_kind, batch)
        return decode_step_time(placement, self.machine, ctx, batch=batch)["total_s"]

    def prefill_s(self, n_tokens: int, batch: int = 1, cache_kind: str = "contiguous") -> float | None:
        if not self.available:
            return None
        from ..perf.speed import prefill_time

        placement = self._placement(n_tokens, cache_kind, batch)
        return prefill_time(placement, self.machine, n_tokens * batch)["total_s"]

    def naive_mean_step_s(self, context: int, n_new_tokens: int, batch: int = 1) -> float | None:
        """Naive generation re-runs a prefill of the whole sequence every step."""
        if not self.available:
            return None
        return statistics.fmean(self.prefill_s(context + i, batch) or 0.0 for i in range(n_new_tokens))

    def decode_bytes_per_step(self, context: int, batch: int = 1, cache_kind: str = "contiguous") -> float | None:
        if not self.available:
            return None
        from ..perf.speed import decode_step_time

        placement = self._placement(context + 1, cache_kind, batch)
        return sum(p["bytes"] for p in decode_step_time(placement, self.machine, context, batch=batch)["per_device"])


def relative_error(measured: float | None, predicted: float | None) -> float | None:
    """(predicted - measured) / measured: +0.25 means the model predicts 25 % too slow."""
    if measured is None or predicted is None or measured <= 0:
        return None
    return (predicted - measured) / measured

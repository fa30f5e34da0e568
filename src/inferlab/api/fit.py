"""``fit(model, machine, ...) -> FitReport``: does it fit, where do the bytes live, how fast.

The report holds the placement per device (the memory bars), decode and prefill with their
per-device time breakdown, the bottleneck in words, the speed model used, and where every input
figure came from. A configuration that does not fit gets no speed: it would not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..hardware.device import Device
from ..models.spec import ModelSpec
from ..perf.speed import SpeedModel, decode_step_time, prefill_time
from ..quant.plan import effective_bpw, weight_bytes
from .report import Figure, Report
from .setup import Setup, configure

DEFAULT_DECODE_CONTEXT_MAX = 4096  # report decode at half the context, at most this many tokens
DEFAULT_PROMPT_TOKENS = 512  # the prefill estimate's prompt unless one is given (at most -c)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's share of the configuration (a memory bar)."""

    name: str
    kind: str  # "gpu" or "cpu"
    n_blocks: int
    output_head: bool
    weights_bytes: float
    kv_bytes: float
    compute_bytes: float  # compute buffers (activations of one micro-batch)
    total_bytes: float
    capacity_bytes: float  # what the engine may use on it
    used_fraction: float


@dataclass(frozen=True)
class DecodeDeviceTime:
    """One device's part of a decode step (devices run one after another: layer split)."""

    device: str
    kind: str
    s: float
    weights_bytes: float  # weights read this step
    kv_bytes: float  # cached K/V read this step (every sequence its own)
    memory_s: float
    compute_s: float
    overhead_s: float  # fixed per-block cost (kernel launches, graph, barriers)
    bound: str  # "memory", "compute" or "cpu-kernels"


@dataclass(frozen=True)
class DecodeReport:
    context_tokens: int
    batch: int
    tok_per_s: float  # generated tokens per second, all sequences
    step_s: float
    cpu_s: float
    gpu_s: float
    cpu_share: float
    bound: str
    bottleneck: str
    per_device: tuple[DecodeDeviceTime, ...]


@dataclass(frozen=True)
class PrefillDeviceTime:
    device: str  # whose layers
    runs_on: str  # where they compute (a GPU when op offload moves CPU layers' matmuls there)
    s: float
    compute_s: float
    transfer_s: float  # CPU weights crossing PCIe for op offload


@dataclass(frozen=True)
class PrefillReport:
    n_tokens: int
    tok_per_s: float
    s: float
    pcie_s: float
    cpu_s: float
    gpu_s: float
    per_device: tuple[PrefillDeviceTime, ...]


@dataclass(frozen=True)
class FileFacts:
    """What the model file's header says (GGUF sources only)."""

    path: str | None
    n_files: int
    file_bytes: int | None
    tensor_types: dict[str, int]
    n_ctx_train: int
    chat_template: bool
    tokenizer: str | None
    n_vocab_tokens: int | None
    imatrix: Any
    vision_bytes: int


@dataclass(frozen=True)
class FitReport(Report):
    model: str
    model_source: str  # catalog id, file path, or what the caller passed
    quant: str  # label: which preset or type, or the file's own tensors
    machine: str
    machine_id: str | None
    fits: bool
    reason: str  # why not, when it does not fit
    n_ctx: int
    ctx_reduced: bool  # --fit shrank an unset context
    kv_type: str
    n_gpu_layers: int
    n_gpu_layers_max: int
    auto_ngl: bool  # chosen by --fit
    weights_bytes: int
    bits_per_weight: float
    devices: tuple[DeviceMemory, ...]
    decode: DecodeReport | None  # None when it does not fit: it would not run
    prefill: PrefillReport | None
    speed_model: str
    order: str  # which layers -ngl moves
    notes: tuple[str, ...]
    file: FileFacts | None
    figures: tuple[Figure, ...]  # every input figure with its origin


def decode_report(setup: Setup, context: int, batch: int = 1, speed: SpeedModel | None = None) -> DecodeReport:
    d = decode_step_time(setup.placement, setup.machine, context, batch, speed or setup.speed)
    per = tuple(DecodeDeviceTime(p["device"], p["kind"], p["s"], p["weights_bytes"], p["kv_bytes"], p["memory_s"],
                                 p["compute_s"], p["overhead_s"], p["bound"]) for p in d["per_device"])
    total = d["total_s"]
    return DecodeReport(context, batch, d["tok_per_s"], total, d["cpu_s"], d["gpu_s"], d["cpu_s"] / total if total else 0.0,
                        d["bound"], d["bottleneck"], per)


def prefill_report(setup: Setup, n_tokens: int, context: int = 0, speed: SpeedModel | None = None) -> PrefillReport:
    f = prefill_time(setup.placement, setup.machine, n_tokens, speed or setup.speed, context)
    per = tuple(PrefillDeviceTime(p["device"], p["where"], p["s"], p["compute_s"], p["transfer_s"]) for p in f["per_device"])
    return PrefillReport(n_tokens, f["tok_per_s"], f["total_s"], f["pcie_s"], f["cpu_s"], f["gpu_s"], per)


def _device_figures(dev: Device, role: str) -> list[Figure]:
    origin = "calibrated" if "calibrated" in dev.source else ("measured" if dev.source.startswith("detected") else "catalog")
    out = [Figure(f"{role} memory", dev.memory_gb, "GB", origin, dev.source),
           Figure(f"{role} bandwidth", dev.bandwidth_gbs, "GB/s", origin, dev.source),
           Figure(f"{role} FP16 throughput", dev.fp16_tflops, "TFLOP/s", origin if not dev.is_cpu else "assumed",
                  dev.source if not dev.is_cpu else (dev.notes or dev.source))]
    if dev.is_cpu and dev.fp32_tflops:
        out.append(Figure(f"{role} FP32 throughput", dev.fp32_tflops, "TFLOP/s", origin, dev.source))
    return out


def _figures(setup: Setup) -> tuple[Figure, ...]:
    spec, m = setup.spec, setup.machine
    x = spec.extra or {}
    if "gguf_version" in x or x.get("hf_config_path") or spec.tensors is not None:
        model_fig = Figure("model dimensions", spec.name, "", "file", str((x.get("split_files") or [x.get("path", "")])[0] or spec.source))
    else:
        model_fig = Figure("model dimensions", spec.name, "", "catalog", spec.source)
    figs = [model_fig]
    for i, g in enumerate(m.gpus):
        figs += _device_figures(g, f"GPU {i}" if len(m.gpus) > 1 else "GPU")
    figs += _device_figures(m.ram, "CPU/RAM")
    if m.gpus and not m.unified:
        figs.append(Figure("PCIe link", m.pcie_gbs, "GB/s", "catalog", m.source))
    sm = setup.speed
    if sm.name == "calibrated":
        from ..perf.calibration import dev_rows, fitted_constants

        for backend, k in fitted_constants().items():
            if k and any(d_.backend == backend for d_ in m.gpus):
                figs.append(Figure(f"decode efficiency η ({backend})", k["eta"], "", "estimated",
                                   f"fitted on {k['n_rows']} of {len(dev_rows())} published llama-bench rows (data/llama_bench_dev.json)"))
                figs.append(Figure(f"per-block decode cost ({backend})", k["layer_overhead_s"], "s", "estimated", "same fit"))
                figs.append(Figure(f"prefill efficiency ε ({backend})", k["eps"], "", "estimated", "same fit"))
        if setup.placement.cpu.n_blocks or setup.placement.cpu.has_output or m.cpu_only:
            from ..perf.cpu_model import attached_rates, rate_provenance, reference_for

            ref = reference_for(m.ram)
            types = {e.ggml_type for e in _cpu_tensor_types(setup)}
            how = "; ".join(rate_provenance(m.ram, types))
            if attached_rates(m.ram) is not None:  # this machine's own profile (calibrate)
                figs.append(Figure("CPU kernel rates (llama.cpp, per ggml type)", ref.get("id", ""), "", "calibrated", how))
            else:
                figs.append(Figure("CPU kernel rates (llama.cpp, per ggml type)", ref.get("id", ""), "", "catalog",
                                   f"{how} (data/cpu_limits.json)"))
    else:
        figs.append(Figure("decode efficiency η", sm.decode_bw_eff, "", "assumed", "the seed lesson's constant: 0.7 of peak bandwidth"))
        figs.append(Figure("prefill efficiency ε", sm.prefill_compute_eff, "", "assumed", "the seed lesson's constant: 50 % of peak FP16"))
    return tuple(figs)


def _cpu_tensor_types(setup: Setup):
    """The tensors of the placement's CPU-resident blocks (their ggml types pick the CPU rates)."""
    from ..quant.plan import tensor_plan

    p = setup.placement
    first_gpu_block = p.cpu.n_blocks
    return [e for e in tensor_plan(setup.spec, setup.scheme) if (e.layer is not None and e.layer < first_gpu_block)
            or (e.layer is None and (p.cpu.has_output or not e.name.startswith("output")))]


def _file_facts(spec: ModelSpec) -> FileFacts | None:
    x = spec.extra or {}
    if "gguf_version" not in x:
        return None
    return FileFacts(path=(x.get("split_files") or [None])[0], n_files=len(x.get("split_files") or []), file_bytes=x.get("file_bytes"),
                     tensor_types=dict(x.get("tensor_types") or {}), n_ctx_train=spec.n_ctx_train, chat_template=bool(x.get("chat_template")),
                     tokenizer=x.get("tokenizer_model"), n_vocab_tokens=x.get("n_vocab_tokens"), imatrix=x.get("imatrix"),
                     vision_bytes=x.get("vision_bytes", 0) + (x.get("mmproj") or {}).get("n_bytes", 0))


def fit_report(setup: Setup, *, context: int | None = None, n_prompt: int | None = None, source: str = "") -> FitReport:
    """The FitReport of an already resolved configuration; ``n_prompt`` None: 512 tokens, or -c if
    it is shorter."""
    from ..errors import InvalidValueError, check_positive

    p, spec = setup.placement, setup.spec
    if n_prompt is None:
        n_prompt = min(DEFAULT_PROMPT_TOKENS, p.n_ctx)
    check_positive("n_prompt", n_prompt)
    if isinstance(n_prompt, float):
        raise InvalidValueError(f"n_prompt must be an integer number of tokens, got {n_prompt!r}")
    if n_prompt > p.n_ctx:  # llama.cpp: "the request exceeds the available context size"
        raise InvalidValueError(f"a prompt of {n_prompt:,} tokens is longer than the context -c {p.n_ctx:,}; "
                                "raise --ctx or shorten --prompt")
    if context is not None:
        from ..perf.speed import check_kv_room

        check_kv_room(p, context, 1)  # a context beyond the allocated -c is refused with the numbers, not clipped
    ctx_at = min(context if context is not None else min(p.n_ctx // 2, DEFAULT_DECODE_CONTEXT_MAX), p.n_ctx)
    dec = decode_report(setup, ctx_at) if p.fits else None
    pre = prefill_report(setup, n_prompt) if p.fits else None
    wb = weight_bytes(spec, setup.scheme)
    qlabel = setup.scheme.label if setup.scheme is not None else f"the file's own tensors ({spec.file_type or 'mixed'})"
    devices = tuple(DeviceMemory(d.name, d.kind, d.n_blocks, d.has_output, d.weights_bytes, d.kv_bytes, d.compute_bytes, d.total_bytes,
                                 d.capacity_bytes, d.total_bytes / d.capacity_bytes if d.capacity_bytes else 0.0) for d in p.devices)
    return FitReport(
        model=spec.name, model_source=source or spec.name, quant=qlabel, machine=setup.machine.name, machine_id=setup.machine_id,
        fits=p.fits, reason=p.reason, n_ctx=p.n_ctx, ctx_reduced=p.ctx_reduced, kv_type=setup.kv_type,
        n_gpu_layers=p.n_gpu_layers, n_gpu_layers_max=spec.n_layers + 1, auto_ngl=p.auto, weights_bytes=wb["total"],
        bits_per_weight=effective_bpw(spec, setup.scheme), devices=devices, decode=dec, prefill=pre, speed_model=setup.speed.name,
        order=setup.order, notes=tuple(p.notes), file=_file_facts(spec), figures=_figures(setup))


def fit(model: ModelSpec | str, machine: Any, *, quant: Any = None, n_ctx: int | None = None, kv_type: str = "f16",
        n_gpu_layers: int | None = None, n_cpu_moe: int = 0, context: int | None = None, n_prompt: int | None = None,
        speed: str | SpeedModel = "calibrated", order: str = "llama.cpp", bare: str = "preset", profile: bool = True,
        flash_attn: str = "auto") -> FitReport:
    """Does ``model`` fit on ``machine``, where do its bytes live, how fast will it decode and prefill?

    ``model``: a ModelSpec or a source (catalog id, .gguf, HF folder or config.json, cached org/name);
    ``machine``: a Machine, a catalog key or "local". ``quant``: None (the file's own tensors, or
    Q4_K_M), a preset or a GGML type (``bare`` says how a bare name reads, see setup.read_quant).
    ``n_ctx`` None or 0: the trained context, shrunk by --fit; ``n_gpu_layers`` None: chosen by --fit.
    ``flash_attn``: -fa auto|on|off (a quantized V cache is refused with off, as llama.cpp does).
    ``context``: cached tokens at which decode is reported (default half of n_ctx, at most 4096).
    """
    setup = configure(model, machine, quant=quant, n_ctx=n_ctx, kv_type=kv_type, n_gpu_layers=n_gpu_layers, n_cpu_moe=n_cpu_moe,
                      speed=speed, order=order, bare=bare, profile=profile, flash_attn=flash_attn)
    return fit_report(setup, context=context, n_prompt=n_prompt, source=model if isinstance(model, str) else "")

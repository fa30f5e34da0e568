"""Exact server command lines for llama.cpp, vLLM and SGLang, each checked against the engine's argument table."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from ..models.spec import ModelSpec
from .flags import PROGRAMS, flag_table, parse_command


@dataclass(frozen=True)
class EngineCommand:
    engine: str
    argv: tuple[str, ...]
    text: str  # shell-quoted
    engine_version: str  # the argument table it was checked against
    reports: tuple[str, ...]  # what the engine will log / the figures it will report
    notes: tuple[str, ...] = ()


def _checked(engine: str, argv: list[str], reports=(), notes=()) -> EngineCommand:
    parse_command(engine, argv)  # raises if any flag or value is not in the engine's own table
    return EngineCommand(engine, tuple(argv), shlex.join(argv), flag_table(engine).version, tuple(reports), tuple(notes))


def gguf_name(spec: ModelSpec, quant_label: str) -> str:
    path = (spec.extra or {}).get("path")
    if path:
        return str(path)
    base = (spec.hf_id.split("/")[-1] if spec.hf_id else spec.name.replace(" ", "-"))
    q = quant_label.split()[0].replace("preset:", "").replace("type:", "")
    return f"{base}-{q}.gguf"


def hf_name(spec: ModelSpec) -> str:
    return spec.hf_id or spec.name


# llama.cpp common/common.h LLM_FFN_EXPS_REGEX: the routed-expert tensors --cpu-moe / --n-cpu-moe keep in RAM
LLM_FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def experts_ot_pattern(n_blocks: int | None) -> str:
    """-ot pattern that keeps the routed experts of blocks 0 … n-1 in RAM: one alternation of what --n-cpu-moe n
    writes (llm_add_n_cpu_ffn_overrides: "blk\\.%d" + LLM_FFN_EXPS_REGEX per block); None: every block (--cpu-moe)."""
    if n_blocks is None:
        return LLM_FFN_EXPS_REGEX + "=CPU"
    return f"blk\\.({'|'.join(str(i) for i in range(n_blocks))}){LLM_FFN_EXPS_REGEX}=CPU"


def llama_server(spec: ModelSpec, quant_label: str, *, n_gpu_layers: int | None = None, ctx: int | None = None,
                 kv_type: str = "f16", flash_attn: str | None = None, n_parallel: int | None = None, kv_unified: bool = False,
                 n_cpu_moe: int = 0, override_tensor: str | None = None, cpu_moe: bool = False, ubatch: int | None = None,
                 threads: int | None = None, lora: tuple[str, ...] = (), draft: str | None = None, draft_n_max: int | None = None,
                 context_shift: bool = False, reports=(), notes=()) -> EngineCommand:
    argv = [*PROGRAMS["llamacpp"], "-m", gguf_name(spec, quant_label)]
    if n_gpu_layers is not None:
        argv += ["-ngl", str(n_gpu_layers)]
    if ctx is not None:
        argv += ["-c", str(ctx)]
    if kv_type != "f16":
        argv += ["-ctk", kv_type, "-ctv", kv_type]
        flash_attn = flash_attn or "on"  # a quantized V cache needs flash attention
    if flash_attn:
        argv += ["-fa", flash_attn]
    if n_parallel is not None:
        argv += ["-np", str(n_parallel)]
        if kv_unified:
            argv.append("-kvu")
    if context_shift:
        argv.append("--context-shift")
    if cpu_moe:
        argv.append("--cpu-moe")
    elif override_tensor:
        argv += ["-ot", override_tensor]
    elif n_cpu_moe:
        argv += ["--n-cpu-moe", str(n_cpu_moe)]
    if ubatch is not None:
        argv += ["-ub", str(ubatch)]
    if threads is not None:
        argv += ["-t", str(threads)]
    for a in lora:
        argv += ["--lora", a]
    if draft:
        argv += ["-md", draft]
        if draft_n_max is not None:
            argv += ["--spec-draft-n-max", str(draft_n_max)]
    return _checked("llamacpp", argv, reports, notes)


def vllm_serve(spec: ModelSpec, *, gpu_memory_utilization: float | None = None, max_model_len: int | None = None,
               kv_cache_dtype: str = "auto", max_num_seqs: int | None = None, quantization: str | None = None, tp: int = 1,
               enable_lora: bool = False, max_loras: int | None = None, max_lora_rank: int | None = None,
               lora_modules: tuple[str, ...] = (), speculative: dict | None = None, enforce_eager: bool = False,
               reports=(), notes=()) -> EngineCommand:
    argv = [*PROGRAMS["vllm"], hf_name(spec)]
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    if quantization:
        argv += ["--quantization", quantization]
    if tp != 1:
        argv += ["-tp", str(tp)]
    if enforce_eager:
        argv.append("--enforce-eager")
    if enable_lora:
        argv.append("--enable-lora")
        if max_loras is not None:
            argv += ["--max-loras", str(max_loras)]
        if max_lora_rank is not None:
            argv += ["--max-lora-rank", str(max_lora_rank)]
        if lora_modules:
            argv += ["--lora-modules", *lora_modules]
    if speculative:
        argv += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
    return _checked("vllm", argv, reports, notes)


def sglang_server(spec: ModelSpec, *, mem_fraction_static: float | None = None, context_length: int | None = None,
                  schedule_policy: str | None = None, kv_cache_dtype: str = "auto", quantization: str | None = None, tp: int = 1,
                  max_running_requests: int | None = None, lora_paths: tuple[str, ...] = (), max_loras_per_batch: int | None = None,
                  speculative_algorithm: str | None = None, draft_model: str | None = None, reports=(), notes=()) -> EngineCommand:
    argv = [*PROGRAMS["sglang"], "--model-path", hf_name(spec)]
    if mem_fraction_static is not None:
        argv += ["--mem-fraction-static", f"{mem_fraction_static:g}"]
    if context_length is not None:
        argv += ["--context-length", str(context_length)]
    if schedule_policy:
        argv += ["--schedule-policy", schedule_policy]
    if kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    if quantization:
        argv += ["--quantization", quantization]
    if tp != 1:
        argv += ["--tp-size", str(tp)]
    if max_running_requests is not None:
        argv += ["--max-running-requests", str(max_running_requests)]
    if lora_paths:
        argv += ["--enable-lora", "--lora-paths", *lora_paths]
        if max_loras_per_batch is not None:
            argv += ["--max-loras-per-batch", str(max_loras_per_batch)]
    if speculative_algorithm:
        argv += ["--speculative-algorithm", speculative_algorithm]
        if draft_model:
            argv += ["--speculative-draft-model-path", draft_model]
    return _checked("sglang", argv, reports, notes)

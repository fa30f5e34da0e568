"""``advise(model, machine, users=..., ctx=..., shared_prefix=...) -> AdviceReport``: which engine, which command.

The lesson's recipes ("Tuning Recipes for Consumer Hardware"), decided on the placement and speed
model: one user and the model fits (llama.cpp, everything on the GPU, -c what you use); one user and
it does not (llama.cpp, placements ranked by predicted tokens/s, --n-cpu-moe for MoE); Apple
silicon (llama.cpp with Metal, unified memory); CPU only (llama.cpp, -t physical cores); several
users on a GPU that holds the model (vLLM; SGLang with --schedule-policy lpm when requests share a
prefix). Every command is checked against the engine's own argument table; each carries the
figures the engine will report at startup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..kv.pool import engine_kv_type, llamacpp_max_sessions, sglang_pool, vllm_pool
from ..advise.commands import EngineCommand, llama_server, sglang_server, vllm_serve
from ..advise.lora import LoraCost, lora_cost
from ..advise.rank import RankedPlacement, rank_placements
from ..advise.speculative import SpeculativeEstimate, speculative_estimate
from ..errors import InvalidValueError, NotSupportedError, check_positive
from ..perf.placement import GB, place
from ..perf.speed import decode_step_time
from ..quant.plan import effective_bpw
from .report import Report
from .setup import configure

DEFAULT_CTX = 8192
VLLM_UTIL = 0.9  # below the 0.92 default: headroom for a desktop on the same GPU (the lesson's pitfall 7)
RECIPES = {
    "fits-one-user": "One user, model fits in VRAM: any engine works, llama.cpp is the simplest; everything on the GPU, "
                     "flash attention on, -c what you use",
    "larger-than-vram": "One user, model larger than VRAM: llama.cpp; trade context for layers (q8_0 KV), "
                        "--n-cpu-moe for MoE; decode speed is set by system RAM",
    "apple": "Apple silicon: llama.cpp with Metal on unified memory; no offload decision, the limit is the GPU's working set",
    "cpu-only": "CPU only: llama.cpp, physical cores only (-t), decode = RAM bandwidth / model bytes",
    "many-users": "Several users, model fits in VRAM: vLLM or SGLang; --max-model-len what the workload needs, fp8 KV if "
                  "quality allows, headroom for the desktop",
    "shared-prefix": "Several users sharing long prefixes: SGLang with --schedule-policy lpm reuses them at token granularity",
    "many-users-offload": "Several users, model larger than VRAM: only llama.cpp offloads layers; -np slots share -c",
}


@dataclass(frozen=True)
class EngineAdvice:
    engine: str
    command: EngineCommand
    tok_per_s: float | None  # one stream's decode speed, predicted
    aggregate_tok_per_s: float | None  # all users decoding together
    sessions: int | None  # sessions of ctx tokens the engine's pool holds
    reports: tuple[str, ...]


@dataclass(frozen=True)
class AdviceReport(Report):
    model: str
    machine: str
    users: int
    ctx: int
    shared_prefix_tokens: int
    recipe: str
    recipe_text: str
    engine: str  # the one the recipe picks
    reasons: tuple[str, ...]
    fits_on_gpu: bool  # every layer and the cache of ctx tokens on the GPU
    engines: tuple[EngineAdvice, ...]  # the chosen engine first
    fit_default: RankedPlacement | None  # llama.cpp's --fit, when the model does not fit
    placements: tuple[RankedPlacement, ...]  # ranked, when it does not fit
    lora: LoraCost | None
    speculative: SpeculativeEstimate | None
    notes: tuple[str, ...]


def _serving_quant(bpw: float) -> tuple[str | None, str]:
    if bpw >= 15:
        return None, "a 16-bit Hugging Face checkpoint"
    if bpw >= 7.5:
        return "fp8", "an FP8 checkpoint (about the size of Q8_0): pass that checkpoint's repository as the model"
    return "awq", "an AWQ 4-bit checkpoint (about the size of this GGUF): pass that checkpoint's repository as the model"


ADAPTER = "my-adapter"  # the adapter's name and path placeholders in the emitted commands


def _with_extras(e: EngineAdvice, spec, lora_rank: int | None, draft: Any, quant_label: str) -> EngineAdvice:
    """The same command with the engine's LoRA flags (vLLM --enable-lora --max-lora-rank, llama.cpp --lora, SGLang
    --lora-paths) and its draft-model flags (llama.cpp -md, vLLM --speculative-config, SGLang STANDALONE)."""
    import json as _json

    from ..advise.commands import _checked, gguf_name, hf_name
    from ..advise.lora import _vllm_rank
    from ..advise.speculative import LLAMACPP_DRAFT_N_MAX
    from ..models.resolve import resolve_model

    argv = list(e.command.argv)
    dspec = resolve_model(draft) if draft is not None else None
    if e.engine == "llamacpp":
        if lora_rank is not None:
            argv += ["--lora", f"{ADAPTER}.gguf"]
        if dspec is not None:
            argv += ["-md", gguf_name(dspec, quant_label),  # the draft in the target's quantization, as the estimate prices it
                      "--spec-draft-n-max", str(LLAMACPP_DRAFT_N_MAX)]
    elif e.engine == "vllm":
        if lora_rank is not None:
            argv += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(_vllm_rank(lora_rank)), "--lora-modules", f"{ADAPTER}=./{ADAPTER}"]
        if dspec is not None:
            argv += ["--speculative-config", _json.dumps({"method": "draft_model", "model": hf_name(dspec),
                                                          "num_speculative_tokens": LLAMACPP_DRAFT_N_MAX}, separators=(",", ":"))]
    else:
        if lora_rank is not None:
            argv += ["--enable-lora", "--lora-paths", f"{ADAPTER}=./{ADAPTER}", "--max-lora-rank", str(lora_rank)]
        if dspec is not None:
            argv += ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", hf_name(dspec),
                     "--speculative-num-draft-tokens", str(LLAMACPP_DRAFT_N_MAX + 1)]
    cmd = _checked(e.engine, argv, e.command.reports, e.command.notes)
    return EngineAdvice(e.engine, cmd, e.tok_per_s, e.aggregate_tok_per_s, e.sessions, e.reports)


def advise(model: Any, machine: Any, *, users: int = 1, ctx: int | None = None, shared_prefix: int = 0, quant: Any = None,
           lora_rank: int | None = None, draft: Any = None, acceptance_rate: float = 0.7, top: int = 3, speed: str = "calibrated") -> AdviceReport:
    check_positive("users", users)
    if not isinstance(users, int) or isinstance(users, bool):
        raise InvalidValueError(f"users must be an integer, got {users!r}")
    check_positive("shared_prefix", shared_prefix, allow_zero=True)
    probe = configure(model, machine, quant=quant, n_ctx=min(DEFAULT_CTX, 4096), speed=speed, profile=False)
    spec = probe.spec
    n_ctx = ctx if ctx else min(DEFAULT_CTX, spec.n_ctx_train) if ctx is None else spec.n_ctx_train  # 0: the trained length, as -c 0
    check_positive("ctx", n_ctx)
    if shared_prefix > n_ctx:
        raise InvalidValueError(f"shared prefix ({shared_prefix} tokens) is longer than the context ({n_ctx} tokens)")
    L = spec.n_layers
    m = probe.machine
    setup = configure(spec, m, quant=probe.scheme, n_ctx=n_ctx * (users if users > 1 else 1), speed=speed, profile=False)
    full = place(spec, m, setup.scheme, n_ctx, "f16", L + 1) if m.gpus else None
    fits = bool(full is not None and full.fits)
    notes, reasons = [], []
    if n_ctx > spec.n_ctx_train:
        notes.append(f"{n_ctx:,} tokens is beyond {spec.name}'s trained {spec.n_ctx_train:,}: RoPE scaling, quality may drop")
    qlabel = setup.scheme.label if setup.scheme is not None else (spec.file_type or "file")
    if m.cpu_only:
        recipe = "cpu-only"
    elif m.unified:
        recipe = "apple"
    elif users == 1:
        recipe = "fits-one-user" if fits else "larger-than-vram"
    elif fits:
        recipe = "shared-prefix" if shared_prefix > 0 else "many-users"
    else:
        recipe = "many-users-offload"
    engines: list[EngineAdvice] = []
    fit_default, ranked = None, ()
    if recipe in ("cpu-only", "apple"):
        cores = m.ram.n_cores
        ngl = L + 1 if m.unified else None
        np_ = users if users > 1 else None
        p = place(spec, m, setup.scheme, n_ctx * (users if users > 1 else 1), "f16", ngl if m.unified else 0)
        if not p.fits:
            notes.append(p.reason)
        d = decode_step_time(p, m, max(1, n_ctx // 2), 1, setup.speed) if p.fits else None
        cmd = llama_server(spec, qlabel, n_gpu_layers=ngl, ctx=n_ctx * (users if users > 1 else 1), flash_attn="on" if m.unified else None,
                           n_parallel=np_, kv_unified=bool(np_), threads=cores if m.cpu_only else None,
                           reports=(f"n_ctx = {p.n_ctx}",))
        engines.append(EngineAdvice("llamacpp", cmd, d["tok_per_s"] if d else None, None, users, cmd.reports))
        reasons.append("vLLM and SGLang " + ("need a GPU" if m.cpu_only else "run on Apple silicon only through experimental / MLX paths"))
        if m.cpu_only and cores:
            reasons.append(f"-t {cores}: the physical cores; more threads contend for the same memory bus")
        chosen = "llamacpp"
    elif recipe in ("larger-than-vram", "many-users-offload"):
        total_ctx = n_ctx * users  # -np users slots share -c: rank the placement that holds all of them
        rsetup = configure(spec, m, quant=setup.scheme, n_ctx=total_ctx, speed=speed, profile=False)
        fit_default, ranked = rank_placements(rsetup, total_ctx, top=top)[:2]
        chosen = "llamacpp"
        if ranked:
            best = ranked[0]
            cmd = best.command
            agg = None
            if users > 1:
                cmd = llama_server(spec, qlabel, n_gpu_layers=best.n_gpu_layers, ctx=total_ctx, kv_type=best.kv_type,
                                   n_parallel=users, kv_unified=True, n_cpu_moe=best.n_cpu_moe)
                bp = place(spec, m, setup.scheme, total_ctx, best.kv_type, best.n_gpu_layers, n_cpu_moe=best.n_cpu_moe)
                agg = decode_step_time(bp, m, max(1, n_ctx // 2), users, setup.speed)["tok_per_s"]
            one = best.tok_per_s if users == 1 else decode_step_time(bp, m, max(1, n_ctx // 2), 1, setup.speed)["tok_per_s"]
            engines.append(EngineAdvice("llamacpp", cmd, one, agg, users, (f"-ngl {best.n_gpu_layers}: "
                                        f"{best.gpu_bytes / GB:.1f} GB on the GPU, {best.cpu_share:.0%} of each step on the CPU",)))
            reasons.append(f"the best placement predicts {best.tok_per_s:.1f} tok/s against {fit_default.tok_per_s:.1f} "
                           f"for llama.cpp's --fit default (-ngl {fit_default.n_gpu_layers})")
        else:
            notes.append(f"no placement of {spec.name} {qlabel} with a {total_ctx:,}-token context fits this machine: "
                         + (place(spec, m, setup.scheme, total_ctx, 'f16', None).reason or "") + "; a smaller quantization or more RAM would")
        reasons.append("vLLM and SGLang do not offload layers: their --cpu-offload-gb streams weights over PCIe every pass")
        if spec.is_moe:
            reasons.append("MoE: attention and shared weights stay on the GPU, experts of the first blocks go to RAM (--n-cpu-moe)")
    else:
        chosen = "sglang" if recipe == "shared-prefix" else ("llamacpp" if recipe == "fits-one-user" else "vllm")
        assert full is not None  # these recipes need `fits`, which needs the full-offload placement
        d = decode_step_time(full, m, max(1, n_ctx // 2), 1, setup.speed)
        cmd = llama_server(spec, qlabel, n_gpu_layers=L + 1, ctx=n_ctx * users, flash_attn="on",
                           n_parallel=users if users > 1 else None, kv_unified=users > 1)
        lp = place(spec, m, setup.scheme, n_ctx * users, "f16", L + 1)
        agg = decode_step_time(lp, m, max(1, n_ctx // 2), users, setup.speed)["tok_per_s"] if lp.fits else None
        if not lp.fits:
            notes.append(f"llama.cpp: {users} slots of {n_ctx:,} tokens do not fit with every layer on the GPU "
                         f"({llamacpp_max_sessions(spec, m, setup.scheme, 'f16', n_ctx)} do)")
        engines.append(EngineAdvice("llamacpp", cmd, d["tok_per_s"], agg, llamacpp_max_sessions(spec, m, setup.scheme, "f16", n_ctx),
                                    (f"-ngl {L + 1}: all {L} blocks and the output layer on the GPU",)))
        bpw = effective_bpw(spec, setup.scheme)
        qflag, qwhat = _serving_quant(bpw)
        kv = "fp8" if users > 1 else "auto"
        vp = vllm_pool(spec, m, setup.scheme, kv, n_ctx, gpu_memory_utilization=VLLM_UTIL)
        vcmd = vllm_serve(spec, gpu_memory_utilization=VLLM_UTIL, max_model_len=n_ctx, kv_cache_dtype=kv, quantization=qflag,
                          max_num_seqs=max(users, 1) if users > 1 else None, reports=(vp.log_line,),
                          notes=(f"loads {qwhat}",))
        sk = engine_kv_type("sglang", "fp8") if users > 1 else "auto"
        if sk is None:  # kv/pool.KV_ALIASES names it (fp8_e4m3)
            raise NotSupportedError("SGLang has no fp8 KV cache type in kv.pool.KV_ALIASES; add its --kv-cache-dtype name there")
        sp = sglang_pool(spec, m, setup.scheme, sk, context_length=n_ctx)
        scmd = sglang_server(spec, mem_fraction_static=round(sp.mem_fraction_static, 2), context_length=n_ctx,
                             schedule_policy="lpm" if shared_prefix > 0 else None, kv_cache_dtype=sk, quantization=qflag,
                             reports=(sp.log_line,), notes=(f"loads {qwhat}",))
        vs, ss = int(vp.max_concurrency), sp.max_total_num_tokens // n_ctx
        agg_v = decode_step_time(full, m, max(1, n_ctx // 2), max(1, min(users, vs)), setup.speed)["tok_per_s"] if vs else None
        agg_s = decode_step_time(full, m, max(1, n_ctx // 2), max(1, min(users, ss)), setup.speed)["tok_per_s"] if ss else None
        engines.append(EngineAdvice("vllm", vcmd, d["tok_per_s"], agg_v, vs, vcmd.reports))
        engines.append(EngineAdvice("sglang", scmd, d["tok_per_s"], agg_s, ss, scmd.reports))
        engines.sort(key=lambda e: e.engine != chosen)
        if users == 1:
            reasons.append("one stream: every engine is bound by the same weight bytes over VRAM bandwidth; llama.cpp is the simplest")
        else:
            reasons.append(f"{users} users: continuous batching turns the idle arithmetic of decode into throughput")
            if shared_prefix > 0:
                reasons.append(f"{shared_prefix:,} shared prefix tokens: RadixAttention reuses them at token granularity "
                               "(vLLM only in whole 16-token blocks)")
            if vs < users:
                notes.append(f"vLLM's pool holds {vs} sessions of {n_ctx:,} tokens, fewer than {users}: requests will queue or be preempted")
    if (lora_rank is not None or (draft is not None and fits)) and engines:
        engines = [_with_extras(e, spec, lora_rank, draft if fits else None, qlabel) for e in engines]
    base_s = engines[0].tok_per_s if engines and engines[0].tok_per_s else None
    lc = lora_cost(setup, 1.0 / base_s, lora_rank) if lora_rank is not None and base_s else None
    if lc is not None and any(e.engine == "vllm" for e in engines):
        notes.append(f"vLLM preallocates its LoRA slots ({lc.vllm_reserved_bytes / 1e6:.0f} MB for --max-loras 1) out of the KV pool")
    if lora_rank is not None and base_s is None:
        notes.append("no LoRA estimate: the configuration does not run")
    sp_est = None
    if draft is not None and fits:
        ssetup = configure(spec, m, quant=setup.scheme, n_ctx=n_ctx, n_gpu_layers=L + 1, speed=speed, profile=False)
        sp_est = speculative_estimate(ssetup, draft, max(1, n_ctx // 2), acceptance_rate=acceptance_rate)
    elif draft is not None:
        notes.append("speculative decoding needs the target on the GPU with room for the draft; this model does not fit")
    return AdviceReport(spec.name, m.name, users, n_ctx, shared_prefix, recipe, RECIPES[recipe], chosen, tuple(reasons), fits,
                        tuple(engines), fit_default, tuple(ranked), lc, sp_est, tuple(notes))

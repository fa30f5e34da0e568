"""``diagnose(model, machine, flags=..., observed_tok_s=..., error=...) -> DiagnosisReport``.

Reads the engine flags a user runs with (checked against the engine's argument table), places the
configuration as the engine would, and names the lesson's symptom-table rows that apply, each with
its fix and the fix's predicted effect, computed by the same placement and speed functions
("q8_0 KV: -ngl 34 → 43, 14.3 → 20.5 tok/s").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..kv.pool import vllm_pool
from ..advise.diagnose import SYMPTOMS, rows_for_error
from ..advise.flags import PROGRAMS, parse_command
from ..advise.rank import rank_placements
from ..errors import InvalidValueError, check_positive
from ..perf.placement import GB, Placement, place
from ..perf.speed import decode_step_time, prefill_time
from .report import Report
from .setup import configure

SLOW_RATIO = 0.5  # observed below half the prediction: something the configuration does not explain
LONG_TTFT_S = 2.0


@dataclass(frozen=True)
class Finding:
    row: str  # the symptom-table row id
    symptom: str
    cause: str
    fix: str
    evidence: str  # what in this configuration points at it
    effects: tuple[str, ...]  # each fix's predicted effect


@dataclass(frozen=True)
class DiagnosisReport(Report):
    model: str
    machine: str
    engine: str
    command: str
    n_gpu_layers: int
    n_ctx: int
    kv_type: str
    n_parallel: int
    fits: bool
    reason: str
    predicted_tok_per_s: float | None
    predicted_ttft_s: float | None
    observed_tok_per_s: float | None
    observed_ttft_s: float | None
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]


def _int(flags: dict[str, Any], key: str, default: Any) -> Any:
    v = flags.get(key)
    if v is None:
        return default
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise InvalidValueError(f"{key} must be an integer, got {v!r}") from None
    if n < 0 and key != "-ngl":  # counts and sizes; -ngl is read below as llama.cpp reads it
        raise InvalidValueError(f"{key} must be >= 0, got {n}")
    return n


def _float(flags: dict[str, Any], key: str, default: Any) -> Any:
    v = flags.get(key)
    if v is None:
        return default
    try:
        return float(v)
    except (TypeError, ValueError):
        raise InvalidValueError(f"{key} must be a number, got {v!r}") from None


def _tok(p: Placement, setup, ctx_at: int) -> float | None:
    return decode_step_time(p, setup.machine, ctx_at, 1, setup.speed)["tok_per_s"] if p.fits else None


def _fmt(t: float | None) -> str:
    return "does not fit" if t is None else f"{t:.1f} tok/s"


def diagnose(model: Any, machine: Any, *, flags: str | list[str] | None = None, engine: str = "llamacpp", quant: Any = None,
             observed_tok_s: float | None = None, observed_ttft_s: float | None = None, prompt_tokens: int | None = None,
             error: str | None = None, users: int | None = None, speed: str = "calibrated") -> DiagnosisReport:
    """Which row of the lesson's symptom table applies, the fix, and the fix's predicted effect."""
    for name, v in (("observed_tok_s", observed_tok_s), ("observed_ttft_s", observed_ttft_s), ("prompt_tokens", prompt_tokens),
                    ("users", users)):
        if v is not None:
            check_positive(name, v)
    import shlex

    words = shlex.split(flags) if isinstance(flags, str) else list(flags or [])
    if engine not in PROGRAMS:
        from ..errors import UnknownNameError

        raise UnknownNameError("engine", engine, PROGRAMS)
    argv = [*PROGRAMS[engine], *(["MODEL"] if engine == "vllm" else []), *words]
    parsed = parse_command(engine, argv)  # every flag checked against the engine's own table
    probe = configure(model, machine, quant=quant, n_ctx=4096, speed=speed, profile=False)
    spec, m = probe.spec, probe.machine
    L = spec.n_layers
    notes: list[str] = []
    if engine == "llamacpp":
        ctx = _int(parsed, "-c", 0) or spec.n_ctx_train  # -c 0: the trained length
        ngl_flag = parsed.get("-ngl")
        ngl = None if ngl_flag in (None, "auto") else (L + 1 if ngl_flag == "all" else _int(parsed, "-ngl", None))
        kv = str(parsed.get("-ctk", "f16"))
        kv_v = str(parsed.get("-ctv", "f16"))
        fa = str(parsed.get("-fa", "auto"))
        np_ = _int(parsed, "-np", 4)  # llama-server default: auto = 4 slots (the lesson)
        n_cpu_moe = _int(parsed, "-ncmoe", 0) + (L if parsed.get("-cmoe") else 0)
        threads = _int(parsed, "-t", None)
        if kv_v not in ("f16", "f32", "bf16") and fa == "off":
            raise InvalidValueError(f"llama.cpp refuses a quantized V cache (-ctv {kv_v}) with flash attention off (-fa off): "
                                    "use -fa on or auto")
        if n_cpu_moe and not spec.is_moe:
            notes.append(f"--n-cpu-moe does nothing for {spec.name}: it is a dense model with no experts")
            n_cpu_moe = 0
        if ctx > spec.n_ctx_train:
            notes.append(f"-c {ctx:,} is beyond the trained {spec.n_ctx_train:,} tokens (RoPE scaling)")
        user_ctx = _int(parsed, "-c", 0) > 0
        setup = configure(spec, m, quant=probe.scheme, n_ctx=ctx if user_ctx else None, kv_type=kv, n_gpu_layers=ngl,
                          n_cpu_moe=min(n_cpu_moe, L), speed=speed, profile=False)
        p = setup.placement
        ctx = p.n_ctx
    else:
        ctx = _int(parsed, "--max-model-len" if engine == "vllm" else "--context-length", spec.n_ctx_train)
        kv = "f16"
        ngl, np_, threads, n_cpu_moe = L + 1, _int(parsed, "--max-num-seqs", 256), None, 0
        setup = configure(spec, m, quant=probe.scheme, n_ctx=min(ctx, 4096), n_gpu_layers=L + 1 if m.gpus else None, speed=speed,
                          profile=False)
        p = setup.placement
    ctx_at = max(1, min(ctx // 2, 4096)) if prompt_tokens is None else prompt_tokens
    pred = _tok(p, setup, ctx_at)
    n_prompt = prompt_tokens or min(ctx, 2048)
    ttft = prefill_time(p, m, n_prompt, setup.speed)["total_s"] if p.fits else None
    findings: list[Finding] = []

    def add(row: str, evidence: str, effects=()):
        for i, old in enumerate(findings):
            if old.row == row:  # one finding per row: later evidence and fixes join it
                findings[i] = dataclasses.replace(old, evidence=f"{old.evidence}; {evidence}",
                                                  effects=old.effects + tuple(e for e in effects if e not in old.effects))
                return
        s, c, f = SYMPTOMS[row]
        findings.append(Finding(row, s, c, f, evidence, tuple(effects)))

    def variant(**kw) -> Placement:
        args: dict[str, Any] = dict(n_ctx=p.n_ctx, kv_type=p.kv_type, n_gpu_layers=None)
        args.update(kw)
        return place(spec, m, setup.scheme, args["n_ctx"], args["kv_type"], args["n_gpu_layers"], n_cpu_moe=kw.get("n_cpu_moe", 0))

    def effect(label: str, q: Placement) -> str:
        return f"{label}: -ngl {p.n_gpu_layers} → {q.n_gpu_layers}, {_fmt(pred)} → {_fmt(_tok(q, setup, ctx_at))}"

    err_rows = rows_for_error(error) if error else ()
    error_head = error[:120] if error else ""  # quoted in evidence (err_rows is empty without an error)
    # 1. does it load at all
    gpu_short = [d for d in p.gpus if d.free_bytes < 1024 * 2**20]
    if engine == "vllm" and m.gpus:
        util = _float(parsed, "--gpu-memory-utilization", 0.92)
        vp = vllm_pool(spec, m, setup.scheme, str(parsed.get("--kv-cache-dtype", "auto")), ctx, gpu_memory_utilization=util)
        if vp.num_blocks < -(-ctx // 16):
            add("allocation-failure", f"vLLM: {vp.kv_bytes / GB:.2f} GB left for KV after weights and reservations, "
                                      f"{ctx:,}-token requests need {-(-ctx // 16)} blocks, the pool has {vp.num_blocks}",
                (f"--max-model-len {max(16, vp.num_blocks * 16):,}: fits the pool",))
        notes.append(vp.log_line)
    if engine == "sglang" and m.gpus:
        from ..kv.pool import sglang_pool

        frac = parsed.get("--mem-fraction-static")
        sp = sglang_pool(spec, m, setup.scheme, "auto", mem_fraction_static=_float(parsed, "--mem-fraction-static", None) if frac else None,
                         context_length=ctx)
        if sp.max_total_num_tokens < ctx:
            add("allocation-failure", f"SGLang: mem_fraction_static {sp.mem_fraction_static} x {sp.total_bytes / GB:.1f} GB leaves "
                                      f"{max(sp.kv_bytes, 0) / GB:.2f} GB after {sp.weights_bytes / GB:.2f} GB of weights: "
                                      f"{sp.max_total_num_tokens:,} tokens, fewer than one {ctx:,}-token request",
                (f"--context-length {max(sp.max_total_num_tokens, 0):,}", "a smaller (quantized) checkpoint"))
        notes.append(sp.log_line)
    if engine == "vllm" and "allocation-failure" in err_rows and _float(parsed, "--gpu-memory-utilization", 0.92) > 0.85:
        add("allocation-failure", f"error: {error_head}",
            (f"--gpu-memory-utilization 0.85: leaves {0.15 * sum(d_.capacity_bytes for d_ in p.gpus) / GB:.1f} GB for the desktop "
             "and other processes",))
    if (gpu_short and engine == "llamacpp") or ("allocation-failure" in err_rows and engine == "llamacpp"):
        fitq = variant(n_ctx=p.n_ctx)
        eff = [f"drop -ngl (let --fit choose): -ngl {p.n_gpu_layers} → {fitq.n_gpu_layers}, {_fmt(_tok(fitq, setup, ctx_at))}"]
        if not fitq.fits or fitq.n_gpu_layers < L + 1:
            half = variant(n_ctx=max(256, p.n_ctx // 2))
            eff.append(effect(f"-c {half.n_ctx}", half))
        add("allocation-failure", "; ".join(d.name + f" needs {d.total_bytes / GB:.2f} GB of {d.capacity_bytes / GB:.2f} GB"
                                            for d in gpu_short) or f"error: {error_head}", eff)
    host_need = p.cpu_total if not m.unified else sum(d.total_bytes for d in p.devices)
    if host_need > m.ram.memory_gb * GB or "disk-paging" in err_rows:
        add("disk-paging", f"host memory needs {host_need / GB:.1f} GB, the machine has {m.ram.memory_gb:.0f} GB")
    # 2. speed
    if p.fits and pred is not None:
        d = decode_step_time(p, m, ctx_at, 1, setup.speed)
        share = d["cpu_s"] / d["total_s"] if d["total_s"] else 0.0
        if m.gpus and p.cpu.n_blocks and share > 0.3:
            eff = []
            for kvq in ("q8_0",):
                if p.kv_type != kvq:
                    eff.append(effect(f"{kvq} KV", variant(kv_type=kvq)))
            eff.append(effect(f"-c {max(256, p.n_ctx // 2)}", variant(n_ctx=max(256, p.n_ctx // 2))))
            if spec.is_moe:
                base, ranked, _ = rank_placements(setup, p.n_ctx, kv_types=(p.kv_type,), top=1)
                if ranked:
                    b = ranked[0]
                    eff.append(f"--n-cpu-moe {b.n_cpu_moe} -ngl {b.n_gpu_layers}: -ngl {p.n_gpu_layers} → {b.n_gpu_layers}, "
                               f"{_fmt(pred)} → {b.tok_per_s:.1f} tok/s")
            add("partial-offload", f"{p.cpu.n_blocks} of {L} blocks in system RAM: {share:.0%} of each decode step on the CPU", eff)
        kv_read = sum(x["kv_bytes"] for x in d["per_device"])
        w_read = sum(x["weights_bytes"] for x in d["per_device"])
        if kv_read > 0.3 * w_read:
            eff = []
            if p.kv_type == "f16":
                eff.append(effect("q8_0 KV", variant(kv_type="q8_0")))
            add("kv-long-context", f"at {ctx_at:,} cached tokens a step reads {kv_read / GB:.2f} GB of KV beside {w_read / GB:.2f} GB of weights", eff)
        if m.cpu_only and threads and m.ram.n_cores and threads > m.ram.n_cores:
            add("cpu-threads", f"-t {threads} on {m.ram.n_cores} physical cores", (f"-t {m.ram.n_cores}: the speed model's prediction {_fmt(pred)} assumes the physical cores",))
        if observed_tok_s is not None and observed_tok_s < SLOW_RATIO * pred:
            if m.gpus and any(g.backend == "cuda" for g in m.gpus) and p.gpu_total > 0.9 * sum(d_.capacity_bytes for d_ in p.gpus):
                add("sysmem-fallback", f"observed {observed_tok_s:.1f} tok/s is {observed_tok_s / pred:.0%} of the predicted "
                                       f"{pred:.1f} while the GPU is {p.gpu_total / sum(d_.capacity_bytes for d_ in p.gpus):.0%} full")
            elif m.cpu_only:
                add("cpu-threads", f"observed {observed_tok_s:.1f} tok/s is {observed_tok_s / pred:.0%} of the predicted {pred:.1f}")
            else:
                notes.append(f"observed {observed_tok_s:.1f} tok/s is {observed_tok_s / pred:.0%} of the predicted {pred:.1f}; "
                             "measure with llama-bench (-p 512 -n 128) to separate the engine from the machine")
    elif not p.fits and observed_tok_s is not None and m.gpus and any(g.backend == "cuda" for g in m.gpus):
        add("sysmem-fallback", f"the configuration needs more VRAM than the GPU has, yet it runs ({observed_tok_s:.1f} tok/s): "
                               "the driver is spilling into shared system memory")
    if ttft is not None and (ttft > LONG_TTFT_S or (observed_ttft_s is not None and observed_ttft_s > LONG_TTFT_S)) or "long-prefill" in err_rows:
        eff = []
        if ttft is not None and m.gpus:
            big = dataclasses.replace(setup.speed, n_ubatch=2048)
            t2 = prefill_time(p, m, n_prompt, big)["total_s"]
            eff.append(f"-ub 2048: TTFT {ttft:.2f} → {t2:.2f} s for {n_prompt:,} prompt tokens")
        eff.append("prompt/prefix caching: a repeated prefix is not prefilled again")
        add("long-prefill", f"predicted TTFT {ttft:.2f} s for {n_prompt:,} prompt tokens" if ttft is not None else f"observed TTFT {observed_ttft_s} s", eff)
    if (users and users > np_) or "capped-concurrency" in err_rows:
        add("capped-concurrency", f"{users or 'more'} users on {np_} " + ("slots (-np)" if engine == "llamacpp" else "sequences (--max-num-seqs)"),
            (f"-np {users} -kvu: {users} slots share the {p.n_ctx:,} cells of -c" if engine == "llamacpp" and users else "raise --max-num-seqs",))
    return DiagnosisReport(spec.name, m.name, engine, shlex.join(argv), p.n_gpu_layers, p.n_ctx, p.kv_type, np_, p.fits, p.reason,
                           pred, ttft, observed_tok_s, observed_ttft_s, tuple(findings), tuple(notes))

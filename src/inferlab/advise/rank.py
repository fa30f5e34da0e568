"""Rank llama.cpp placements of a model that does not fit: a search over -ngl x --n-cpu-moe (the -ot
experts-to-CPU pattern it writes) x KV type x context, each candidate placed by ``perf.placement.place``
and timed by ``perf.speed.decode_step_time``; llama.cpp's ``--fit`` default is one of the candidates,
so the best one is never slower than it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError
from ..perf.placement import Placement, place
from ..perf.speed import decode_step_time, prefill_time
from .commands import EngineCommand, experts_ot_pattern, llama_server

RANK_KV_TYPES = ("f16", "q8_0")  # the lesson's trade (q8_0 halves the cache); q4_0 costs quality, ask for it


@dataclass(frozen=True)
class RankedPlacement:
    rank: int  # 1 = fastest; 0 = the --fit default (listed on its own)
    n_gpu_layers: int
    n_cpu_moe: int
    kv_type: str
    n_ctx: int
    decode_context: int
    tok_per_s: float
    prefill_tok_per_s: float
    gpu_bytes: float
    host_bytes: float
    cpu_share: float  # share of each decode step spent on the CPU
    command: EngineCommand
    ot_command: EngineCommand | None  # the same placement spelled with -ot
    label: str


def _entry(setup, p: Placement, rank: int, ctx: int, label: str, ncm: int = 0, fit_default: bool = False) -> RankedPlacement:
    m = setup.machine
    dctx = max(1, ctx // 2)
    d = decode_step_time(p, m, dctx, 1, setup.speed)
    f = prefill_time(p, m, min(512, ctx), setup.speed)
    spec, q = setup.spec, p.quant
    if fit_default:
        cmd = llama_server(spec, q, ctx=ctx, reports=(f"--fit chooses -ngl {p.n_gpu_layers}",),
                           notes=("llama.cpp's default: --fit on picks -ngl for the -c you set",))
        ot = None
    else:
        kw: dict[str, Any] = dict(n_gpu_layers=p.n_gpu_layers, ctx=ctx, kv_type=p.kv_type)
        cmd = llama_server(spec, q, n_cpu_moe=ncm if ncm < spec.n_layers else 0, cpu_moe=ncm >= spec.n_layers and ncm > 0, **kw)
        ot = llama_server(spec, q, override_tensor=experts_ot_pattern(ncm if ncm < spec.n_layers else None), **kw) if ncm else None
    return RankedPlacement(rank, p.n_gpu_layers, ncm, p.kv_type, ctx, dctx, d["tok_per_s"], f["tok_per_s"], p.gpu_total, p.cpu_total,
                           d["cpu_s"] / d["total_s"] if d["total_s"] else 0.0, cmd, ot, label)


def rank_placements(setup, ctx: int, *, kv_types: tuple[str, ...] = RANK_KV_TYPES, contexts: tuple[int, ...] | None = None,
                    top: int = 5) -> tuple[RankedPlacement, tuple[RankedPlacement, ...], int]:
    """The --fit default and the ``top`` fastest placements that fit (and how many candidates were placed)."""
    spec, m, scheme = setup.spec, setup.machine, setup.scheme
    if not m.gpus:
        raise InvalidValueError(f"{m.name} has no GPU: there is no placement to rank (everything runs from RAM)")
    contexts = contexts or (ctx,)
    L = spec.n_layers
    base_p = place(spec, m, scheme, ctx, "f16", None)
    base = _entry(setup, base_p, 0, ctx, "--fit default", fit_default=True)
    found: list[tuple[float, float, Placement, int, int]] = []
    n = 0
    ncm_values = range(0, L + 1) if spec.is_moe else (0,)
    for kv in kv_types:
        for c in contexts:
            for ncm in ncm_values:
                for ngl in range(0, L + 2):
                    if ncm and ngl <= L + 1 - ncm and ngl < L + 1:
                        continue  # experts of CPU blocks are in RAM already: same placement as ncm = 0
                    p = place(spec, m, scheme, c, kv, ngl, n_cpu_moe=ncm)
                    n += 1
                    if not p.fits:
                        continue
                    d = decode_step_time(p, m, max(1, c // 2), 1, setup.speed)
                    found.append((d["tok_per_s"], -p.gpu_total, p, c, ncm))
    found.sort(key=lambda t: (-t[0], t[1]))
    out, seen = [], set()
    for _tok, _, p, c, ncm in found:
        key = (p.n_gpu_layers, ncm, p.kv_type, c)
        if key in seen:
            continue
        seen.add(key)
        out.append(_entry(setup, p, len(out) + 1, c, "", ncm))
        if len(out) >= top:
            break
    return base, tuple(out), n

"""What each figure's endpoint answers: service-layer reports as JSON, with their provenance.

Each function takes the server's :class:`~inferlab.web.offer.Offer` (what a client may name) and a
validated body, resolves one configuration with ``api.configure`` where a figure needs several
questions of it (so they all see one placement), and returns plain JSON values. The few numbers
computed here are for drawing (the roof's corners over the chart's range, step groupings,
totals over devices) and each says what it sums.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import InvalidValueError
from .bodies import Configuration, DecodeBody, FitBody, LoadBody, PhasesBody, RooflineBody, SimBody
from .kv_frames import frames_for
from .loading import tier_states
from .offer import Offer
from .provenance import SPEED_MODELS, fit_provenance, sim_provenance

SIM_EVENT_STEPS_MAX = 5000  # an animated run beyond this many steps is refused (use the CLI)
ROOF_INTENSITY_RANGE = (0.1, 10_000.0)  # FLOP/byte: the roofline chart's x range
CURVE_SHARES = (0, 1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1)  # figure 2's contexts, as shares of the cache


def _speed_prov(name: str) -> dict[str, str]:
    return {"origin": "estimated", "source": SPEED_MODELS.get(name, name)}


def _configure_args(offer: Offer, b: Configuration) -> dict[str, Any]:
    return dict(model=offer.model(b.model), machine=offer.machine(b.machine), quant=b.quant, n_ctx=b.n_ctx, kv_type=b.kv_type,
                n_gpu_layers=b.n_gpu_layers, n_cpu_moe=b.n_cpu_moe, speed=b.speed, order=b.order)


def setup_of(offer: Offer, b: Configuration):
    from ..api import configure

    return configure(**_configure_args(offer, b))


# ------------------------------------------------------------------ figure 5: the calculator
def fit(offer: Offer, b: FitBody) -> dict[str, Any]:
    from ..api import fit as fit_api

    r = fit_api(**_configure_args(offer, b), context=b.context, n_prompt=b.n_prompt)
    d = r.to_dict()
    d["provenance"] = fit_provenance(d)
    return d


def advice(offer: Offer, b: FitBody) -> dict[str, Any]:
    """Engine command lines: llama-server with the calculator's own settings (checked against
    llama.cpp's argument table by advise.commands), and the advisor's pick per engine for this
    model, machine, quantization and context (api.advise)."""
    from ..advise.commands import llama_server
    from ..api import advise
    from ..errors import InferlabError

    setup = setup_of(offer, b)
    label = setup.scheme.label if setup.scheme is not None else "file"
    mine = llama_server(setup.spec, label, n_gpu_layers=b.n_gpu_layers, ctx=b.n_ctx, kv_type=b.kv_type, n_cpu_moe=b.n_cpu_moe)
    out: dict[str, Any] = {"kind": "AdviceFigure", "yours": {"engine": "llamacpp", "text": mine.text, "notes": list(mine.notes),
                                                             "engine_version": mine.engine_version},
                           "advice": None, "advice_error": None}
    try:
        out["advice"] = advise(offer.model(b.model), offer.machine(b.machine), ctx=b.n_ctx, quant=b.quant, speed=b.speed).to_dict()
    except InferlabError as exc:  # e.g. a machine none of the serving engines runs on
        out["advice_error"] = str(exc)
    out["provenance"] = {"commands": {"origin": "estimated", "source": "inferlab's advisor (advise/): flags checked against each "
                                                                        "engine's own argument table"}}
    return out


def ngl_sweep(offer: Offer, b: FitBody) -> dict[str, Any]:
    """The calculator's "what each layer buys": `fit` at every -ngl from 0 to n_layers + 1."""
    from ..api import fit as fit_api

    args = _configure_args(offer, b)
    args.pop("n_gpu_layers")
    points, n_max, ngl = [], 0, 0
    while True:
        r = fit_api(**args, n_gpu_layers=ngl, context=b.context, n_prompt=b.n_prompt)
        n_max = r.n_gpu_layers_max
        gpu = [x for x in r.devices if x.kind == "gpu"]
        points.append({"n_gpu_layers": ngl, "fits": r.fits, "reason": r.reason,
                       "decode_tok_per_s": r.decode.tok_per_s if r.decode else None,
                       "prefill_tok_per_s": r.prefill.tok_per_s if r.prefill else None,
                       "gpu_bytes": sum(x.total_bytes for x in gpu), "gpu_capacity_bytes": sum(x.capacity_bytes for x in gpu)})
        ngl += 1
        if ngl > n_max:
            break
    return {"kind": "NglSweep", "n_gpu_layers_max": n_max, "points": points,
            "provenance": {"points": {"origin": "estimated", "source": "inferlab.api.fit at each -ngl: " + SPEED_MODELS[b.speed]}}}


# ------------------------------------------------------------------ figure 1: loading
def load(offer: Offer, b: LoadBody) -> dict[str, Any]:
    from ..api.fit import fit_report
    from ..api.trace import load_trace
    from ..perf.trace import device_labels

    setup = setup_of(offer, b)
    tr = load_trace(setup, disk_gbps=b.disk_gbps).to_dict()
    fr = fit_report(setup).to_dict()
    labels = list(device_labels(setup.placement))
    return {"kind": "LoadFigure", "trace": tr, "fit": fr, "labels": labels, "tiers": tier_states(tr["steps"], labels),
            "tiers_second_launch": tier_states(tr["second_launch"], labels),
            "provenance": {"steps": {"origin": "estimated", "source": "perf.trace.load_steps: bytes from the placement, seconds "
                                                                     "over the drive, link and memory figures"},
                           **fit_provenance(fr)}}


# ------------------------------------------------------------------ figure 2: time per token
def decode(offer: Offer, b: DecodeBody) -> dict[str, Any]:
    from ..api.trace import decode_trace

    args = _configure_args(offer, b)
    setup = setup_of(offer, b)
    args["model"] = setup.spec
    cells = setup.placement.n_ctx // b.batch  # cached tokens one sequence may hold
    if b.context is not None and b.context > cells:
        raise InvalidValueError(f"context {b.context} is beyond the {cells} cached tokens a sequence may hold "
                                f"(-c {setup.placement.n_ctx} over batch {b.batch}); raise the context size or lower the context")
    contexts = sorted({int(cells * f) for f in CURVE_SHARES} | ({b.context} if b.context is not None else set()))
    tr = decode_trace(setup, b.context, b.batch, contexts=contexts if setup.placement.fits else None,
                      configure_args=args).to_dict()
    tr["context_max"] = cells
    tr["provenance"] = {"steps": _speed_prov(setup.speed.name), "curve": _speed_prov(setup.speed.name),
                        "bytes": {"origin": "estimated", "source": "the placement's weights and the model's KV layout per cached token"}}
    return tr


# ------------------------------------------------------------------ figure 3: prefill and decode
def phases(offer: Offer, b: PhasesBody) -> dict[str, Any]:
    from ..api.trace import decode_trace, prefill_trace

    setup = setup_of(offer, b)
    p = setup.placement
    if b.n_prompt > p.n_ctx:
        raise InvalidValueError(f"a prompt of {b.n_prompt} tokens does not fit the context of {p.n_ctx}; shorten it or raise n_ctx")
    pre = prefill_trace(setup, b.n_prompt, 0).to_dict()
    ctx = b.context if b.context is not None else b.n_prompt  # decode right after the prompt
    if ctx > p.n_ctx:
        raise InvalidValueError(f"context {ctx} is beyond the configured context of {p.n_ctx} tokens")
    dec = decode_trace(setup, ctx, 1).to_dict()
    groups = []
    mbs = sorted({s["micro_batch"] for s in pre["steps"]})
    for mb in mbs:
        idx = [i for i, s in enumerate(pre["steps"]) if s["micro_batch"] == mb]
        groups.append({"phase": "prefill", "label": f"prefill micro-batch {mb + 1} of {len(mbs)}", "steps": idx,
                       "s": sum(pre["steps"][i]["s"] for i in idx)})  # seconds of this micro-batch's steps
    if dec["steps"]:
        groups.append({"phase": "decode", "label": "one decode step", "steps": list(range(len(dec["steps"]))), "s": dec["total_s"]})
    return {"kind": "PhasesFigure", "fits": p.fits, "reason": p.reason, "prefill": pre, "decode": dec, "groups": groups,
            "provenance": {"prefill": _speed_prov(setup.speed.name), "decode": _speed_prov(setup.speed.name)}}


# ------------------------------------------------------------------ figure 4: the roofline
def roofline(offer: Offer, b: RooflineBody) -> dict[str, Any]:
    from ..api import roofline as roofline_api

    batches = sorted({1, b.batch})
    n_ctx = b.n_ctx if b.n_ctx is not None else max(4096, b.batch * b.context)  # room for every sequence's cache
    r = roofline_api(offer.machine(b.machine), offer.model(b.model), quant=b.quant, kv_type=b.kv_type, batches=batches,
                     contexts=(max(1, b.context), 4096), context=b.context, n_ctx=n_ctx, n_gpu_layers=b.n_gpu_layers,
                     speed=b.speed, order=b.order).to_dict()
    lo, hi = ROOF_INTENSITY_RANGE
    for roof in r["roofs"]:
        ridge, peak, bw = roof["ridge_flop_per_byte"], roof["peak_flops"], roof["bandwidth_bytes_per_s"]
        # the roof min(P, I x beta) at the chart's ends and the ridge (corners of the polyline)
        roof["polyline"] = [[lo, min(peak, lo * bw)], [ridge, peak], [hi, peak]] if lo < ridge < hi else \
            [[lo, min(peak, lo * bw)], [hi, min(peak, hi * bw)]]
    r["selected_batch"] = b.batch
    r["provenance"] = {"roofs": {"origin": "catalog", "source": "vendor peak FP16 (FP32-accumulate) throughput and memory bandwidth "
                                                                "of each device (data/devices.json); some are approximations"},
                       "points": {"origin": "estimated", "source": "inferlab's FLOP and byte counts per operation (perf.roofline)"},
                       "throughput": _speed_prov(r.get("speed_model") or b.speed)}
    return r


# ------------------------------------------------------------------ figure 6: three KV managers
def _animation(run, reqs, time_unit: str) -> dict[str, Any]:
    """One engine's frames: the simulator's per-step events (an untimed run recorded step by step,
    the same run as the report's: its summary must be equal) replayed into blocks or tree nodes."""
    from ..kv.registry import manager_class
    from ..kv.simulator import simulate as run_sim

    tl = run._run.timeline if run._run is not None else None
    out: dict[str, Any] = {"events": None, "state": None, "timeline": {k: list(v) for k, v in tl.items()} if tl else None}
    if time_unit != "step":
        return out  # a timed run animates from its timeline
    if run.summary["steps"] > SIM_EVENT_STEPS_MAX:
        raise InvalidValueError(f"{run.engine} takes {run.summary['steps']} steps on this workload, over the {SIM_EVENT_STEPS_MAX} "
                                "the animation plays; ask for fewer requests or use `inferlab simulate`")
    opts = {k: v for k, v in run.config.items() if k in _manager_options(run.engine)}
    rec = run_sim(reqs, manager_class(run.engine)(capacity_tokens=run.capacity_tokens, **opts), record_events=True)
    if rec.summary != run.summary:  # stepped one by one, the same figures as the fast-forwarded run
        raise InvalidValueError(f"{run.engine}: the recorded run differs from the report's (the animation would not show it)")
    assert rec.events is not None  # record_events=True: the run holds one StepEvents per step
    steps = [s.to_dict() for s in rec.events]
    out["events"] = steps
    out["state"] = frames_for(run.engine, steps, run.config, run.summary["kv_capacity_tokens"])
    return out


def _manager_options(engine: str) -> set[str]:
    from ..kv.registry import manager_class

    return {p for p in inspect.signature(manager_class(engine).__init__).parameters if p not in ("self", "capacity_tokens")}



def simulate(offer: Offer, b: SimBody) -> dict[str, Any]:
    from ..api import simulate as simulate_api
    from ..kv.workloads import WORKLOADS

    reqs = WORKLOADS[b.workload]()
    if b.limit:
        reqs = reqs[: b.limit]
    if len(set(b.engines)) != len(b.engines):
        raise InvalidValueError(f"engines named twice: {b.engines}")
    model = machine = None
    if b.model is not None or b.machine is not None:
        if b.model is None or b.machine is None:
            raise InvalidValueError("model and machine go together (or give capacity_tokens alone)")
        model, machine = offer.model(b.model), offer.machine(b.machine)
    cap = b.capacity_tokens if model is None else None
    rep = simulate_api(reqs, engines=b.engines, capacity_tokens=cap, model=model, machine=machine, quant=b.quant,
                       kv_type=b.kv_type, workload=b.workload, record_timeline=b.events)
    d = rep.to_dict()
    if b.events:
        d["animation"] = {run.engine: _animation(run, reqs, rep.time_unit) for run in rep.runs}
    d["provenance"] = sim_provenance(d)
    return d

"""``inferlab serve``: a JSON API over the service layer and the single-page app that draws it.

Every number the page shows comes from an endpoint here, and every endpoint only parses its body
(``bodies.py``), checks the names against what this server offers, calls ``inferlab.api`` and
returns the report's ``to_dict()`` (the same JSON as the CLI's ``--json``) with a ``provenance``
block. The page does no arithmetic on them beyond unit display.

Safety: models are the catalog plus the files named on the command line (``create_app(files=)``);
a client names a model by id and never sends a path. Bodies are capped (``guard.BodyLimit``), the
Host header must be the loopback name or the address the server was bound to (no DNS rebinding),
and there is no CORS: a page from another origin cannot read the answers.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from ..errors import InvalidValueError, UnknownNameError
from .bodies import Configuration, CurveBody, FitBody, RooflineBody, SimBody
from .guard import BodyLimit, install_error_handlers
from .provenance import fit_provenance, sim_provenance

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
SIM_EVENT_STEPS_MAX = 5000  # an animated run beyond this many steps is refused (use the CLI)
# The lesson's four loading scenarios (model, machine, context), figure 1 and 3
LESSON_SCENARIOS = (
    {"id": "fits", "label": "Llama 3.1 8B on a 24 GB RTX 4090 (fits)", "model": "llama-3.1-8b", "machine": "rtx4090", "n_ctx": 8192},
    {"id": "partial", "label": "Qwen2.5 32B on a 16 GB RTX 4060 Ti (partial offload)", "model": "qwen2.5-32b",
     "machine": "rtx4060ti", "n_ctx": 8192},
    {"id": "apple", "label": "Llama 3.1 8B on Apple M4 Max (unified memory)", "model": "llama-3.1-8b", "machine": "m4max",
     "n_ctx": 8192},
    {"id": "cpu", "label": "Llama 3.1 8B on a CPU-only DDR5 desktop", "model": "llama-3.1-8b", "machine": "cpu-ddr5", "n_ctx": 8192},
)


class Offer:
    """What this server lets a client name: catalog models + the command line's files, machines."""

    def __init__(self, files: Sequence[str] = (), local: bool = False):
        from ..hardware.catalog import MACHINES
        from ..models.catalog import MODELS
        from ..models.resolve import resolve_model

        self.models: dict[str, Any] = {k: k for k in MODELS}
        self.model_origin: dict[str, str] = {k: "catalog" for k in MODELS}
        self.file_specs: dict[str, Any] = {}
        for path in files:
            spec = resolve_model(path)  # read once, at start; a client can only name it by its id
            base = "file:" + os.path.basename(os.path.normpath(path))
            key, n = base, 2
            while key in self.models:
                key, n = f"{base}#{n}", n + 1
            self.models[key] = spec
            self.model_origin[key] = "file"
            self.file_specs[key] = (path, spec)
        self.machines: list[str] = list(MACHINES) + (["local"] if local else [])
        self.default_machine = "local" if local else "rtx4060ti"

    def model(self, key: str) -> Any:
        if key not in self.models:
            raise UnknownNameError("model", key, self.models)
        return self.models[key]

    def machine(self, key: str) -> str:
        if key not in self.machines:
            raise UnknownNameError("machine", key, self.machines)
        return key


def _catalog(offer: Offer) -> dict[str, Any]:
    from ..hardware.catalog import MACHINES
    from ..hardware.resolve import resolve_machine
    from ..kv.registry import ENGINES
    from ..kv.workloads import WORKLOADS
    from ..models.resolve import resolve_model
    from ..perf.kv_size import LLAMA_CPP_KV_TYPES
    from ..quant.presets import presets

    models = []
    for key, src in offer.models.items():
        spec = resolve_model(src)
        models.append({"id": key, "name": spec.name, "n_layers": spec.n_layers, "n_gpu_layers_max": spec.n_layers + 1,
                       "n_ctx_train": spec.n_ctx_train, "params": spec.total_params(), "origin": offer.model_origin[key],
                       "source": spec.source if offer.model_origin[key] == "catalog" else offer.file_specs[key][0],
                       "own_tensors": spec.tensors is not None})
    machines = []
    for key in offer.machines:
        m = MACHINES[key] if key in MACHINES else resolve_machine(key)
        machines.append({"id": key, "name": m.name, "gpus": [g.name for g in m.gpus], "unified": m.unified,
                         "gpu_memory_gb": sum(g.memory_gb for g in m.gpus), "ram_gb": m.ram.memory_gb,
                         "source": m.source, "origin": "measured" if key == "local" else "catalog"})
    return {"models": models, "machines": machines, "default_machine": offer.default_machine,
            "quants": list(presets()), "kv_types": list(LLAMA_CPP_KV_TYPES), "engines": list(ENGINES),
            "workloads": list(WORKLOADS), "speed_models": ["calibrated", "bandwidth-only", "lesson"],
            "scenarios": list(LESSON_SCENARIOS), "features": _features()}


def _features() -> dict[str, bool]:
    """Which optional service-layer questions this build answers (the page hides what is missing)."""
    from .. import api

    return {name: hasattr(api, name) for name in ("trace", "roofline", "capacity", "advise")}


def _setup(offer: Offer, b: Configuration):
    from ..api import configure

    return configure(offer.model(b.model), offer.machine(b.machine), quant=b.quant, n_ctx=b.n_ctx, kv_type=b.kv_type,
                     n_gpu_layers=b.n_gpu_layers, n_cpu_moe=b.n_cpu_moe, speed=b.speed, order=b.order)


def _fit(offer: Offer, b: FitBody) -> dict[str, Any]:
    from ..api import fit

    r = fit(offer.model(b.model), offer.machine(b.machine), quant=b.quant, n_ctx=b.n_ctx, kv_type=b.kv_type,
            n_gpu_layers=b.n_gpu_layers, n_cpu_moe=b.n_cpu_moe, context=b.context, n_prompt=b.n_prompt, speed=b.speed,
            order=b.order)
    d = r.to_dict()
    d["provenance"] = fit_provenance(d)
    return d


def _ngl_sweep(offer: Offer, b: FitBody) -> dict[str, Any]:
    """The calculator's "what each layer buys": fit at every -ngl from 0 to n_layers + 1."""
    from ..api import fit

    spec_src = offer.model(b.model)
    points = []
    n_max = None
    for ngl in range(0, MAX_SWEEP + 1):
        r = fit(spec_src, offer.machine(b.machine), quant=b.quant, n_ctx=b.n_ctx, kv_type=b.kv_type, n_gpu_layers=ngl,
                n_cpu_moe=b.n_cpu_moe, context=b.context, n_prompt=b.n_prompt, speed=b.speed, order=b.order)
        n_max = r.n_gpu_layers_max
        gpu = [x for x in r.devices if x.kind == "gpu"]
        points.append({"n_gpu_layers": ngl, "fits": r.fits, "reason": r.reason,
                       "decode_tok_per_s": r.decode.tok_per_s if r.decode else None,
                       "prefill_tok_per_s": r.prefill.tok_per_s if r.prefill else None,
                       "gpu_bytes": sum(x.total_bytes for x in gpu), "gpu_capacity_bytes": sum(x.capacity_bytes for x in gpu)})
        if ngl >= n_max:
            break
    return {"kind": "NglSweep", "n_gpu_layers_max": n_max, "points": points,
            "provenance": {"points": {"origin": "estimated", "source": "inferlab.api.fit at each -ngl (same model as the calculator)"}}}


MAX_SWEEP = 1024


def _decode_curve(offer: Offer, b: CurveBody) -> dict[str, Any]:
    from ..api.fit import decode_report, fit_report
    from ..api.report import plain

    setup = _setup(offer, b)
    fr = fit_report(setup)
    if not fr.fits:
        return {"kind": "DecodeCurve", "fits": False, "reason": fr.reason, "points": [], "fit": fr.to_dict()}
    pts = []
    n_ctx = setup.placement.n_ctx
    contexts = b.contexts or [0] + [1 << k for k in range(8, 25) if (1 << k) < n_ctx] + [n_ctx]
    for c in sorted(set(contexts)):
        if c > setup.placement.n_ctx:
            raise InvalidValueError(f"context {c} is beyond the configured context of {setup.placement.n_ctx} tokens; "
                                    f"raise n_ctx or ask for at most {setup.placement.n_ctx}")
        pt = plain(decode_report(setup, c, b.batch))
        pt["weights_bytes"] = sum(d["weights_bytes"] for d in pt["per_device"])  # read this step, all devices
        pt["kv_bytes"] = sum(d["kv_bytes"] for d in pt["per_device"])
        pt["read_bytes"] = pt["weights_bytes"] + pt["kv_bytes"]
        pts.append(pt)
    return {"kind": "DecodeCurve", "fits": True, "reason": "", "n_ctx": setup.placement.n_ctx, "batch": b.batch, "points": pts,
            "fit": fr.to_dict(), "provenance": {"points": {"origin": "estimated", "source": f"decode_report, speed model {setup.speed.name}"}}}


def _simulate(offer: Offer, b: SimBody) -> dict[str, Any]:
    from ..api import simulate
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
    kw: dict[str, Any] = {}
    can_events = "record_events" in inspect.signature(simulate).parameters
    if b.events:
        if can_events:
            kw["record_events"] = True
        else:
            kw["record_timeline"] = True
    rep = simulate(reqs, engines=b.engines, capacity_tokens=cap, model=model, machine=machine, quant=b.quant,
                   kv_type=b.kv_type, workload=b.workload, **kw)
    d = rep.to_dict()
    if b.events:
        anim = {}
        for run in rep.runs:
            r = run._run
            if r is None:
                continue
            if r.summary["steps"] > SIM_EVENT_STEPS_MAX:
                raise InvalidValueError(f"{run.engine} takes {r.summary['steps']} steps on this workload, over the "
                                        f"{SIM_EVENT_STEPS_MAX} the animation plays; set limit lower or use `inferlab simulate`")
            ev = getattr(r, "events", None)
            anim[run.engine] = {"events": [s.to_dict() for s in ev] if ev is not None else None,
                                "timeline": {k: list(v) for k, v in r.timeline.items()} if r.timeline else None}
        d["animation"] = anim
    d["provenance"] = sim_provenance(d)
    return d


def create_app(files: Sequence[str] = (), *, local: bool = False, host: str = "127.0.0.1") -> FastAPI:
    """The app. ``files``: GGUF files or HF folders the user named (read now, offered by id);
    ``local``: offer this machine (detected, with its calibration) as "local"."""
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    offer = Offer(files, local=local)
    app = FastAPI(title="inferlab", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    allowed = list(LOOPBACK_HOSTS) + ([host] if host not in LOOPBACK_HOSTS else [])
    if host in ("0.0.0.0", "::"):
        allowed = ["*"]  # the user opened it to the network on purpose
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed)
    app.add_middleware(BodyLimit)
    static = resources.files("inferlab.web") / "static"
    catalog_cache: dict[str, Any] = {}

    @app.get("/", include_in_schema=False)
    def index():
        return FileResponse(str(static / "index.html"), headers={"Cache-Control": "no-cache"})

    @app.get("/api/catalog")
    def catalog():
        if "c" not in catalog_cache:
            catalog_cache["c"] = _catalog(offer)
        return catalog_cache["c"]

    @app.post("/api/fit")
    def fit_endpoint(body: FitBody):
        return _fit(offer, body)

    @app.post("/api/fit/ngl-sweep")
    def ngl_sweep(body: FitBody):
        return _ngl_sweep(offer, body)

    @app.post("/api/decode-curve")
    def decode_curve(body: CurveBody):
        return _decode_curve(offer, body)

    @app.post("/api/simulate")
    def simulate_endpoint(body: SimBody):
        return _simulate(offer, body)

    _optional_routes(app, offer)
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    app.state.offer = offer
    return app


def _optional_routes(app: FastAPI, offer: Offer) -> None:
    """Routes for service-layer questions that other parts of inferlab provide (traces, roofline,
    capacity, advice); each appears when its api function exists."""
    from .. import api

    if hasattr(api, "roofline"):
        @app.post("/api/roofline")
        def roofline(body: RooflineBody):
            return _plain_report(api.roofline, offer, body)


def _plain_report(fn, offer: Offer, b: Configuration) -> dict[str, Any]:
    kwargs = b.model_dump()
    kwargs["model"], kwargs["machine"] = offer.model(b.model), offer.machine(b.machine)
    params = inspect.signature(fn).parameters
    r = fn(**{k: v for k, v in kwargs.items() if k in params})
    return r.to_dict() if hasattr(r, "to_dict") else r


def json_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)

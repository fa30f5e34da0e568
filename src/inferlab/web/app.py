"""``inferlab serve``: a JSON API over the service layer and the single-page app that draws it.

Every number the page shows comes from an endpoint here, and every endpoint only parses its body
(``bodies.py``), checks the names against what this server offers (``offer.py``), calls
``inferlab.api`` (``figures.py``) and returns the reports' ``to_dict()`` (the same JSON as the
CLI's ``--json``) with a ``provenance`` block. The page does no arithmetic on them beyond units.

Safety: models are the catalog plus the files named on the command line (``create_app(files=)``);
a client names a model by id and never sends a path. Bodies are capped (``guard.BodyLimit``), the
Host header must be the loopback name or the address the server was bound to (no DNS rebinding),
and there is no CORS: a page from another origin cannot read the answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response

from . import figures
from .bodies import DecodeBody, FitBody, LoadBody, PhasesBody, RooflineBody, SimBody
from .guard import BodyLimit, SecurityHeaders, install_error_handlers
from .offer import Offer

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
ANSWERS_MAX_BYTES = 64 * 2**20  # remembered answers, all together (a calculator answer is ~6 KB)
# The lesson's four loading scenarios (model, machine, context), figure 1 and 3
LESSON_SCENARIOS = (
    {"id": "fits", "label": "Llama 3.1 8B on a 24 GB RTX 4090 (fits)", "model": "llama-3.1-8b", "machine": "rtx4090", "n_ctx": 8192},
    {"id": "partial", "label": "Qwen2.5 32B on a 16 GB RTX 4060 Ti (partial offload)", "model": "qwen2.5-32b",
     "machine": "rtx4060ti", "n_ctx": 8192},
    {"id": "apple", "label": "Llama 3.1 8B on Apple M4 Max (unified memory)", "model": "llama-3.1-8b", "machine": "m4max",
     "n_ctx": 8192},
    {"id": "cpu", "label": "Llama 3.1 8B on a CPU-only DDR5 desktop", "model": "llama-3.1-8b", "machine": "cpu-ddr5", "n_ctx": 8192},
)


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
            "scenarios": list(LESSON_SCENARIOS)}


class Answers:
    """Answers as JSON bytes, remembered per (question, body).

    Every answer is a pure function of its body and of what the server offers (catalog data and
    the files read at start), so a repeated question (a slider moved back, a second user) is
    answered from memory. Questions about "local" are not remembered: a calibration may land while
    the server runs. Bounded in bytes: the least recently used answers go first.
    """

    def __init__(self, max_bytes: int = ANSWERS_MAX_BYTES):
        import threading
        from collections import OrderedDict

        self.max_bytes = max_bytes
        self._memo: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()  # the thread pool's routes and the event loop's share the memo
        self.n_bytes = self.hits = self.misses = 0

    def get(self, question: str, body, compute) -> Response:
        key = (question, body.model_dump_json())
        with self._lock:
            raw = self._memo.get(key)
            if raw is not None:
                self.hits += 1
                self._memo.move_to_end(key)
                return Response(raw, media_type="application/json")
            self.misses += 1
        raw = json.dumps(compute(), allow_nan=False, separators=(",", ":")).encode()  # outside the lock: may take a while
        if getattr(body, "machine", None) != "local" and len(raw) <= self.max_bytes // 8:
            with self._lock:
                if key not in self._memo:
                    self._memo[key] = raw
                    self.n_bytes += len(raw)
                while self.n_bytes > self.max_bytes:
                    self.n_bytes -= len(self._memo.popitem(last=False)[1])
        return Response(raw, media_type="application/json")


def create_app(files: Sequence[str] = (), *, local: bool = False, host: str = "127.0.0.1") -> FastAPI:
    """The app. ``files``: GGUF files or HF folders the user named (read now, offered by id);
    ``local``: offer this machine (detected, with its calibration) as "local"; ``host``: the
    address it is bound to (the only Host header accepted besides the loopback names)."""
    from fastapi.staticfiles import StaticFiles
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    offer = Offer(files, local=local)
    app = FastAPI(title="inferlab", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    allowed = list(LOOPBACK_HOSTS) + ([host] if host not in LOOPBACK_HOSTS else [])
    if host in ("0.0.0.0", "::"):
        allowed = ["*"]  # the user opened it to the network on purpose
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed)
    app.add_middleware(BodyLimit)
    app.add_middleware(SecurityHeaders)
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

    answers = Answers()

    # The calculator's own request is answered on the event loop (a cached answer, or ~0.5 ms of
    # Python); the heavier questions run in the thread pool (plain `def`).
    @app.post("/api/fit")
    async def fit(body: FitBody):
        return answers.get("fit", body, lambda: figures.fit(offer, body))

    @app.post("/api/advise")
    def advise(body: FitBody):
        return answers.get("advise", body, lambda: figures.advice(offer, body))

    @app.post("/api/fit/ngl-sweep")
    def ngl_sweep(body: FitBody):
        return answers.get("ngl", body, lambda: figures.ngl_sweep(offer, body))

    @app.post("/api/trace/load")
    def load(body: LoadBody):
        return answers.get("load", body, lambda: figures.load(offer, body))

    @app.post("/api/trace/decode")
    def decode(body: DecodeBody):
        return answers.get("decode", body, lambda: figures.decode(offer, body))

    @app.post("/api/trace/phases")
    def phases(body: PhasesBody):
        return answers.get("phases", body, lambda: figures.phases(offer, body))

    @app.post("/api/roofline")
    def roofline(body: RooflineBody):
        return answers.get("roofline", body, lambda: figures.roofline(offer, body))

    @app.post("/api/simulate")
    def simulate(body: SimBody):
        return answers.get("simulate", body, lambda: figures.simulate(offer, body))

    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    app.state.offer = offer
    app.state.answers = answers
    return app

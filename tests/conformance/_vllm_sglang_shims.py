"""Import shims for the engines' own Python code, installed without its dependencies.

The conformance suite installs vLLM's and SGLang's wheels with ``pip install --no-deps``: their
scheduler, KV-cache manager, block pool and radix cache are pure Python over torch (installed),
but their packages import, at module level, client and serving libraries that these parts never
call (ZeroMQ, aiohttp, OpenAI's types, uvloop, Prometheus, grammar backends, ...). Those
modules are served by :class:`UnusedModuleStub`: a module whose every attribute is an inert
class (subscriptable, usable as a pydantic field type), so that ``import zmq`` or
``from openai.types import X`` succeed and anything that really used them would do nothing.
Each stubbed name is listed in STUBBED with the reason; a stub is served only when the
import comes from vLLM's or SGLang's code and the real module is not installed (one package of
SGLang's own, REPLACED, is stubbed always); other tests in the same process are unaffected.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

# module (or package prefix) -> why its import may be stubbed
STUBBED = {
    "zmq": "vLLM/SGLang engine-core IPC sockets; the scheduler is driven in-process",
    "aiohttp": "HTTP client of the serving front end",
    "openai": "OpenAI API types of the serving front end",
    "openai_harmony": "gpt-oss chat format of the front end's parsers",
    "uvloop": "event loop of the serving front end",
    "prometheus_client": "metrics exporter",
    "xgrammar": "structured-output grammar backend (no structured output here)",
    "llguidance": "structured-output grammar backend",
    "partial_json_parser": "tool-call parser of the front end",
    "tvm_ffi": "SGLang's JIT kernel loader",
    "dill": "serialises SGLang's custom logit processors (none here)",
    "triton": "GPU kernel compiler, imported at the top of SGLang's utils (no kernel runs here)",
    "sglang.srt.layers.quantization": "SGLang's quantized linear layers (the KV pool module names their types)",
    "sglang.srt.layers.moe": "SGLang's MoE kernels (compiled with torch.compile at import)",
    "sglang.srt.configs": "SGLang's per-model HF config classes (vision models pull torchvision); "
                          "the radix cache and the scheduler's policy never read them",
}


class _InertMeta(type):
    def __new__(mcs, name, bases, ns, **kw):  # class X(Stub, total=False): keywords accepted
        return super().__new__(mcs, name, bases, ns)

    def __init__(cls, name, bases, ns, **kw):
        super().__init__(name, bases, ns)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(name)

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls

    def __iter__(cls):
        return iter(())


def _inert(name: str) -> type:
    def any_schema(cls, source, handler):  # a pydantic model may name it as a field type
        from pydantic_core import core_schema
        return core_schema.any_schema()

    return _InertMeta(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None,
                                 "__init_subclass__": classmethod(lambda cls, **kw: None),
                                 "__get_pydantic_core_schema__": classmethod(any_schema)})


class UnusedModuleStub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        v = _inert(name)
        setattr(self, name, v)
        return v


# stubbed even though it is installed (it is part of the engine's own package)
REPLACED = ("sglang.srt.configs", "sglang.srt.layers.quantization", "sglang.srt.layers.moe")
ENGINES = ("vllm", "sglang")


# stubbed only for SGLang's imports (vLLM probes for triton itself and runs without it)
SGLANG_ONLY = ("triton",)


def _importing_engine() -> str | None:
    """The engine ("vllm" or "sglang") whose module runs this import statement, if any (the nearest
    frame outside the import machinery), so that other code, other tests in the same process
    and torch's own probes (``import triton`` inside torch.compile) import as usual."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith("<frozen") or f.f_globals.get("__name__") in (
            __name__, "importlib", "importlib._bootstrap", "importlib._bootstrap_external", "importlib.util")):
        f = f.f_back
    root = f.f_globals.get("__name__", "").split(".")[0] if f is not None else ""
    return root if root in ENGINES else None


class _StubFinder:
    def find_spec(self, fullname, path, target=None):
        hit = next((s for s in STUBBED if fullname == s or fullname.startswith(s + ".")), None)
        engine = _importing_engine() if hit is not None else None
        if engine is None or (hit in SGLANG_ONLY and engine != "sglang"):
            return None
        if hit not in REPLACED:  # only what is not installed: a real module, when present, is used
            for finder in sys.meta_path:
                if finder is not self and getattr(finder, "find_spec", None) is not None:
                    if finder.find_spec(fullname, path, target) is not None:
                        return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        m = UnusedModuleStub(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def install() -> None:
    """Serve the STUBBED modules (first on sys.meta_path, so a package on disk is replaced too)."""
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        # torch's compiler probes for triton when first imported; let it find none (the truth here)
        # before a triton stub exists, so that SGLang's module-level torch.compile stays inert
        import torch._inductor.compile_fx  # noqa: F401
        sys.meta_path.insert(0, _StubFinder())

"""The engines the simulator models, by the names the CLI and the reports use."""

from __future__ import annotations

from ..errors import UnknownNameError
from .paged import PagedManager
from .radix import RadixManager
from .slots import SlotManager

# engine name -> KV manager class (llama.cpp's server slots, vLLM v1's paged blocks, SGLang's radix tree)
ENGINES = {"llamacpp": SlotManager, "vllm": PagedManager, "sglang": RadixManager}
# the seed lesson's names for the same three managers
SEED_NAMES = {"slots": "llamacpp", "paged": "vllm", "radix": "sglang"}


def manager_class(engine: str):
    """The KV manager class of an engine name ("llamacpp", "vllm", "sglang")."""
    if engine not in ENGINES:
        raise UnknownNameError("engine", engine, ENGINES)
    return ENGINES[engine]

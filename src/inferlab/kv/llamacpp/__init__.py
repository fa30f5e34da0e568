"""llama.cpp's server in the simulator: slots (slots.py), the server loop (server.py) and the
host-RAM prompt cache (prompt_cache.py). Rules and their sources: docs/engines/llamacpp.md."""

from .prompt_cache import CachedPrompt, PromptCache, seq_state_bytes
from .server import LLAMACPP_VERSIONS, SlotManager
from .slots import Slot, SlotState, SlotTask

__all__ = ["CachedPrompt", "LLAMACPP_VERSIONS", "PromptCache", "Slot", "SlotManager", "SlotState", "SlotTask",
           "seq_state_bytes"]

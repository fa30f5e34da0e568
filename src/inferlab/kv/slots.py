"""llama.cpp server's slots: the simulator's model lives in :mod:`inferlab.kv.llamacpp`.

``slots.py`` there holds the per-slot and per-task state, ``server.py`` the server loop
(``SlotManager``), ``prompt_cache.py`` the host-RAM prompt cache. This module keeps the old import
path (``from inferlab.kv.slots import SlotManager``).
"""

from .llamacpp.prompt_cache import PromptCache, seq_state_bytes
from .llamacpp.server import AUTO_N_PARALLEL, DEFAULT_KV_BYTES_PER_TOKEN, LLAMACPP_VERSIONS, SlotManager
from .llamacpp.slots import Slot, SlotState, SlotTask

__all__ = ["AUTO_N_PARALLEL", "DEFAULT_KV_BYTES_PER_TOKEN", "LLAMACPP_VERSIONS", "PromptCache", "Slot",
           "SlotManager", "SlotState", "SlotTask", "seq_state_bytes"]

"""The seed's KV-cache managers, made faithful to the engines: importable by the seed's names.

>>> from inferlab.kv_managers import compare
>>> for name, run in compare(capacity_tokens=384).items():
...     s = run["summary"]

``SlotManager`` is llama.cpp's server (slots), ``PagedManager`` vLLM v1 (paged blocks with
prefix caching), ``RadixManager`` SGLang (radix tree). Each takes ``capacity_tokens`` (the KV
pool, in tokens) first; every other option defaults to the engine's own default. See
``inferlab.kv.slots``, ``inferlab.kv.paged`` and ``inferlab.kv.radix`` for the rules.
"""

from __future__ import annotations

from .kv.paged import PagedManager
from .kv.registry import ENGINES
from .kv.registry import SEED_NAMES as _SEED_ENGINE
from .kv.radix import RadixManager
from .kv.simulator import Request, Run, simulate
from .kv.slots import SlotManager
from .kv.workloads import seed_chat

__all__ = ["Request", "SlotManager", "PagedManager", "RadixManager", "simulate", "compare", "Run",
           "ENGINES"]

SEED_NAMES = {seed: ENGINES[engine] for seed, engine in _SEED_ENGINE.items()}  # seed name -> manager class


def compare(capacity_tokens: int = 384, requests=None, time_model=None) -> dict[str, Run]:
    """Run one workload (default: the seed's chat) through the three managers at one capacity.

    Returns ``{"slots": run, "paged": run, "radix": run}``. Each manager runs with its engine's
    defaults except two documented choices for llama.cpp: ``cache_ram_mib=0`` (no host-RAM
    prompt cache), the seed's "reuse only what is still in the slot a request lands in", and
    ``ctx_pad=1``: exactly ``capacity_tokens`` cells (llama-server pads ``-c`` to 256: 384 -> 512).

    The seed's workload, as read here (``inferlab.kv.workloads.seed_chat``): a 48-token system
    prompt; four users whose first message is 12 tokens, answered by a 16-token reply; the second
    turn repeats the first turn and its reply and adds a 27-token message (8-token reply).
    Prompt tokens: 4 x (60 + 103) = 652, the seed's total. Users start 4 steps apart and send
    their second turn 30 steps after their first (a step is one unit of time). These lengths
    were chosen by a search over natural readings (equal users, open-loop arrivals) for the
    closest match to the seed's table.

    Figures at capacity 384 (the seed's in brackets):
      slots  prefill computed 379 [376], peak concurrency 4 [4], preemptions 0 [0]
      paged  prefill computed 252 [268], peak concurrency 4 [5], preemptions 0 [0]
      radix  prefill computed 208 [208], peak concurrency 4 [5], preemptions 0 [0]
    Why not exactly: with vLLM's rules the 48-token system prompt is three full blocks, so each
    later first turn hits 48 and each second turn hits 64 (the longest whole-block prefix of
    turn 1 + reply, 75 tokens); 268 would need one of those hits 16 tokens shorter, which no
    equal-length reading gave together with radix 208. A peak concurrency of 5 needs a user's
    second turn to run while its own first turn still runs (four users); with turn-1 lengths
    that give radix 208 the pool of 384 tokens never held five requests at once in the
    readings searched (stagger 0-8 steps, think time 4-30 steps). llama.cpp recomputes 379:
    each first turn lands in an empty slot (4 x 60), three second turns find their own slot
    (3 x 28) and the fourth finds its slot purged when the unified 384-cell buffer ran out,
    reusing only the system prompt from another slot (55).
    """
    if requests is None:
        requests = seed_chat()
    requests = list(requests)
    managers = {
        "slots": SlotManager(capacity_tokens=capacity_tokens, cache_ram_mib=0, ctx_pad=1),
        "paged": PagedManager(capacity_tokens=capacity_tokens),
        "radix": RadixManager(capacity_tokens=capacity_tokens),
    }
    return {name: simulate(requests, m, time_model=time_model) for name, m in managers.items()}

"""Figure 1's memory tiers, step by step: which part of each device's memory a load step fills.

``perf.trace.load_steps`` says what llama.cpp does in order (``Step.name`` and ``Step.where``);
this reads each step as a change of state of one segment of a device's memory bar (weights
mapped or resident, KV cache allocated, compute buffers reserved, an allocation that fails), so
the page draws the bars of ``fit`` filling in the trace's order without computing anything.
"""

from __future__ import annotations

from typing import Any

SEGMENTS = ("weights", "kv", "buffers")


def _effect(name: str, where: str, labels: list[str]) -> tuple[int, str, str] | None:
    """(device index, segment, new state) of one step, or None (reads nothing into memory)."""
    def by_label(text: str) -> int | None:
        for i in sorted(range(len(labels)), key=lambda i: -len(labels[i])):  # "RTX 3090 #1" before "RTX 3090"
            if labels[i] in text:
                return i
        return None

    if name in ("read header",):
        return None
    if name == "mmap the file":
        return (0, "weights", "mapped")
    if name.startswith("copy ") and " to " in name:
        i = by_label(name.rsplit(" to ", 1)[1])
        return None if i is None else (i, "weights", "resident")
    if name.startswith("map ") and "'s buffers" in name:
        i = by_label(name)
        return None if i is None else (i, "weights", "mapped")
    if name.startswith("allocate and clear the KV cache"):
        i = by_label(where)
        return None if i is None else (i, "kv", "allocated")
    if name.startswith("reserve compute buffers"):
        i = by_label(where)
        return None if i is None else (i, "buffers", "allocated")
    if name.startswith("warm-up pass pages in"):
        if "GPU" in name:
            return (len(labels) - 1, "weights", "resident")
        return (0, "weights", "resident")
    if name.startswith("allocation fails on"):
        i = by_label(name)
        return None if i is None else (i, "weights", "failed")
    raise KeyError(name)


def tier_states(steps: list[dict[str, Any]], labels: list[str]) -> list[list[dict[str, str]]]:
    """After each step, every device's segments: "empty", "mapped", "resident", "allocated" or
    "failed". ``labels``: perf.trace.device_labels of the placement (host first, as fit's devices)."""
    state = [{s: "empty" for s in SEGMENTS} for _ in labels]
    out = []
    for st in steps:
        try:
            eff = _effect(st["name"], st["where"], labels)
        except KeyError:
            eff = None  # a step this figure does not know yet: it changes no bar (tests list every step name)
        if eff is not None:
            i, seg, new = eff
            state[i][seg] = new
        out.append([dict(d) for d in state])
    return out


def known(name: str, where: str, labels: list[str]) -> bool:
    try:
        _effect(name, where, labels)
        return True
    except KeyError:
        return False

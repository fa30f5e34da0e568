"""Figure 6's frames: the simulator's own per-step events, replayed into what each engine holds.

``kv.simulator.simulate(record_events=True)`` logs what every step did (``kv/events.py``). This
replays that log, step by step, into the state the page draws: vLLM's blocks (who holds each one,
its prefix hash once full, cached or free) and SGLang's radix-tree nodes (tokens per node, locked
while a running request matched them) with its private cells. Nothing is re-decided here: every
change comes from an event, and after every step the replay's token counts must equal the
simulator's own (``kv_used_tokens + kv_cached_tokens``); a mismatch is an error, not a picture.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidValueError

MAX_CELLS_X_STEPS = 200_000  # block or node snapshots per run the page receives (else counts only)


def _short(h: int) -> str:
    return f"{h & 0xFFFFFFFF:08x}"  # the low 32 bits of the simulator's 64-bit chained block key, for display


def vllm_frames(steps: list[dict[str, Any]], n_blocks: int, block_size: int) -> list[list[list]]:
    """Per step, per block (0 is vLLM's null block): [holders, hash or None], holders a list of request ids."""
    holders: dict[int, list] = {}
    bhash: dict[int, str] = {}
    frames = []
    for st in steps:
        for e in st["events"]:
            k = e["kind"]
            if k == "allocate":
                for b in e["blocks"]:
                    holders[b] = [e["request"]]
            elif k == "prefix_hit":
                for b in e["blocks"]:
                    holders.setdefault(b, []).append(e["request"])
            elif k == "free":
                for b in e["blocks"]:
                    held = holders.get(b, [])
                    if e["request"] in held:
                        held.remove(e["request"])
            elif k == "cache":
                for b, h in zip(e["blocks"], e["hashes"]):
                    bhash[b] = _short(h)
            elif k == "evict":
                for b in e["blocks"]:
                    bhash.pop(b, None)
        used = sum(1 for b in holders if holders[b])
        cached = sum(1 for b in bhash if not holders.get(b))
        if (used * block_size, cached * block_size) != (st["kv_used_tokens"], st["kv_cached_tokens"]):
            raise InvalidValueError(f"vLLM replay at step {st['step']}: {used} blocks in use and {cached} cached, but the simulator "
                                    f"says {st['kv_used_tokens']} and {st['kv_cached_tokens']} tokens")
        frames.append([[list(holders.get(b, [])), bhash.get(b)] for b in range(n_blocks)])
    return frames


def sglang_frames(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: the tree's nodes [[node, tokens, locked_by], ...], its cells and the private cells."""
    size: dict[int, int] = {}
    locks: dict[Any, int] = {}  # running request -> the node its prefix match ended at (locked with its path)
    tree = private = 0
    frames = []
    for st in steps:
        for e in st["events"]:
            k = e["kind"]
            if k == "allocate":
                private += e["tokens"]
            elif k == "free":
                private -= e["tokens"]
                locks.pop(e["request"], None)
            elif k in ("finish", "preempt"):
                locks.pop(e.get("request"), None)
            elif k == "prefix_hit":
                if e.get("node"):
                    locks[e["request"]] = e["node"]
            elif k == "cache":
                tree += e["new_tokens"]
                private -= e.get("from_request", 0)
                if e.get("node") is not None and e["new_tokens"]:
                    size[e["node"]] = size.get(e["node"], 0) + e["new_tokens"]
            elif k == "evict":
                tree -= e["tokens"]
                for n in e["nodes"]:
                    size.pop(n, None)
        if tree + private != st["kv_used_tokens"] + st["kv_cached_tokens"]:
            raise InvalidValueError(f"SGLang replay at step {st['step']}: {tree} tree + {private} private cells, but the simulator "
                                    f"says {st['kv_used_tokens']} + {st['kv_cached_tokens']}")
        locked: dict[int, list] = {}
        for r, n in locks.items():
            locked.setdefault(n, []).append(r)
        frames.append({"tree_tokens": tree, "private_tokens": private,
                       "nodes": [[n, t, locked.get(n, [])] for n, t in sorted(size.items())]})
    return frames


def frames_for(engine: str, steps: list[dict[str, Any]], config: dict[str, Any], capacity_tokens: int) -> dict[str, Any] | None:
    """The drawable state of one engine's run, or None when it would be too large to send."""
    if engine == "vllm":
        bs = int(config.get("block_size", 16))
        n_blocks = capacity_tokens // bs + 1  # + vLLM's null block 0
        if n_blocks * len(steps) > MAX_CELLS_X_STEPS:
            return None
        return {"kind": "blocks", "block_size": bs, "n_blocks": n_blocks, "frames": vllm_frames(steps, n_blocks, bs)}
    if engine == "sglang":
        f = sglang_frames(steps)
        if sum(len(x["nodes"]) for x in f) > MAX_CELLS_X_STEPS:
            return None
        return {"kind": "tree", "frames": f}
    return None

"""The workloads run on a real llama-server and on SlotManager (see _llama_server.py).

Each sequential case is one server configuration and a list of requests sent one at a time;
the comment of each says which rule of llama.cpp's server it exercises (docs/engines/llamacpp.md).
Prompts are pseudo-random token ids (``seg(seed, n)``); ("reply", k) / ("prompt", k) repeat
request k's reply / prompt, so later turns continue earlier conversations.
"""

from __future__ import annotations

from _llama_server import Case, ConcurrentCase, Turn
from _llama_server import segment as seg


def R(k):  # request k's reply
    return ("reply", k)


def P(k):  # request k's prompt
    return ("prompt", k)


def T(*parts, n=3):
    return Turn(tuple(parts), n)


SEQUENTIAL = [
    Case("unified-np4", ("-np", "4", "--kv-unified", "-c", "1024", "--cache-ram", "0"),
         dict(capacity_tokens=1024, n_parallel=4, kv_unified=True, cache_ram_mib=0),
         (T(seg(1, 30), seg(2, 20), n=4),          # fresh server: the highest slot (3)
          T(seg(3, 40)),                           # next never-used slot (2)
          T(P(0), R(0), seg(4, 10)),               # continues 0: similarity picks its slot
          T(seg(1, 30), seg(5, 15), n=2),          # shares 0's system prompt: same slot, keeps 30
          T(P(1)),                                 # repeats 1: all but the last token
          T(seg(6, 20)), T(seg(7, 20)),            # unrelated: LRU, last of ties
          T(seg(8, 25)), T(P(1), R(4), seg(9, 5))),
         "per-slot reuse, last-token rule, similarity vs LRU (highest id among never-used slots)",
         ("selected slot by LCP similarity", "selected slot by LRU", "need to evaluate at least 1 token")),
    Case("unified-overflow", ("-np", "3", "--kv-unified", "-c", "512", "--cache-ram", "0"),
         dict(capacity_tokens=512, n_parallel=3, kv_unified=True, cache_ram_mib=0),
         (T(seg(11, 200), n=2), T(seg(12, 200), n=2),
          T(seg(13, 150), n=2),                    # 110 cells free < 150: purge the first idle slot by id
          T(P(0), seg(14, 10), n=2),               # slot of request 0 survived
          T(P(1), n=2),                            # 1's slot was purged; another purge for room
          T(P(0), seg(14, 10), seg(15, 5), n=2),
          T(seg(16, 300), n=20)),                  # a long one: purges until it fits
         "unified buffer full: try_clear_idle_slots purges by id", ("purging slot 1 with 201 tokens",)),
    Case("split-np3", ("-np", "3", "-c", "1000", "--cache-ram", "0"),
         dict(capacity_tokens=1000, n_parallel=3, cache_ram_mib=0),
         (T(seg(21, 400), n=3),                    # > 1000 // 3: runs, slots are pad256(341) = 512
          T(seg(22, 511), n=4),                    # 511 + 1 >= 512: one token, truncated
          T(seg(23, 600), n=2),                    # >= 512: fails after taking (and stamping) a slot
          T(seg(24, 50), n=2),                     # LRU sees the failed slot as recently used
          T(seg(25, 480), n=40),                   # stops at the slot context: 32 tokens
          T(P(0), R(0), seg(26, 8), n=2)),
         "split KV sizes, rejection in update_slots, truncation at the slot context",
         ("n_ctx_slot = 512", "exceeds the available context size", "truncated = 1")),
    Case("ram-1mib", ("-np", "1", "-c", "1024", "--cache-ram", "1"),
         dict(capacity_tokens=1024, n_parallel=1, cache_ram_mib=1),
         (T(seg(31, 100), n=2), T(seg(32, 120), n=2),
          T(seg(33, 300), n=2),                    # its state (301 x 4,108 B + 112) > 1 MiB: never saved
          T(seg(34, 50), n=2),                     # saving 50 evicts the oldest (request 0)
          T(P(1), seg(35, 20), n=2),               # request 1's state is loaded from RAM
          T(P(0), seg(35, 20), n=2),               # request 0's was evicted
          T(P(2), n=2)),
         "RAM cache: whole-state entry sizes, oversize skip, oldest-first eviction, load",
         ("exceeds cache size limit", "removing oldest entry")),
    Case("ram-idle-unified", ("-np", "2", "--kv-unified", "-c", "1024", "--cache-ram", "8"),
         dict(capacity_tokens=1024, n_parallel=2, kv_unified=True, cache_ram_mib=8),
         (T(seg(41, 100)), T(seg(42, 100)),
          T(P(0), R(0), seg(43, 10)),              # 0's slot was cleared when 1 launched: from RAM
          T(P(1), R(1), seg(44, 10)),
          T(P(2), R(2), seg(45, 6)), T(seg(46, 60)), T(P(3), n=2)),
         "--cache-idle-slots with unified KV: idle slots saved to RAM and cleared at each launch",
         ("clearing prompt with",)),
    Case("noidle-unified", ("-np", "2", "--kv-unified", "-c", "1024", "--cache-ram", "8", "--no-cache-idle-slots"),
         dict(capacity_tokens=1024, n_parallel=2, kv_unified=True, cache_ram_mib=8, cache_idle_slots=False),
         (T(seg(41, 100)), T(seg(42, 100)),
          T(P(0), R(0), seg(43, 10)), T(P(1), R(1), seg(44, 10)),
          T(seg(46, 60)),                          # LRU: the slot is saved to RAM first
          T(P(2), R(2), seg(45, 6)), T(P(3), n=2)),
         "idle slots keep their KV; LRU choice saves to and loads from RAM"),
    Case("cache-reuse", ("-np", "1", "-c", "1024", "--cache-ram", "0", "--cache-reuse", "8"),
         dict(capacity_tokens=1024, n_parallel=1, cache_ram_mib=0, cache_reuse=8),
         (T(seg(51, 20), seg(52, 10), seg(53, 40), n=2),
          T(seg(51, 20), seg(53, 40), seg(54, 5), n=2),   # Y dropped: X (40) shifted into place
          T(P(1), seg(55, 4), n=2),
          T(seg(53, 40), seg(51, 20), n=2),               # X first: the chunk found after a skip
          T(seg(51, 20), seg(54, 5), seg(56, 30), n=2),   # a 5-token chunk is under the minimum
          T(seg(57, 7), seg(51, 20), seg(54, 5), n=2)),
         "--cache-reuse chunk shifting", ("reusing chunk with size 40",)),
    Case("no-cache-prompt", ("-np", "2", "-c", "1024", "--cache-ram", "0", "--no-cache-prompt"),
         dict(capacity_tokens=1024, n_parallel=2, cache_ram_mib=0, cache_prompt=False),
         (T(seg(61, 50)), T(P(0), R(0), seg(62, 5)), T(seg(63, 40)), T(P(2), n=2)),
         "cache_prompt off: nothing reused, slots still chosen by similarity"),
    Case("sps-0-ram", ("-np", "2", "-c", "1024", "--cache-ram", "8", "-sps", "0"),
         dict(capacity_tokens=1024, n_parallel=2, cache_ram_mib=8, slot_prompt_similarity=0.0),
         (T(seg(71, 80)), T(seg(72, 80)), T(P(0), R(0), seg(73, 5)), T(P(1), R(1), seg(74, 5)),
          T(seg(75, 30)), T(P(2), n=2)),
         "--slot-prompt-similarity 0: always LRU, the RAM cache restores conversations"),
]


def G(*turns):
    return tuple(turns)


# Concurrent groups: every prompt length in a case is unique (the server's log names tasks by it).
CONCURRENT = [
    ConcurrentCase("overflow-pair", ("-np", "2", "--kv-unified", "-c", "512", "--cache-ram", "0"),
                   dict(capacity_tokens=512, n_parallel=2, kv_unified=True, cache_ram_mib=0),
                   (G(T(seg(101, 150), n=200), T(seg(102, 152), n=200)),   # both run out of cells
                    G(T(seg(103, 60), n=4), T(seg(104, 64), n=4)),         # LRU after the id-order release
                    G(T(P(2), R(2), seg(105, 5), n=3), T(P(3), R(3), seg(106, 7), n=3))),
                   "context exceeded with two running slots, then slot choice"),
    ConcurrentCase("defer-4", ("-np", "2", "--kv-unified", "-c", "2048", "--cache-ram", "8"),
                   dict(capacity_tokens=2048, n_parallel=2, kv_unified=True, cache_ram_mib=8),
                   (G(T(seg(111, 40), n=8), T(seg(112, 41), n=8), T(seg(113, 42), n=8), T(seg(114, 43), n=8)),
                    G(T(P(0), R(0), seg(115, 3), n=4), T(P(1), R(1), seg(116, 4), n=4),
                      T(P(2), R(2), seg(117, 5), n=4), T(P(3), R(3), seg(118, 6), n=4)),
                    G(T(seg(119, 30), n=4), T(seg(120, 31), n=4), T(seg(121, 32), n=4))),
                   "deferred tasks, idle-slot caching, RAM loads under concurrency"),
    ConcurrentCase("split-shared", ("-np", "3", "-c", "1536", "--cache-ram", "0"),
                   dict(capacity_tokens=1536, n_parallel=3, cache_ram_mib=0),
                   (G(T(seg(131, 100), seg(132, 10), n=6), T(seg(131, 100), seg(133, 11), n=6),
                      T(seg(131, 100), seg(134, 12), n=6)),
                    G(T(P(0), R(0), seg(135, 4), n=4), T(P(1), R(1), seg(136, 5), n=4),
                      T(P(2), R(2), seg(137, 6), n=4)),
                    G(T(seg(131, 100), seg(138, 27), n=4), T(seg(131, 100), seg(139, 28), n=4),
                      T(seg(140, 50), n=4), T(seg(141, 51), n=4))),
                   "split KV, a shared system prompt, similarity under concurrency, one deferred"),
]


def random_turns(seed: int, n: int, *, max_len: int, sys_lens=(48, 96)) -> tuple[Turn, ...]:
    """A reproducible mix: new prompts (some behind a shared system prompt), follow-ups of earlier
    conversations (prompt + reply + a new message), exact repeats, follow-ups re-sent without
    the reply they quoted (an edited history: what --cache-reuse shifts), and now and then a
    prompt near ``max_len``."""
    import random

    rng = random.Random(seed)
    systems = [seg(1000 * seed + k, m) for k, m in enumerate(sys_lens)]
    turns: list[Turn] = []
    length: list[int] = []  # expected prompt + reply length of each turn
    for k in range(n):
        kind = rng.choices(["new", "system", "follow", "repeat", "edit", "long"], [3, 3, 5, 1, 2, 1])[0]
        n_predict = rng.choice([1, 2, 3, 5, 8])
        fresh = seg(1000 * seed + 100 + k, rng.randint(5, 60))
        j = rng.randrange(len(turns)) if turns else None
        if kind == "follow" and (j is None or length[j] + len(fresh) + n_predict >= max_len):
            kind = "new"
        if kind in ("repeat", "edit") and j is None:
            kind = "new"
        if kind == "edit":  # the latest follow-up, while its slot likely still holds it
            quoting = [i for i, t in enumerate(turns) if any(isinstance(p, tuple) and p[0] == "reply" for p in t.parts)]
            if quoting:
                j = quoting[-1]
            else:
                kind = "repeat"
        if kind == "follow":
            parts, plen = (P(j), R(j), fresh), length[j] + len(fresh)
        elif kind == "edit":  # turn j without the reply it quoted
            parts = tuple(p for p in turns[j].parts if not (isinstance(p, tuple) and p[0] == "reply"))
            i = next(p[1] for p in turns[j].parts if isinstance(p, tuple) and p[0] == "reply")
            plen = length[j] - turns[j].n_predict - turns[i].n_predict
        elif kind == "repeat":
            parts, plen = (P(j),), length[j] - turns[j].n_predict
        elif kind == "system":
            s = rng.choice(systems)
            parts, plen = (s, fresh), len(s) + len(fresh)
        elif kind == "long":
            big = seg(1000 * seed + 500 + k, rng.randint(max_len - 120, max_len - 10))
            parts, plen = (big,), len(big)
        else:
            parts, plen = (fresh,), len(fresh)
        turns.append(Turn(parts, n_predict))
        length.append(plen + n_predict)
    return tuple(turns)


SEQUENTIAL_RANDOM = [
    Case("random-unified-ram", ("-np", "4", "--kv-unified", "-c", "1024", "--cache-ram", "1"),
         dict(capacity_tokens=1024, n_parallel=4, kv_unified=True, cache_ram_mib=1),
         random_turns(1, 24, max_len=600), "unified, RAM cache of 1 MiB, idle-slot caching"),
    Case("random-split-reuse", ("-np", "2", "-c", "900", "--cache-ram", "0", "--cache-reuse", "16"),
         dict(capacity_tokens=900, n_parallel=2, cache_ram_mib=0, cache_reuse=16),
         random_turns(9, 24, max_len=560), "split KV (2 x 512), --cache-reuse 16, prompts over the slot"),
    Case("random-unified-noidle", ("-np", "3", "--kv-unified", "-c", "512", "--cache-ram", "2", "--no-cache-idle-slots"),
         dict(capacity_tokens=512, n_parallel=3, kv_unified=True, cache_ram_mib=2, cache_idle_slots=False),
         random_turns(3, 24, max_len=400), "unified 512 cells, idle slots keep KV: purges for room"),
    Case("random-split-sps", ("-np", "3", "-c", "1536", "--cache-ram", "1", "-sps", "0.5"),
         dict(capacity_tokens=1536, n_parallel=3, cache_ram_mib=1, slot_prompt_similarity=0.5),
         random_turns(4, 24, max_len=500), "split KV, similarity threshold 0.5, RAM cache"),
]

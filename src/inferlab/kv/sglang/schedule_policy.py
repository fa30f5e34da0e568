"""SGLang's ``SchedulePolicy`` and ``PrefillAdder`` (``sglang/srt/managers/schedule_policy.py``):
the order of the waiting queue, and the budgets a prefill batch is built under.

Rules (docs/engines/sglang.md, "Waiting-queue policies", "Building a prefill batch"):
* ``fcfs`` (default): arrival order; ``lpm``: longest prefix match first (FCFS above 128
  waiting); ``dfs-weight``: heavier subtrees first, a node's own requests after its children;
* admission uses ``rem_total_tokens`` (free + evictable minus the running requests' reserved
  future tokens scaled by ``new_token_ratio``, minus what this round admitted),
  ``max_prefill_tokens`` and ``chunked_prefill_size``, with at most one chunked request.

Not modelled: the in-batch prefix check that deprioritises waiting requests sharing an
uncached prefix (cache-aware policies only), ``--enable-mixed-chunk``, priority scheduling.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

from .radix_cache import Node, RadixCache

SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight")
CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.CLIP_MAX_NEW_TOKENS
WAITING_QUEUE_PREFIX_MATCH_MAX = 128  # lpm falls back to fcfs above this many waiting
_out_len, _num_output = attrgetter("out_len"), attrgetter("num_output")


def calc_priority(policy: str, waiting, tree: RadixCache, match: Callable):
    """The waiting queue in the policy's order (``SchedulePolicy.calc_priority``). FCFS returns
    the queue itself (admitted requests leave from its head); ``match(seq)`` is the scheduler's
    prefix match, (matched tokens, last node)."""
    if policy == "fcfs":
        return waiting
    if policy == "lpm":
        if len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            return waiting
        keyed = [(match(s)[0], s) for s in waiting]
        return [s for _, s in sorted(keyed, key=lambda x: -x[0])]
    # dfs-weight: heavier subtrees first, a node's own requests after its children
    by_node: dict[Node, list] = {}
    weight: dict[Node, int] = {}
    for s in waiting:
        node = match(s)[1]
        by_node.setdefault(node, []).append(s)
        while node is not None:
            weight[node] = weight.get(node, 0) + 1
            node = node.parent
    out: list = []

    def visit(node: Node) -> None:
        kids = sorted((c for c in node.children.values() if c in weight), key=lambda c: -weight[c])
        for c in kids:
            visit(c)
        out.extend(by_node.get(node, ()))

    visit(tree.root)
    return out


def reserved_by_running(running, new_token_ratio: float) -> float:
    """PrefillAdder's reservation: each running request's remaining new tokens, clipped to
    CLIP_MAX_NEW_TOKENS, times the new-token ratio."""
    if not running:
        return 0 * new_token_ratio
    if max(map(_out_len, running)) <= CLIP_MAX_NEW_TOKENS:  # nothing to clip: sums at C speed
        return (sum(map(_out_len, running)) - sum(map(_num_output, running))) * new_token_ratio
    return sum(min(s.out_len - s.num_output, CLIP_MAX_NEW_TOKENS) for s in running) * new_token_ratio


# add_one_req's outcomes
ADDED, ADDED_CHUNKED, NO_TOKEN, OTHER = "added", "added_chunked", "no_token", "other"


class PrefillAdder:
    """The budgets of one prefill round, and the requests it takes: ``adds`` lists (request,
    tokens computed this round). ``room()`` is the token pool's free plus evictable cells now."""

    def __init__(self, tree: RadixCache, room: Callable[[], int], page_size: int, *, max_prefill_tokens: int,
                 chunked_prefill_size: int | None, reserved: float):
        self.tree = tree
        self.room = room
        self.page_size = page_size
        self.rem_input = max_prefill_tokens
        self.rem_chunk = chunked_prefill_size
        self.reserved = reserved
        self.offset = 0  # tokens this round has taken (extends and admitted requests' futures)
        self.adds: list[tuple[object, int]] = []

    def add_chunked_req(self, seq) -> bool:
        """The chunked request continues first; True when this is its last chunk."""
        p = self.page_size
        extend = seq.num_tokens - seq.num_computed
        last = False
        room = self.room()
        if extend > room:  # simulator guard: SGLang would fail the prefill; wait for memory
            extend = room - room % p
        rem_chunk = self.rem_chunk
        if rem_chunk is not None and extend > rem_chunk:
            extend = rem_chunk - rem_chunk % p
        elif extend == seq.num_tokens - seq.num_computed:
            last = True
        if extend > 0:
            self.adds.append((seq, extend))
        self.rem_input -= extend
        if rem_chunk is not None:
            self.rem_chunk = rem_chunk - extend
        self.offset += extend
        return last

    def add_one_req(self, seq, prefix_len: int, node: Node) -> tuple[str, int]:
        """Try to admit ``seq`` with its matched prefix (``prefix_len`` tokens ending at
        ``node``): (outcome, tokens it computes this round). On ADDED / ADDED_CHUNKED its
        prefix stays locked; on NO_TOKEN (the pool is short: the batch is full) or OTHER (the
        prefill budget is spent) the round stops."""
        p = self.page_size
        extend = seq.num_tokens - prefix_len
        future = min(seq.out_len - seq.num_output, CLIP_MAX_NEW_TOKENS)
        self.tree.inc_lock(node)  # the budget is checked with the prefix locked (_lock_node)
        rem_total = self.room() - self.reserved - self.offset
        outcome, chunk = ADDED, extend
        if extend + future >= rem_total:
            outcome = NO_TOKEN
        elif extend >= self.rem_input and self.adds:
            outcome = OTHER
        elif self.rem_chunk is not None and extend > self.rem_chunk:
            chunk = self.rem_chunk - self.rem_chunk % p
            outcome = OTHER if chunk <= 0 else ADDED_CHUNKED
        if outcome in (NO_TOKEN, OTHER):
            self.tree.dec_lock(node)
            return outcome, 0
        self.adds.append((seq, chunk))
        self.offset += chunk + (future if outcome == ADDED else 0)
        self.rem_input -= chunk
        if self.rem_chunk is not None:
            self.rem_chunk -= chunk
        return outcome, chunk

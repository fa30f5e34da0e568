"""SGLang's ``SchedulePolicy`` and ``PrefillAdder`` (``sglang/srt/managers/schedule_policy.py``):
the order of the waiting queue, and the budgets a prefill batch is built under.

Rules (docs/engines/sglang.md, "Waiting-queue policies", "Building a prefill batch"):
* ``fcfs`` (default): arrival order; ``lpm``: longest prefix match first (FCFS above 128
  waiting); ``dfs-weight``: heavier subtrees first, a node's own requests after its children;
* cache-aware policies sort the queue in place (a later FCFS fallback keeps that order); a
  request whose tree match is at most 32 tokens but that shares 32+ tokens with an earlier
  waiting request is sorted last (in-batch prefix deprioritisation, ``lpm``);
* 0.5.23, ``fcfs``: every 32nd priority computation touches the cached prefixes of the first 128
  waiting requests, the head last (``_touch_waiting_prefixes``);
* admission uses ``rem_total_tokens`` (free + evictable minus the running requests' reserved
  future tokens scaled by ``new_token_ratio``, minus what this round admitted),
  ``max_prefill_tokens`` and ``chunked_prefill_size``, with at most one chunked request.
  0.5.2: a request fits when ``extend + min(max_new_tokens, 4096) < rem_total`` (its whole
  max_new, also when resumed after a retraction) and reserves its page-ceiled extend and
  (unless chunked) ``min(max_new_tokens, 4096)``; a page-ceiled extend of at least what is
  left of ``max_prefill_tokens`` stops the round, chunked or not; the chunked request's next
  chunk is ``min(rem_chunk, int(rem_total))`` and its last chunk reserves
  ``min(max_new_tokens, 4096)``. 0.5.23 (``PrefillBudget``): it fits when
  ``extend + future + page_size < rem_total`` (``future``: what is left to generate) and
  reserves its page-ceiled extend, one page and (unless chunked) ``min(max_new_tokens, 4096)``,
  its whole budget even when resumed after a retraction; an extend is compared with
  ``max_prefill_tokens`` only with chunked prefill off. Both versions stop the round after an
  admission that spends a budget (``add_one_req`` returns ``budget_state()``).

Not modelled: ``--enable-mixed-chunk``, priority scheduling, ``hrrn`` and the other 0.5.23
policies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from itertools import islice
from operator import attrgetter

from .radix_cache import Node, RadixCache

SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight")
CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.CLIP_MAX_NEW_TOKENS
WAITING_QUEUE_PREFIX_MATCH_MAX = 128  # lpm falls back to fcfs above this many waiting; 0.5.23's refresh touches this many
WAITING_PREFIX_REFRESH_INTERVAL = 32  # 0.5.23: fcfs touches the waiting prefixes every 32nd calc_priority
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32  # tree match at most this: check against the waiting requests
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32  # ... and sharing at least this with one: sorted last
_out_len, _num_output = attrgetter("out_len"), attrgetter("num_output")


def calc_priority(policy: str, waiting, tree: RadixCache):
    """The waiting queue in the policy's order (``SchedulePolicy.calc_priority``). FCFS returns
    the queue itself (admitted requests leave from its head); the cache-aware policies return
    a sorted list, which the scheduler keeps as its queue (SGLang sorts in place). Their match
    walks each request's whole tokens (``match_kv_cache`` without a limit); the sort key is
    capped at ``num_tokens - 1`` (``num_matched_prefix_tokens``)."""
    if policy == "fcfs":
        return waiting
    if policy == "lpm":
        if len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            return waiting
        keyed = [(tree.match_prefix(s.runs, s.num_tokens)[0], s) for s in waiting]
        late = _deprioritized(keyed)
        return [s for _, s in sorted(keyed, key=lambda x: float("inf") if id(x[1]) in late
                                     else -min(x[0], x[1].num_tokens - 1))]
    # dfs-weight: heavier subtrees first, a node's own requests after its children
    by_node: dict[Node, list] = {}
    weight: dict[Node, int] = {}
    matched = [(s, tree.match_prefix(s.runs, s.num_tokens)[1]) for s in waiting]  # all matches (and splits) first
    for s, node in matched:
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


def _deprioritized(keyed) -> set[int]:
    """In-batch prefix caching (``_compute_prefix_matches``): a request whose tree match is at
    most 32 tokens is matched against a scratch tree of the waiting requests seen so far (their
    whole tokens); 32+ shared tokens sort it last, otherwise its tokens join the scratch tree."""
    scratch = RadixCache(1)
    late: set[int] = set()
    for matched, s in keyed:
        if matched > IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
            continue
        if scratch.match_prefix(s.runs, s.num_tokens)[0] >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
            late.add(id(s))
        else:
            scratch.insert(s.runs, s.num_tokens)
    return late


def touch_waiting_prefixes(waiting, tree: RadixCache) -> None:
    """0.5.23's waiting-prefix refresh: touch (as a match does, splitting included) the cached
    prefix of each of the first 128 waiting requests' whole tokens, the head last."""
    for s in reversed(list(islice(waiting, WAITING_QUEUE_PREFIX_MATCH_MAX))):
        tree.match_prefix(s.runs, s.num_tokens)


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
    tokens computed this round). ``room()`` is the token pool's free plus evictable cells now.
    ``budget_v2``: 0.5.23's ``PrefillBudget`` rules (see the module docstring), else 0.5.2's."""

    def __init__(self, tree: RadixCache, room: Callable[[], int], page_size: int, *, max_prefill_tokens: int,
                 chunked_prefill_size: int | None, reserved: float, budget_v2: bool = False):
        self.tree = tree
        self.room = room
        self.page_size = page_size
        self.rem_input = max_prefill_tokens
        self.rem_chunk = chunked_prefill_size
        self.reserved = reserved
        self.budget_v2 = budget_v2
        self.offset = 0  # tokens this round has taken (extends and admitted requests' futures)
        self.current = 0  # cur_rem_token_offset: this round's immediate allocations only
        self.cells = 0  # 0.5.2: KV cells (whole pages) this round's admissions allocate (the simulator's guard)
        self.adds: list[tuple[Any, int]] = []

    def _ceil_page(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def remaining_total(self) -> float:
        return self.room() - self.reserved - self.offset

    def _charge(self, chunk: int, max_new: int) -> None:
        """``_update_prefill_budget`` (0.5.2) / ``PrefillBudget.reserve`` (0.5.23) for one
        admission: the page-ceiled extend (and in 0.5.23 one page) plus ``max_new``."""
        paged = self._ceil_page(chunk)
        page = self.page_size if self.budget_v2 else 0
        self.offset += paged + page + max_new
        self.current += paged + page
        self.rem_input -= paged
        if self.rem_chunk is not None:
            self.rem_chunk -= paged

    def budget_state(self) -> str:
        """0.5.23's ``budget_state``: NO_TOKEN when the pool has no room left for this round,
        OTHER when a compute budget is spent, else ADDED (go on)."""
        room = self.room()
        if not (room - self.reserved - self.offset > 0 and room - self.current > 0):
            return NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return OTHER
        return ADDED

    def add_chunked_req(self, seq) -> bool:
        """The chunked request continues first; True when this is its last chunk."""
        p = self.page_size
        extend = seq.num_tokens - seq.num_computed
        if self.budget_v2:  # available_chunk_tokens: the chunk budget, bounded by the room left
            rem = self.rem_chunk
            assert rem is not None  # (a chunked request exists only with chunked prefill on)
            bounded = min(rem, int(self.remaining_total()))
            rem = bounded if bounded > 0 else rem
            room = self.room()
            if rem > room:  # simulator guard: SGLang would fail the allocation; wait for memory
                rem = room - room % p
            chunk = min(extend, rem)
            last = chunk == extend
            if chunk > 0:
                self.adds.append((seq, chunk))
            self._charge(chunk, min(seq.out_len, CLIP_MAX_NEW_TOKENS) if last else 0)
            return last
        rem_chunk = self.rem_chunk  # 0.5.2: min(rem_chunk_tokens, int(rem_total_tokens)), not page-floored
        assert rem_chunk is not None  # (a chunked request exists only with chunked prefill on)
        chunk = min(extend, rem_chunk, int(self.remaining_total()))
        room = self.room()
        c = seq.num_computed
        fit = self._ceil_page(c) - c + room - room % p  # the most tokens whole new pages in the room take
        if chunk > fit:  # simulator guard: SGLang would fail the prefill; wait for memory
            chunk = fit
        chunk = max(chunk, 0)  # (SGLang 0.5.2 would take a negative extend when rem_total < 0)
        last = chunk == extend
        if chunk > 0:
            self.adds.append((seq, chunk))
            self.cells += self._ceil_page(seq.num_computed + chunk) - self._ceil_page(seq.num_computed)
        self._charge(chunk, min(seq.out_len, CLIP_MAX_NEW_TOKENS) if last else 0)
        return last

    def add_one_req(self, seq, prefix_len: int, node: Node) -> tuple[str, int]:
        """Try to admit ``seq`` with its matched prefix (``prefix_len`` tokens ending at
        ``node``): (outcome, tokens it computes this round). On ADDED / ADDED_CHUNKED its
        prefix stays locked; on NO_TOKEN (the pool is short: the batch is full) or OTHER (the
        prefill budget is spent) the round stops."""
        p = self.page_size
        extend = seq.num_tokens - prefix_len
        # 0.5.23's fit check asks for what is left to generate; 0.5.2's total_tokens for the whole
        # min(max_new_tokens, 4096), also when resumed after a retraction
        future = min(seq.out_len - (seq.num_output if self.budget_v2 else 0), CLIP_MAX_NEW_TOKENS)
        before_lock = 0.0 if self.budget_v2 else self.remaining_total()  # 0.5.2 checks before and after
        self.tree.inc_lock(node)  # the budget is checked with the prefix locked (_lock_node)
        rem_total = self.remaining_total()
        outcome, chunk = ADDED, extend
        if self.budget_v2:
            paged = self._ceil_page(extend)
            if extend + future + p >= rem_total:  # check_prefill: total_tokens < remaining_total
                outcome = NO_TOKEN
            elif self.rem_chunk is None and self.adds and paged >= self.rem_input:
                outcome = OTHER
            elif self.rem_chunk is not None and paged > self.rem_chunk:
                end = (prefix_len + self.rem_chunk // p * p) // p * p
                chunk = end - prefix_len
                outcome = OTHER if chunk <= 0 else ADDED_CHUNKED
        else:  # 0.5.2: total_tokens = extend + min(max_new, 4096); input_tokens = ceil_paged(extend)
            paged = self._ceil_page(extend)
            if extend + future >= before_lock:
                outcome = NO_TOKEN
            elif paged >= self.rem_input and self.adds:
                outcome = OTHER
            elif extend + future >= rem_total:  # rem_total_tokens may decrease after the lock
                outcome = NO_TOKEN
            elif self.rem_chunk is not None and paged > self.rem_chunk:
                chunk = self.rem_chunk // p * p
                outcome = OTHER if chunk <= 0 else ADDED_CHUNKED
        if (not self.budget_v2 and outcome != OTHER and outcome != NO_TOKEN
                and self._ceil_page(prefix_len + chunk) - self._ceil_page(prefix_len) + self.cells > self.room()):
            # simulator guard: 0.5.2's budget counts tokens, not whole pages, so with pages it can
            # admit more than the pool holds, where SGLang fails the prefill allocation ("Prefill
            # out of memory"); here the round stops as if the pool were full
            outcome = NO_TOKEN
        if outcome in (NO_TOKEN, OTHER):
            self.tree.dec_lock(node)
            return outcome, 0
        self.adds.append((seq, chunk))
        if not self.budget_v2:
            self.cells += self._ceil_page(prefix_len + chunk) - self._ceil_page(prefix_len)
        # the full max_new_tokens, also when resumed after a retraction (both versions)
        self._charge(chunk, min(seq.out_len, CLIP_MAX_NEW_TOKENS) if outcome == ADDED else 0)
        return outcome, chunk

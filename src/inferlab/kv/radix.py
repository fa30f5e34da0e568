"""SGLang: the RadixCache and the scheduler around it.

Semantics (../shared/reference/kv_managers.md section 2, sglang 0.5.2 and 0.5.23):
* one token pool shared by the tree and the running requests; the tree's edges hold token ids;
* ``match_prefix`` walks the tree token by token (page by page when ``page_size > 1``), splits an
  edge on a partial match and touches every node it passes (LRU); the scheduler matches at most
  ``len(input + output) - 1`` tokens, so an identical prompt hits ``L - 1`` tokens;
* the prompt enters the tree after its prefill (and after each chunk of a chunked prefill),
  decoded tokens only when the request finishes (``input + output[:-1]``); duplicates are freed;
* running requests lock their path; eviction frees unlocked leaves, oldest access first, whole
  nodes at a time (0.5.2 asks for the full allocation, 0.5.23 only the shortfall);
* rounds are prefill-first: if any waiting request can be admitted the round is a prefill round
  and decodes wait; admission uses ``rem_total_tokens`` (free + evictable minus the running
  requests' reserved future tokens scaled by ``new_token_ratio``), ``max_prefill_tokens`` and
  ``chunked_prefill_size`` with at most one chunked request;
* waiting order: ``fcfs`` (default), ``lpm`` (longest prefix first, FCFS above 128 waiting),
  ``dfs-weight``;
* when a decode step lacks memory the request with the fewest output tokens (ties: longest
  prompt) is retracted until the rest has 20 steps of headroom; ``new_token_ratio`` then
  restarts from the remaining batch's progress, and decays by (init - min)/600 per decode step.

Not modelled: the in-batch prefix check that deprioritises waiting requests sharing an
uncached prefix (cache-aware policies only), ``--enable-mixed-chunk``, the overlap scheduler,
HiCache, priority scheduling and eviction strategies other than ``lru``; ``max_running_requests``
defaults to ``min(capacity // 2, 4096)`` (SGLang also caps it by its request pool of 2048-4096).
The batch-full flag set by a failed admission is cleared when a request finishes or is retracted.

Token pool accounting is by counts: the tree's tokens plus each running request's private
tokens (those not yet in the tree) never exceed ``capacity_tokens``.
"""

from __future__ import annotations

import heapq
from collections import deque
from operator import attrgetter
from typing import Any

from ..errors import InvalidValueError, UnknownNameError
from .simulator import InvariantError, KVManager, Seq, StepStats
from .tokens import first_tokens_key, lcp_at, slice_runs


def _advance(runs, bi: int, boff: int, n: int) -> tuple[int, int]:
    """Move a (run, offset) cursor n tokens forward."""
    while n:
        step = min(n, runs[bi][1] - boff)
        n -= step
        boff += step
        if boff == runs[bi][1]:
            bi, boff = bi + 1, 0
    return bi, boff

SGLANG_VERSIONS = ("0.5.2", "0.5.23")
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight")
CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.CLIP_MAX_NEW_TOKENS
_out_len, _num_output = attrgetter("out_len"), attrgetter("num_output")
WAITING_QUEUE_PREFIX_MATCH_MAX = 128  # lpm falls back to fcfs above this many waiting
RETRACT_DECODE_STEPS = 20  # global_config.retract_decode_steps
NEW_TOKEN_RATIO_INIT = 0.7  # times schedule_conservativeness
NEW_TOKEN_RATIO_MIN_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


class Node:
    __slots__ = ("key", "length", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key, parent: Node | None, last_access: int):
        self.key = key  # token runs of this edge
        self.length = sum(n for _, n in key)
        self.children: dict = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = last_access

    def __lt__(self, other: Node) -> bool:  # heap order: oldest access first
        return self.last_access < other.last_access


class RadixTree:
    """SGLang's RadixCache (token counts, no KV indices)."""

    def __init__(self, page_size: int = 1):
        self.page_size = page_size
        self.root = Node((), None, 0)
        self.root.lock_ref = 1
        self.tick = 0
        self.total_tokens = 0
        self.evictable_tokens = 0
        self.leaves: set[Node] = set()

    def _child_key(self, runs):
        return runs[0][0] if self.page_size == 1 else first_tokens_key(runs, self.page_size)

    def _split(self, child: Node, n: int) -> Node:
        parent = child.parent
        upper = Node(slice_runs(child.key, 0, n), parent, child.last_access)
        upper.lock_ref = child.lock_ref
        parent.children[self._child_key(child.key)] = upper
        child.key = slice_runs(child.key, n, child.length)
        child.length -= n
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def _walk(self, runs, length: int) -> tuple[int, Node, tuple]:
        """Descend along ``runs[:length]`` (page-aligned), splitting on a partial match."""
        p = self.page_size
        length -= length % p
        node, matched = self.root, 0
        self.tick += 1
        node.last_access = self.tick
        bi = boff = 0  # cursor into runs
        nruns = len(runs)
        while length - matched >= p and bi < nruns:
            if p == 1:
                ck = runs[bi][0] + boff
            else:
                ck = first_tokens_key(((runs[bi][0] + boff, runs[bi][1] - boff),) + tuple(runs[bi + 1:]), p)
            child = node.children.get(ck)
            if child is None:
                break
            self.tick += 1
            child.last_access = self.tick
            n, nbi, nboff = lcp_at(child.key, runs, bi, boff, length - matched)
            if n % p:
                n -= n % p
                nbi, nboff = _advance(runs, bi, boff, n)
            if n == 0:
                break
            if n < child.length:
                child = self._split(child, n)
            matched += n
            node = child
            bi, boff = nbi, nboff
        rest = ()
        if matched < length:
            rest = slice_runs(runs, matched, length)
        return matched, node, rest

    def match_prefix(self, runs, max_len: int) -> tuple[int, Node]:
        matched, node, _ = self._walk(runs, max_len)
        return matched, node

    def insert(self, runs, length: int) -> tuple[int, Node]:
        """Insert ``runs[:length]`` (page-aligned); return (tokens already present, last node)."""
        matched, node, rest = self._walk(runs, length)
        if rest:
            leaf = Node(rest, node, self.tick)
            node.children[self._child_key(rest)] = leaf
            self.leaves.discard(node)
            self.leaves.add(leaf)
            self.total_tokens += leaf.length
            self.evictable_tokens += leaf.length
            node = leaf
        return matched, node

    def inc_lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_tokens -= node.length
            node.lock_ref += 1
            node = node.parent

    def dec_lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_tokens += node.length
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free unlocked leaves, least recently used first, whole nodes; return tokens freed."""
        heap = [leaf for leaf in self.leaves if leaf.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            self.leaves.discard(leaf)
            self.total_tokens -= leaf.length
            self.evictable_tokens -= leaf.length
            freed += leaf.length
            if not parent.children and parent is not self.root:
                self.leaves.add(parent)
                if parent.lock_ref == 0:
                    heapq.heappush(heap, parent)
        return freed

    def nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())


class RadixManager(KVManager):
    """SGLang's scheduler with the radix cache (default: sglang 0.5.23 behaviour)."""

    engine = "sglang"
    hit_rate_name = "cache_hit_rate"

    def __init__(self, capacity_tokens: int, *, page_size: int = 1, schedule_policy: str = "fcfs",
                 chunked_prefill_size: int = 2048, max_prefill_tokens: int = 16384,
                 max_running_requests: int | None = None, schedule_conservativeness: float = 1.0,
                 disable_radix_cache: bool = False, version: str = "0.5.23"):
        super().__init__(capacity_tokens)
        if version not in SGLANG_VERSIONS:
            raise UnknownNameError("SGLang version", version, SGLANG_VERSIONS)
        if schedule_policy not in SCHEDULE_POLICIES:
            raise UnknownNameError("SGLang schedule policy", schedule_policy, SCHEDULE_POLICIES)
        for name, v in (("page_size", page_size), ("max_prefill_tokens", max_prefill_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValueError(f"{name} must be an integer >= 1, got {v!r}")
        if chunked_prefill_size != -1 and (not isinstance(chunked_prefill_size, int) or chunked_prefill_size < page_size):
            raise InvalidValueError(f"chunked_prefill_size must be -1 (off) or >= page_size, got {chunked_prefill_size!r}")
        if not schedule_conservativeness > 0:
            raise InvalidValueError(f"schedule_conservativeness must be > 0, got {schedule_conservativeness!r}")
        self.page_size = page_size
        self.schedule_policy = schedule_policy
        self.chunked_prefill_size = None if chunked_prefill_size == -1 else chunked_prefill_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_running_requests = max_running_requests or max(1, min(capacity_tokens // 2, 4096))
        self.disable_radix_cache = disable_radix_cache
        self.version = version
        self.tree = RadixTree(page_size)
        self.private_tokens = 0  # KV held by requests outside the tree
        self.running: list[Seq] = []  # the decode batch
        self.waiting: deque[Seq] = deque()
        self.chunked: Seq | None = None
        self.batch_is_full = False
        self.init_ratio = min(NEW_TOKEN_RATIO_INIT * schedule_conservativeness, 1.0)
        self.min_ratio = self.init_ratio * NEW_TOKEN_RATIO_MIN_FACTOR
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_ratio
        self.log_hit_tokens = self.log_input_tokens = 0

    def config(self) -> dict[str, Any]:
        return {"engine": "sglang", "version": self.version, "capacity_tokens": self.capacity_tokens,
                "page_size": self.page_size, "schedule_policy": self.schedule_policy,
                "chunked_prefill_size": self.chunked_prefill_size or -1,
                "max_prefill_tokens": self.max_prefill_tokens, "max_running_requests": self.max_running_requests,
                "disable_radix_cache": self.disable_radix_cache}

    # ---------------------------------------------------------------- accounting
    @property
    def num_running(self) -> int:
        return len(self.running) + (self.chunked is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def available(self) -> int:
        return self.capacity_tokens - self.tree.total_tokens - self.private_tokens

    def kv_used_tokens(self) -> int:
        return self.tree.total_tokens - self.tree.evictable_tokens + self.private_tokens

    def kv_cached_tokens(self) -> int:
        return self.tree.evictable_tokens

    def hit_rate(self) -> float | None:
        tot = self.log_hit_tokens + self.log_input_tokens
        return self.log_hit_tokens / tot if tot else None

    # ---------------------------------------------------------------- memory
    def _alloc(self, seq: Seq, n: int) -> None:
        """Give ``seq`` n private tokens, evicting from the tree if the pool is short."""
        avail = self.available()
        if avail < n:
            want = n if self.version == "0.5.2" else n - avail
            self.tree.evict(want)
            if self.available() < n:
                raise InvariantError(f"sglang: cannot allocate {n} tokens (available {self.available()})")
        self.private_tokens += n
        seq.private += n

    def _release_private(self, seq: Seq) -> None:
        self.private_tokens -= seq.private
        seq.private = 0

    def _cache_unfinished(self, seq: Seq) -> None:
        """After a prefill (chunk): put the computed prompt into the tree; move the lock."""
        length = seq.num_computed - seq.num_computed % self.page_size
        if self.disable_radix_cache or length <= seq.prefix_len:
            return
        present, node = self.tree.insert(seq.runs, length)
        moved = length - seq.prefix_len  # private tokens now owned by the tree (or duplicates)
        self.private_tokens -= moved
        seq.private -= moved
        self.tree.inc_lock(node)
        self.tree.dec_lock(seq.last_node)
        seq.last_node, seq.prefix_len = node, length
        del present

    def _cache_finished(self, seq: Seq) -> None:
        """On finish: insert input + output[:-1] (page-aligned), free the rest, unlock."""
        if not self.disable_radix_cache:
            length = seq.num_computed - seq.num_computed % self.page_size
            if length > seq.prefix_len:
                self.tree.insert(seq.runs, length)
        self._release_private(seq)
        self.tree.dec_lock(seq.last_node)
        seq.last_node, seq.prefix_len = self.tree.root, 0

    # ---------------------------------------------------------------- scheduling
    def add(self, seq: Seq, now: float) -> str | None:
        final = seq.prompt_len + seq.out_len - 1
        reserve = seq.prompt_len + min(seq.out_len, CLIP_MAX_NEW_TOKENS)
        if final > self.capacity_tokens or reserve >= self.capacity_tokens:
            return (f"prompt of {seq.prompt_len} + {seq.out_len} new tokens cannot fit the token pool of "
                    f"{self.capacity_tokens} (needs {max(final, reserve + 1)})")
        seq.private = 0
        seq.prefix_len = 0
        seq.last_node = self.tree.root
        self.waiting.append(seq)
        return None

    def _match(self, seq: Seq) -> tuple[int, Node]:
        if self.disable_radix_cache:
            return 0, self.tree.root
        return self.tree.match_prefix(seq.runs, seq.num_tokens - 1)

    def _ordered_waiting(self):
        policy = self.schedule_policy
        if policy == "fcfs" or self.disable_radix_cache:
            return self.waiting  # a deque; admitted requests leave from its head
        if policy == "lpm":
            if len(self.waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
                return self.waiting
            keyed = [(self._match(s)[0], s) for s in self.waiting]
            return [s for _, s in sorted(keyed, key=lambda x: -x[0])]
        # dfs-weight: heavier subtrees first, a node's own requests after its children
        by_node: dict[Node, list[Seq]] = {}
        weight: dict[Node, int] = {}
        for s in self.waiting:
            node = self._match(s)[1]
            by_node.setdefault(node, []).append(s)
            while node is not None:
                weight[node] = weight.get(node, 0) + 1
                node = node.parent
        out: list[Seq] = []

        def visit(node: Node) -> None:
            kids = sorted((c for c in node.children.values() if c in weight), key=lambda c: -weight[c])
            for c in kids:
                visit(c)
            out.extend(by_node.get(node, ()))

        visit(self.tree.root)
        return out

    def _reserved_by_running(self) -> float:
        """PrefillAdder's reservation: each running request's remaining new tokens, clipped to
        CLIP_MAX_NEW_TOKENS, times the new-token ratio."""
        running = self.running
        if not running:
            return 0 * self.new_token_ratio
        if max(map(_out_len, running)) <= CLIP_MAX_NEW_TOKENS:  # nothing to clip: sums at C speed
            return (sum(map(_out_len, running)) - sum(map(_num_output, running))) * self.new_token_ratio
        return sum(min(s.out_len - s.num_output, CLIP_MAX_NEW_TOKENS) for s in running) * self.new_token_ratio

    def _prefill_round(self, now: float) -> list[tuple[Seq, int]] | None:
        if not self.running and self.chunked is None:
            self.batch_is_full = False  # nothing holds memory that a finish could return
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        p = self.page_size
        rem_input = self.max_prefill_tokens
        rem_chunk = self.chunked_prefill_size
        reserved = self._reserved_by_running()
        offset = 0
        adds: list[tuple[Seq, int]] = []
        if self.chunked is not None:  # the chunked request continues first
            seq = self.chunked
            extend = seq.num_tokens - seq.num_computed
            room = self.available() + self.tree.evictable_tokens
            if extend > room:  # simulator guard: SGLang would fail the prefill; wait for memory
                extend = room - room % p
            if rem_chunk is not None and extend > rem_chunk:
                extend = rem_chunk - rem_chunk % p
            elif extend == seq.num_tokens - seq.num_computed:
                self.chunked = None
            if extend > 0:
                adds.append((seq, extend))
            rem_input -= extend
            if rem_chunk is not None:
                rem_chunk -= extend
            offset += extend
        new_chunked = None
        ordered = self._ordered_waiting()
        in_order = ordered is self.waiting
        admitted: list[Seq] = []
        for seq in (list(ordered) if not in_order else ordered):
            if len(self.running) + len(adds) >= self.max_running_requests:
                self.batch_is_full = True
                break
            prefix_len, node = self._match(seq)
            extend = seq.num_tokens - prefix_len
            future = min(seq.out_len - seq.num_output, CLIP_MAX_NEW_TOKENS)
            self.tree.inc_lock(node)  # the budget is checked with the prefix locked (_lock_node)
            rem_total = self.available() + self.tree.evictable_tokens - reserved - offset
            stop = None
            chunk = extend
            if extend + future >= rem_total:
                self.batch_is_full = stop = True  # NO_TOKEN
            elif extend >= rem_input and adds:
                stop = True
            elif rem_chunk is not None and extend > rem_chunk:
                chunk = rem_chunk - rem_chunk % p
                if chunk <= 0:
                    stop = True
                else:
                    new_chunked = seq
            if stop:
                self.tree.dec_lock(node)
                break
            seq.last_node, seq.prefix_len = node, prefix_len
            seq.num_computed = prefix_len
            seq.note_first_admission(prefix_len, now)
            self.log_hit_tokens += prefix_len
            admitted.append(seq)
            adds.append((seq, chunk))
            offset += chunk + (future if new_chunked is None else 0)
            rem_input -= chunk
            if rem_chunk is not None:
                rem_chunk -= chunk
            if new_chunked is not None:
                break
        if admitted:
            if in_order:
                for _ in admitted:
                    self.waiting.popleft()
            else:
                gone = set(map(id, admitted))
                self.waiting = deque(s for s in self.waiting if id(s) not in gone)
        if new_chunked is not None:
            self.chunked = new_chunked
        return adds or None

    def step(self, now: float) -> StepStats:
        st = StepStats()
        adds = self._prefill_round(now)
        if adds:
            p = self.page_size
            for seq, chunk in adds:
                c = seq.num_computed  # pages are allocated whole: cells = ceil(tokens / page) * page
                self._alloc(seq, -(-(c + chunk) // p) * p - -(-c // p) * p)
                self.log_input_tokens += chunk
                st.prefill_tokens += chunk
                st.context_tokens += seq.num_computed + chunk
            st.num_running = len(self.running) + len(adds)
            for seq, chunk in adds:
                finished = self.advance(seq, chunk, st)
                if seq is self.chunked:
                    self._cache_unfinished(seq)
                    continue
                if finished:  # max_new_tokens == 1: done at prefill
                    self._cache_finished(seq)
                    st.finished.append(seq)
                    continue
                self._cache_unfinished(seq)
                self.running.append(seq)
            if st.finished:
                self.batch_is_full = False
            return st
        if not self.running:
            return st
        self._decode(st)
        return st

    def _decode(self, st: StepStats) -> None:
        need = len(self.running)  # one new token slot per request (page_size 1)
        if self.page_size > 1:
            need = sum(self.page_size for s in self.running if s.num_computed % self.page_size == 0)
        if self.available() < need:
            short = need if self.version == "0.5.2" else need - self.available()
            self.tree.evict(short)
        if self.available() < need:
            self._retract()
            need = len(self.running) if self.page_size == 1 else sum(
                self.page_size for s in self.running if s.num_computed % self.page_size == 0)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        st.num_running = len(self.running)
        done = []
        if self.page_size == 1 and self.available() >= len(self.running):
            # one token slot each, no eviction needed (_alloc and advance, per request, inlined)
            self.private_tokens += len(self.running)
            st.decode_tokens += len(self.running)
            ctx = 0
            first = st.first_token
            for seq in self.running:
                seq.private += 1
                c = seq.num_computed = seq.num_computed + 1
                ctx += c
                if c >= seq.prompt_len + seq.num_output:  # caught up: sample a token
                    seq.num_output += 1
                    if seq.num_output == 1 and seq.first_token_s is None:
                        first.append(seq)
                    if seq.num_output >= seq.out_len:
                        done.append(seq)
            st.context_tokens += ctx
        else:
            for seq in self.running:
                grow = 1 if self.page_size == 1 else (self.page_size if seq.num_computed % self.page_size == 0 else 0)
                if grow:
                    self._alloc(seq, grow)
                st.decode_tokens += 1
                st.context_tokens += seq.num_computed + 1
                if self.advance(seq, 1, st):
                    done.append(seq)
        if done:
            for seq in done:
                self._cache_finished(seq)
                st.finished.append(seq)
            gone = set(map(id, done))
            self.running = [s for s in self.running if id(s) not in gone]
            self.batch_is_full = False
        if not self.running and not self.waiting and self.chunked is None:
            self.new_token_ratio = self.init_ratio

    def decode_horizon(self) -> tuple[int, int, int] | None:
        if self.page_size != 1 or self.chunked is not None or not self.running:
            return None
        if self.waiting and not self.batch_is_full:
            return None  # a prefill round would be tried
        b = len(self.running)
        k = min(min(s.out_len - s.num_output for s in self.running) - 1,  # nobody finishes
                self.available() // b)  # no eviction, no retraction
        return (k, b, sum(s.num_computed + 1 for s in self.running)) if k >= 2 else None

    def fast_forward(self, k: int) -> None:
        for s in self.running:
            s.num_computed += k
            s.num_output += k
            s.private += k
        self.private_tokens += k * len(self.running)
        self.new_token_ratio = max(self.new_token_ratio - k * self.ratio_decay, self.min_ratio)

    def _retract(self) -> None:
        """retract_decode: fewest outputs first (ties: longest prompt) until 20 steps of headroom."""
        order = sorted(self.running, key=lambda s: (s.num_output, -s.prompt_len), reverse=True)
        retracted = 0
        while len(order) > 1:
            headroom = self.available() + self.tree.evictable_tokens
            if retracted and headroom >= len(order) * RETRACT_DECODE_STEPS:
                break
            seq = order.pop()
            self._release_private(seq)
            self.tree.dec_lock(seq.last_node)
            seq.last_node, seq.prefix_len = self.tree.root, 0
            seq.num_computed = 0
            seq.preemptions += 1
            self.waiting.append(seq)
            retracted += 1
        self.running = [s for s in self.running if s in order]
        avail = self.available()
        need = len(order)
        if avail < need:
            self.tree.evict(need - avail if self.version == "0.5.23" else need)
        decoded = sum(s.num_output for s in order)
        max_new = sum(s.out_len for s in order) + (1 if self.version == "0.5.23" else 0)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / max_new)
        self.batch_is_full = False

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        tree = self.tree
        total = evictable = 0
        locks: dict[Node, int] = {}
        live = list(self.running) + ([self.chunked] if self.chunked else [])
        for s in live:
            node = s.last_node
            while node is not tree.root:
                locks[node] = locks.get(node, 0) + 1
                node = node.parent
        for node in tree.nodes():
            if node is tree.root:
                continue
            if node.lock_ref < 0:
                raise InvariantError(f"sglang: negative lock_ref {node.lock_ref}")
            if node.lock_ref != locks.get(node, 0):
                raise InvariantError(f"sglang: node lock_ref {node.lock_ref} but {locks.get(node, 0)} requests hold it")
            total += node.length
            if node.lock_ref == 0:
                evictable += node.length
            if (not node.children) != (node in tree.leaves):
                raise InvariantError("sglang: leaf set out of date")
        if total != tree.total_tokens or evictable != tree.evictable_tokens:
            raise InvariantError(f"sglang: tree counts {tree.total_tokens}/{tree.evictable_tokens} "
                                 f"but nodes hold {total}/{evictable}")
        priv = sum(s.private for s in live)
        if priv != self.private_tokens or any(s.private < 0 for s in live):
            raise InvariantError(f"sglang: private tokens {self.private_tokens} but requests hold {priv}")
        p = self.page_size
        for s in live:
            if s.prefix_len + s.private != -(-s.num_computed // p) * p:
                raise InvariantError(f"sglang: {s!r} holds {s.prefix_len}+{s.private} KV for {s.num_computed} tokens")

    def check_drained(self) -> None:
        self.check_invariants()
        if self.running or self.waiting or self.chunked:
            raise InvariantError("sglang: requests left behind")
        if self.private_tokens or self.tree.evictable_tokens != self.tree.total_tokens:
            raise InvariantError(f"sglang: leaked {self.private_tokens} private tokens or locked nodes")

"""SGLang's ``RadixCache`` (``sglang/srt/mem_cache/radix_cache.py``): a tree of token-id
edges shared by every request, with lock counts and LRU eviction of unlocked leaves.

Rules (docs/engines/sglang.md, "Tree node" to "evict"):
* ``match_prefix`` walks the tree token by token (page by page when ``page_size > 1``), splits an
  edge on a partial match and touches every node it passes (LRU);
* ``insert`` walks the same way and adds a leaf for the unmatched rest (the caller frees its
  duplicate KV for the part already present);
* a running request locks its path (``inc_lock_ref`` / ``dec_lock_ref``); eviction frees
  unlocked leaves, oldest access first, whole nodes at a time.

Tokens are counted, not indexed: the tree holds ``total_tokens`` cells, ``evictable_tokens`` of
them unlocked.
"""

from __future__ import annotations

import heapq

from ..events import Evict
from ..tokens import first_tokens_key, lcp_at, slice_runs


def _advance(runs, bi: int, boff: int, n: int) -> tuple[int, int]:
    """Move a (run, offset) cursor n tokens forward."""
    while n:
        step = min(n, runs[bi][1] - boff)
        n -= step
        boff += step
        if boff == runs[bi][1]:
            bi, boff = bi + 1, 0
    return bi, boff


class Node:
    """SGLang's ``TreeNode``: an edge of token ids (as runs), its lock count and last access.
    ``id`` numbers the nodes of one tree in creation order (events name nodes by it)."""

    __slots__ = ("key", "length", "children", "parent", "lock_ref", "last_access", "id")

    def __init__(self, key, parent: Node | None, last_access: int, nid: int = 0):
        self.id = nid
        self.key = key  # token runs of this edge
        self.length = sum(n for _, n in key)
        self.children: dict = {}
        self.parent: Node = parent  # type: ignore[assignment]  # (None only for the root, which is never walked up from)
        self.lock_ref = 0
        self.last_access = last_access

    def __lt__(self, other: Node) -> bool:  # heap order: oldest access first
        return self.last_access < other.last_access


class RadixCache:
    """SGLang's ``RadixCache`` (token counts, no KV indices). ``events`` is a list while a run
    records events (else None)."""

    def __init__(self, page_size: int = 1):
        self.page_size = page_size
        self.num_nodes = 1  # ids handed out (the root is 0)
        self.events: list | None = None
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
        upper = Node(slice_runs(child.key, 0, n), parent, child.last_access, self.num_nodes)
        self.num_nodes += 1
        upper.lock_ref = child.lock_ref
        parent.children[self._child_key(child.key)] = upper
        child.key = slice_runs(child.key, n, child.length)
        child.length -= n
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def _walk(self, runs, length: int, rest: bool = True) -> tuple[int, Node, tuple]:
        """Descend along ``runs[:length]`` (page-aligned), splitting on a partial match; with
        ``rest``, also the unmatched remainder (an insert's new leaf)."""
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
        if rest and matched < length:
            return matched, node, slice_runs(runs, matched, length)
        return matched, node, ()

    def match_prefix(self, runs, max_len: int) -> tuple[int, Node]:
        matched, node, _ = self._walk(runs, max_len, False)
        return matched, node

    def insert(self, runs, length: int) -> tuple[int, Node]:
        """Insert ``runs[:length]`` (page-aligned); return (tokens already present, last node)."""
        matched, node, rest = self._walk(runs, length)
        if rest:
            self.tick += 1  # a new leaf is strictly newer than the path (SGLang: TreeNode() stamps its creation)
            leaf = Node(rest, node, self.tick, self.num_nodes)
            self.num_nodes += 1
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
        gone = [] if self.events is not None else None
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            self.leaves.discard(leaf)
            self.total_tokens -= leaf.length
            self.evictable_tokens -= leaf.length
            freed += leaf.length
            if gone is not None:
                gone.append(leaf.id)
            if not parent.children and parent is not self.root:
                self.leaves.add(parent)
                if parent.lock_ref == 0:
                    heapq.heappush(heap, parent)
        if gone and self.events is not None:
            self.events.append(Evict(tokens=freed, nodes=tuple(gone)))
        return freed

    def nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())




RadixTree = RadixCache  # the name the simulator used before the split

"""SGLang's own ``RadixCache`` beside inferlab's, call by call.

``record_tree_calls(manager)`` makes an inferlab ``RadixManager``'s tree log every call the
scheduler makes (match_prefix with its limit, insert, inc/dec lock, evict) with what it
returned; ``replay(calls, page_size)`` makes the same calls on SGLang's ``RadixCache``
(``RadixCache.create_simulated``: the tree without memory pools, a no-op allocator that
receives evicted KV indices) and lists every call whose answer differs: tokens matched,
tokens already present on insert, tokens evicted, and the tree's total and evictable sizes
after the call. Locks name nodes by the call that returned them (a split keeps the returned
node as the lower half in both trees). SGLang stamps nodes with ``time.monotonic()``; here its
module's clock is a counter, so that two touches are never equal (the order is SGLang's).
"""

from __future__ import annotations

import itertools
from array import array

from _vllm_sglang_shims import install

install()

import torch  # noqa: E402
import sglang  # noqa: E402
from sglang.srt.mem_cache import radix_cache as _rc  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402


VERSION = sglang.__version__


class _CountingClock:
    """Stands in for the ``time`` module inside radix_cache.py: monotonic() counts calls."""

    def __init__(self, real):
        self._real, self._ticks = real, itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self._ticks))

    def __getattr__(self, name):
        return getattr(self._real, name)


if not isinstance(_rc.time, _CountingClock):
    _rc.time = _CountingClock(_rc.time)


class _NoPoolAllocator:
    """The token pool SGLang's tree frees evicted KV indices into; counts are kept by the tree."""

    page_size = 1
    device = "cpu"

    def free_segment(self, *args, **kwargs):
        pass

    def free(self, *args, **kwargs):
        pass


_expanded: dict[int, tuple[object, array]] = {}


def _ids(runs, n: int) -> array:
    """The first n token ids of a run list (each request's whole list expanded once)."""
    hit = _expanded.get(id(runs))
    if hit is None or hit[0] is not runs:
        full = array("q")
        for start, k in runs:
            full.extend(range(start, start + k))
        if len(_expanded) > 4096:
            _expanded.clear()
        hit = _expanded[id(runs)] = (runs, full)
    return hit[1][:n]


def record_tree_calls(manager) -> list[tuple]:
    """Log every call the manager's tree receives: (op, args..., result, total, evictable)."""
    tree, calls = manager.tree, []
    match, insert, inc, dec, evict = tree.match_prefix, tree.insert, tree.inc_lock, tree.dec_lock, tree.evict

    def log(op, args, result):
        calls.append((op, args, result, tree.total_tokens, tree.evictable_tokens))

    def m(runs, max_len):
        n, node = match(runs, max_len)
        log("match", (runs, max_len), (n, node.id))
        return n, node

    def i(runs, length):
        n, node = insert(runs, length)
        log("insert", (runs, length), (n, node.id))
        return n, node

    def li(node):
        inc(node)
        log("inc_lock", (node.id,), None)

    def ld(node):
        dec(node)
        log("dec_lock", (node.id,), None)

    def e(n):
        freed = evict(n)
        log("evict", (n,), freed)
        return freed

    tree.match_prefix, tree.insert, tree.inc_lock, tree.dec_lock, tree.evict = m, i, li, ld, e
    return calls


def replay(calls, page_size: int) -> tuple[int, list[tuple]]:
    """Make the same calls on SGLang's RadixCache; (calls made, [(index, op, ours, theirs)])."""
    alloc = _NoPoolAllocator()
    alloc.page_size = page_size
    tree = RadixCache.create_simulated(mock_allocator=alloc, page_size=page_size)
    nodes = {0: tree.root_node}  # inferlab node id -> SGLang node
    diffs = []
    for k, (op, args, result, total, evictable) in enumerate(calls):
        if op == "match":
            runs, max_len = args
            key = _ids(runs, max_len - max_len % page_size)
            r = tree.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=key)))
            got = r.device_prefix_len
            nodes.setdefault(result[1], r.last_device_node)
            theirs, ours = got, result[0]
        elif op == "insert":
            runs, length = args
            key = _ids(runs, length)
            r = tree.insert(InsertParams(key=RadixKey(token_ids=key), value=torch.zeros(len(key), dtype=torch.int64)))
            nodes.setdefault(result[1], r.last_device_node)
            theirs, ours = r.prefix_len, result[0]
        elif op == "inc_lock":
            tree.inc_lock_ref(nodes[args[0]])
            theirs = ours = None
        elif op == "dec_lock":
            tree.dec_lock_ref(nodes[args[0]])
            theirs = ours = None
        else:
            theirs, ours = tree.evict(EvictParams(num_tokens=args[0])).num_tokens_evicted, result
        theirs = (theirs, tree.total_size(), tree.evictable_size())
        ours = (ours, total, evictable)
        if theirs != ours:
            diffs.append((k, op, ours, theirs))
    return len(calls), diffs


# ---------------------------------------------------------------- SGLang's own PrefillAdder

from types import SimpleNamespace  # noqa: E402

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder  # noqa: E402
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.runtime_context import get_context  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402


def _publish_server_args() -> None:
    """SGLang's scheduling code reads its settings from a process-wide context built from
    ServerArgs: publish the defaults (a local config.json, CPU, no tokenizer)."""
    import json
    import tempfile
    from pathlib import Path
    d = Path(tempfile.gettempdir()) / "inferlab-conformance-sglang-model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    get_context().set_server_args(ServerArgs(model_path=str(d), device="cpu", skip_tokenizer_init=True))


_publish_server_args()


class CountingAllocator(BaseTokenToKVPoolAllocator):
    """A token pool that only says how many cells are free (what PrefillAdder asks)."""

    def __init__(self, free: int, page_size: int = 1):
        super().__init__(size=1 << 30, page_size=page_size, dtype=torch.int64, device="cpu", kvcache=None,
                         need_sort=False)
        self.free_count = free

    def available_size(self):
        return self.free_count

    def alloc(self, *args, **kwargs):
        raise NotImplementedError("the adder only plans")

    def free(self, *args, **kwargs):
        pass

    def free_segment(self, *args, **kwargs):
        pass

    def clear(self):
        pass


def sglang_req(rid, ids, max_new_tokens: int, output=()) -> Req:
    r = Req(str(rid), "", array("q", ids), SamplingParams(max_new_tokens=max_new_tokens))
    r.output_ids = array("q", output)
    return r


def sglang_prefill_round(tree: RadixCache, free: int, running: list, waiting: list, *, new_token_ratio: float,
                         max_prefill_tokens: int, chunked_prefill_size: int | None, page_size: int = 1):
    """The waiting-queue loop of Scheduler._get_new_batch_prefill_raw (fcfs, no chunked request
    in flight, no LoRA / HiCache / priorities) around SGLang's own PrefillAdder: (admitted as
    [(rid, prefix_len, extend_len)], the new chunked request's rid, batch_is_full)."""
    alloc = CountingAllocator(free, page_size)
    tree.token_to_kv_pool_allocator = alloc
    batch = SimpleNamespace(reqs=running, batch_size=lambda: len(running), is_empty=lambda: not running)
    adder = PrefillAdder(page_size, tree, alloc, batch, new_token_ratio, max_prefill_tokens, chunked_prefill_size)
    full = False
    for req in waiting:
        if adder.budget_state() == AddReqResult.OTHER:
            break
        req.init_next_round_input(tree)
        res = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if res != AddReqResult.CONTINUE:
            if res == AddReqResult.NO_TOKEN:
                full = len(adder.can_run_list) > 0 or bool(running)
            break
    admitted = [(r.rid, r.prefix_len, r.extend_end - r.prefix_len) for r in adder.can_run_list]
    chunked = adder.new_chunked_req.rid if adder.new_chunked_req is not None else None
    return admitted, chunked, full

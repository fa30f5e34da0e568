"""SGLang's own scheduler loop over a whole workload, beside inferlab's RadixManager.

What is SGLang's code and what is the driver:

* SGLang's (the wheel, unchanged): ``Scheduler.get_next_batch_to_run`` (merge the last prefill
  into the running batch, ``get_new_batch_prefill`` -> ``_get_new_batch_prefill_raw``: the
  policy's ``calc_priority``, ``PrefillAdder``, ``ScheduleBatch.init_new`` /
  ``prepare_for_extend``; else ``update_running_batch``: ``check_decode_mem``,
  ``retract_decode``, the new-token ratio, ``prepare_for_decode``), ``Scheduler.
  _add_request_to_queue`` (arrivals and retracted requests), ``Scheduler.init_running_status``,
  ``init_chunked_prefill`` and ``init_schedule_policy``, and the batch result processor's
  ``process_batch_result_prefill`` / ``process_batch_result_decode`` (append the sampled
  token, ``update_finish_state``, ``release_kv_cache`` into the ``RadixCache``,
  ``checkpoint_kv_cache`` after a chunk). Memory is SGLang's ``ReqToTokenPool`` and
  ``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator`` on CPU tensors, the tree its
  ``RadixCache``. The settings come from a published ``ServerArgs``.
* The driver (here): the Scheduler object is made without ``__init__`` (which loads a model,
  opens sockets and sizes pools from GPU memory); the attributes its methods read are set
  below, one line each, most to what ``__init__`` sets for a plain single-GPU generation
  server (no overlap, no speculative decoding, no LoRA / HiCache / disaggregation / DP
  attention). ``run_batch`` is replaced by a stub model runner (``_forward``): every request
  whose prefill completes or that decodes gets its next token, the one inferlab's
  ``Request.output_tokens()`` gives it (so decoded tokens cached in the tree are the same
  content on both sides); ``ignore_eos`` with ``max_new_tokens`` = the workload's output length.
  The loop itself mirrors ``Scheduler.event_loop_normal``: arrivals (``ingest_requests``)
  before each step, ``get_next_batch_to_run``, the forward, ``process_batch_result``.
  Time is inferlab's: one step per forward, arrivals added before the step they precede.

Outcomes per request: prompt tokens cached at first admission (SGLang's ``req.cached_tokens``
after its first ``prepare_for_extend``), retractions, first-token and finish step, tokens
recomputed at re-admissions; per run: tokens evicted from the tree and prefix tokens hit at all
admissions (inferlab's ``log_hit_tokens``).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import _vllm_sglang_shims as _shims

# The Scheduler module imports more than the radix cache and the policy do: these are never
# called on the path driven here (a plain generation server on one device).
_EXTRA_STUBS = {
    "setproctitle": "names the scheduler process",
    "einops": "tensor reshapes of model / kernel code that the scheduler module imports",
    "sglang.kernels.ops.mamba": "Mamba Triton kernels (imported under try/except ImportError; "
                                "triton is a stub here, so the import raises AttributeError)",
    "sglang.srt.disaggregation.common.conn": "PD-disaggregation KV transfer connections",
}
for _name, _why in _EXTRA_STUBS.items():
    _shims.STUBBED.setdefault(_name, _why)
    if _name.startswith("sglang") and _name not in _shims.REPLACED:
        _shims.REPLACED = _shims.REPLACED + (_name,)

import _sglang_engine  # noqa: E402,F401  (installs the shims, publishes default ServerArgs)
import torch  # noqa: E402
import sglang  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.runtime_context import get_context  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

VERSION = sglang.__version__


def _model_dir() -> str:
    d = Path(tempfile.gettempdir()) / "inferlab-conformance-sglang-model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return str(d)


@contextlib.contextmanager
def published(**server_args):
    """SGLang's code reads its settings from a process-wide context built from ServerArgs:
    publish these for the run (a CPU server without a tokenizer, no overlap scheduler), and
    what was published before (_sglang_engine's defaults) again afterwards."""
    ctx = get_context()
    before = ctx.server_args
    ctx.set_server_args(ServerArgs(model_path=_model_dir(), device="cpu", skip_tokenizer_init=True,
                                   disable_overlap_schedule=True, **server_args))
    try:
        yield
    finally:
        ctx.set_server_args(before)


@dataclass
class Outcome:
    cached_tokens: int | None = None  # prompt tokens hit at first admission
    recomputed_tokens: int = 0  # num_tokens - hit at each re-admission after a retraction
    preemptions: int = 0  # retractions
    first_token_s: float | None = None
    finish_s: float | None = None
    output_tokens: int = 0


class _Inert:
    """Stands for a component the driven path only notifies (metrics, streaming, the load
    publisher, the profiler): every attribute is a no-op callable, falsy."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __call__(self, *args, **kwargs):
        return None

    def __bool__(self):
        return False


class _Metrics(_Inert):
    """The metrics reporter: counters the result processors add to, every report a no-op."""

    def __init__(self):
        self.num_generated_tokens = self.forward_ct_decode = self.num_retracted_reqs = 0
        self.enable_metrics = False


class SglangLoop:
    """SGLang's Scheduler (without ``__init__``) over a token pool of ``capacity_tokens``."""

    def __init__(self, capacity_tokens: int, *, page_size: int = 1, schedule_policy: str = "fcfs",
                 chunked_prefill_size: int = 2048, max_prefill_tokens: int = 16384,
                 max_running_requests: int | None = None, schedule_conservativeness: float = 1.0,
                 max_context_len: int = 1 << 16, ignore_eos: bool = False):
        if capacity_tokens % page_size:  # SGLang's paged pool holds whole pages only
            raise ValueError(f"capacity_tokens {capacity_tokens} is not a multiple of page_size {page_size}")
        self.capacity_tokens = capacity_tokens
        self.page_size = page_size
        self.max_running_requests = max_running_requests or max(1, min(capacity_tokens // 2, 4096))
        self.server_args = dict(page_size=page_size, schedule_policy=schedule_policy,
                                chunked_prefill_size=chunked_prefill_size, max_prefill_tokens=max_prefill_tokens,
                                max_running_requests=self.max_running_requests,
                                # init_model_worker defaults it to max_running_requests // pp_size
                                pp_max_micro_batch_size=self.max_running_requests,
                                schedule_conservativeness=schedule_conservativeness)
        self.max_context_len = max_context_len
        # The stub never samples an EOS, so every request stops at max_new_tokens either way; with
        # ignore_eos SGLang's adder takes its fixed-length path (add_one_req_ignore_eos, running
        # requests reserved at ratio 1.0), which inferlab does not model: off by default.
        self.ignore_eos = ignore_eos

    # ---------------------------------------------------------------- the Scheduler object
    def _build(self) -> Scheduler:
        from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
        from sglang.srt.managers.scheduler_components.logprob_result_processor import SchedulerLogprobResultProcessor
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.runtime_context import get_schedule
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        s = Scheduler.__new__(Scheduler)
        cfg = get_schedule()
        # Scheduler.__init__'s "Parse args" block, for this server
        s.forward_ct = 0
        s.processed_tokens_counter = 0
        s.cur_batch_for_debug = None
        s.schedule_policy = cfg.schedule_policy
        s.enable_priority_scheduling = False
        s.schedule_low_priority_values_first = False
        s.priority_scheduling_preemption_threshold = cfg.priority_scheduling_preemption_threshold
        s.abort_on_priority_when_disabled = False
        s.enable_lora = s.enable_lora_overlap_loading = False
        s.enable_overlap = s.enable_overlap_mlx = False
        s.enable_pdmux = False
        s.spec_algorithm = SpeculativeAlgorithm.from_string(None)
        s.page_size = cfg.page_size
        s.enable_hierarchical_cache = s.enable_lmcache = s.enable_session_radix_cache = False
        s.enable_hicache_storage = s.enable_unified_cache_external_linker = s.enable_decode_hicache = False
        s.enable_hisparse = s.attn_dp_enabled = s.enable_unified_memory = False
        s.is_generation = True
        s.disaggregation_mode = DisaggregationMode.NULL
        s.require_mlp_sync = False
        s.max_running_requests = self.max_running_requests
        s.max_prefill_tokens = cfg.max_prefill_tokens
        s.device = "cpu"
        s.max_queued_requests = None  # server_args.max_queued_requests (no limit)
        # init_model_worker: the min-free-slots delayer as SGLang resolves it (off by default)
        from sglang.srt.managers.min_free_slots_delayer import MinFreeSlotsDelayer, resolve_min_free_slots
        m = resolve_min_free_slots(cfg.min_free_slots_delay, s.max_running_requests, is_dflash_family=False)
        s.min_free_slots_delayer = None if m is None else MinFreeSlotsDelayer(min_free_slots=m)
        # init_model_config: only what the batch code reads
        s.model_config = SimpleNamespace(vocab_size=1 << 40, is_encoder_decoder=False, is_multimodal=False,
                                         num_key_value_heads=1, context_len=self.max_context_len,
                                         self_opened_think_start_ids=None, think_end_ids=None)  # not a reasoning model
        # kv_cache_builder.build_kv_cache: the pools on CPU, the radix cache over them
        s.req_to_token_pool = ReqToTokenPool(size=self.max_running_requests, max_context_len=self.max_context_len,
                                             device="cpu", enable_memory_saver=False)
        if self.page_size == 1:
            s.token_to_kv_pool_allocator = TokenToKVPoolAllocator(self.capacity_tokens, torch.int64, "cpu", None, False)
        else:
            s.token_to_kv_pool_allocator = PagedTokenToKVPoolAllocator(self.capacity_tokens, self.page_size,
                                                                       torch.int64, "cpu", None, False)
        s.tree_cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=s.req_to_token_pool,
                                                  token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
                                                  page_size=self.page_size,
                                                  chunked_prefill_size=cfg.chunked_prefill_size))
        s.is_hybrid_swa = s.is_hybrid_ssm = False
        s.disable_radix_cache = False
        s.decode_offload_manager = None
        s.hisparse_coordinator = None
        s.dllm_config = None
        s.metrics_collector = _Inert()
        s.metrics_reporter = _Metrics()
        s.scheduler_stage_metrics = None  # no stage timing (the decorator then calls straight through)
        s.load_inquirer = SimpleNamespace(_get_num_pending_tokens=lambda **kw: 0)  # load metrics for routers
        s.grammar_manager = _Inert()  # no structured output: no waiting grammars
        s.init_running_status()  # SGLang's: waiting_queue, running_batch, last_batch, ...
        # init_chunked_prefill (its model-implementation probe loads the model registry; a text model)
        s.chunked_prefill_size = cfg.chunked_prefill_size if cfg.chunked_prefill_size and cfg.chunked_prefill_size > 0 else None
        s.prefill_decode_interval = cfg.prefill_decode_interval or 0
        s._prefill_decode_interval_remaining = 0
        s.prefill_decode_interval_min_bs = cfg.prefill_decode_interval_min_bs
        s.chunked_req = s._pending_chunked_abort_req = None
        s.is_mixed_chunk = s.chunked_prefill_size is not None and cfg.enable_mixed_chunk
        s.dynamic_chunk_sizer = None  # maybe_init_dynamic_chunk_sizer: PP only
        s.init_schedule_policy()  # SGLang's: SchedulePolicy, NewTokenRatioTracker.from_config()
        s.init_deterministic_inference_config()  # SGLang's: truncation_align_size (None: not deterministic)
        s.max_req_len = self.max_context_len
        # the model worker: the scheduler asks its runner for the attention backend's tile (AMD's
        # admission budget only) and whether prefill tracks SWA; no model is loaded
        s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=SimpleNamespace(), prefill_aware_swa=False,
                                                                   canary_manager=None))
        s.weight_updater = SimpleNamespace(offload_tags=set())  # no weights offloaded
        s.init_dp_attn_adapter()  # SGLang's (DP attention off: it passes batches through)
        # maybe_init_ngram_embedding: the model has no n-gram embedding; the manager passes the batch on
        s.ngram_embedding_manager = SimpleNamespace(prepare_for_forward=lambda batch, chunked_req=None: batch)
        s.future_map = None  # init_overlap: only the overlap scheduler has one
        s.init_beam_coordinator()  # SGLang's (no beam search here: no live groups)
        s.batch_result_processor = SchedulerBatchResultProcessor(
            is_generation=True, disaggregation_mode=s.disaggregation_mode, enable_overlap=False,
            enable_overlap_mlx=False, model_config=s.model_config, token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
            tree_cache=s.tree_cache, hisparse_coordinator=None, req_to_token_pool=s.req_to_token_pool,
            decode_offload_manager=None, metrics_collector=_Inert(), metrics_reporter=s.metrics_reporter, draft_worker=None,
            model_worker=None, logprob_result_processor=SchedulerLogprobResultProcessor(model_config=s.model_config),
            output_streamer=_Inert(), beam_coordinator=s.beam_coordinator, abort_request=_Inert())
        return s

    # ---------------------------------------------------------------- the loop
    def run(self, requests) -> dict:
        """Serve inferlab ``Request``s (sorted by arrival) to the end; per request id, its Outcome."""
        with published(**self.server_args):
            return self._run(list(requests))

    def _run(self, requests) -> dict:
        from sglang.srt.managers.utils import GenerationBatchResult

        s = self.scheduler = self._build()
        out = {r.id: Outcome() for r in requests}
        reply = {str(r.id): list(r.output_tokens()) for r in requests}
        by_rid = {str(r.id): r.id for r in requests}
        self.evicted_tokens = self.hit_tokens = 0
        self.steps = 0
        tree_evict = s.tree_cache.evict

        self.evict_calls: list[tuple[int, int]] = []  # (tokens asked for, tokens evicted), in call order

        def counted_evict(params):
            res = tree_evict(params)
            self.evicted_tokens += res.num_tokens_evicted
            self.evict_calls.append((params.num_tokens, res.num_tokens_evicted))
            return res

        s.tree_cache.evict = counted_evict
        requeue = s._add_request_to_queue

        def add_to_queue(req, is_retracted=False):  # Scheduler._add_request_to_queue, counting retractions
            if is_retracted:
                out[by_rid[req.rid]].preemptions += 1
                pending.add(req.rid)
            requeue(req, is_retracted=is_retracted)

        s._add_request_to_queue = add_to_queue
        pending: set[str] = set()  # requests waiting for an admission (arrived, or retracted)
        now, nxt, n, live, idle = 0.0, 0, len(requests), 0, 0
        while nxt < n or live:
            # ingest_requests: what has arrived by now joins the waiting queue
            while nxt < n and requests[nxt].arrival_s <= now:
                r = requests[nxt]
                nxt += 1
                sp = SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=self.ignore_eos)
                sp.normalize(None)  # TokenizerManager does this (no tokenizer: token-id prompts)
                req = Req(str(r.id), "", array("q", r.prompt), sp)
                s._add_request_to_queue(req)
                pending.add(req.rid)
                live += 1
            # event_loop_normal: get_next_batch_to_run -> run_batch -> process_batch_result
            plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
            s.running_batch = plan.running_batch
            batch = plan.batch_to_run
            if batch is None:
                s.last_batch = None
                # on_idle: when fully idle (nothing running, waiting or chunked) the ratio restarts
                if not s.waiting_queue and s.running_batch.is_empty() and s.chunked_req is None:
                    s.new_token_ratio_tracker.reset()
                idle += 1
                if nxt < n:
                    now = max(now, requests[nxt].arrival_s)
                    continue
                if idle > 3:
                    raise RuntimeError(f"sglang stuck: {len(s.waiting_queue)} waiting, "
                                       f"{s.running_batch.batch_size()} running")
                continue
            idle = 0
            now += 1.0
            self.steps += 1
            s.forward_ct += 1
            extend = batch.forward_mode.is_extend()
            if extend:  # admissions (prepare_for_extend ran): the prefix each newly admitted request hit
                for req in batch.reqs:
                    if req.rid in pending:
                        pending.discard(req.rid)
                        o = out[by_rid[req.rid]]
                        self.hit_tokens += req.prefix_len
                        if o.cached_tokens is None:
                            o.cached_tokens = req.prefix_len
                        else:
                            o.recomputed_tokens += len(req.origin_input_ids) + len(req.output_ids) - req.prefix_len
            # the stub model runner: the next token of each request that samples
            tokens = []
            for req in batch.reqs:
                tokens.append(reply[req.rid][len(req.output_ids)] if len(req.output_ids) < len(reply[req.rid]) else 0)
            result = GenerationBatchResult(next_token_ids=torch.tensor(tokens, dtype=torch.int64),
                                           can_run_cuda_graph=False)
            before = {req.rid: len(req.output_ids) for req in batch.reqs}
            if extend:
                s.batch_result_processor.process_batch_result_prefill(batch, result)
            else:
                s.batch_result_processor.process_batch_result_decode(batch, result)
            for req in batch.reqs:
                o = out[by_rid[req.rid]]
                if before[req.rid] == 0 and len(req.output_ids) == 1 and o.first_token_s is None:
                    o.first_token_s = now
                o.output_tokens = len(req.output_ids)
                if req.finished() and o.finish_s is None:
                    o.finish_s = now
                    live -= 1
            s.last_batch = batch
        # drained: nothing locked, every cell either free or in the tree
        tree, alloc = s.tree_cache, s.token_to_kv_pool_allocator
        if tree.evictable_size() != tree.total_size() or alloc.available_size() + tree.total_size() != self.capacity_tokens:
            raise AssertionError(f"sglang leaked KV: {alloc.available_size()} free + {tree.total_size()} in the tree "
                                 f"({tree.evictable_size()} unlocked) of {self.capacity_tokens}")
        return out


def inferlab_outcomes(run) -> dict:
    """The same fields from an inferlab Run's records."""
    return {r.id: Outcome(cached_tokens=r.cached_tokens if r.ttft_s is not None or r.finish_s is not None else None,
                          recomputed_tokens=r.recomputed_tokens, preemptions=r.preemptions,
                          first_token_s=None if r.ttft_s is None else r.arrival_s + r.ttft_s,
                          finish_s=r.finish_s, output_tokens=r.output_tokens) for r in run.requests}


FIELDS = ("cached_tokens", "recomputed_tokens", "preemptions", "first_token_s", "finish_s", "output_tokens")


def differences(engine: dict, ours: dict) -> list[tuple]:
    """(request id, field, SGLang's value, inferlab's value) wherever they differ."""
    return [(rid, f, getattr(engine[rid], f), getattr(ours[rid], f))
            for rid in engine for f in FIELDS if getattr(engine[rid], f) != getattr(ours[rid], f)]


def record_evictions(manager) -> list[tuple[int, int]]:
    """(tokens asked for, tokens evicted) of every call inferlab's manager makes on its tree."""
    calls, evict = [], manager.tree.evict

    def counted(n):
        freed = evict(n)
        calls.append((n, freed))
        return freed

    manager.tree.evict = counted
    return calls

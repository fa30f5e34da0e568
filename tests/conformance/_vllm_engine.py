"""vLLM's own scheduler, KV-cache manager and block pool, driven like inferlab's simulator.

``VllmEngine`` builds vLLM's ``Scheduler`` the way vLLM's tests do (``tests/v1/core/utils.py``
``create_scheduler``): a ``VllmConfig`` from a local ``config.json`` (a tiny Llama, no weights,
no tokenizer), a ``KVCacheConfig`` with one full-attention group of ``num_blocks`` blocks, and a
stub model runner: after each ``schedule()``, every request whose computed tokens caught up with
its tokens samples its next token, the one inferlab's ``Request.output_tokens()`` gives it (so
block hashes of generated tokens are the same content in both), and ``update_from_output``
takes it. Time is inferlab's: one step per unit, arrivals added before the step they precede.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from _vllm_sglang_shims import install

install()

import torch  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.request import Request as VRequest  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402

import vllm  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402


class StubForCausalLM(torch.nn.Module):
    """The model class ModelConfig inspects: a decoder for text generation that is never run
    (the stub model runner below samples the tokens). Registered as a class, it is inspected
    in this process (vLLM's registered architectures are inspected in a subprocess, which would
    import the real model code and its kernels)."""

    def __init__(self, *, vllm_config=None, prefix: str = ""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


ModelRegistry.register_model("StubForCausalLM", StubForCausalLM)

VERSION = vllm.__version__
MAX_MODEL_LEN = 1 << 20  # no length limit inside the workloads (inferlab's max_model_len=None)


def _model_dir() -> str:
    d = Path(tempfile.gettempdir()) / "inferlab-conformance-tiny-llama"
    d.mkdir(exist_ok=True)
    cfg = {"architectures": ["StubForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
           "vocab_size": 32000, "max_position_embeddings": MAX_MODEL_LEN, "torch_dtype": "float32",
           "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


@dataclass
class Outcome:
    """What one request got, in inferlab's record terms."""

    cached_tokens: int | None = None  # prompt tokens hit at first admission
    recomputed_tokens: int = 0  # tokens computed again after preemptions (num_tokens - hit at each resume)
    preemptions: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    output_tokens: int = 0
    scheduled: list[int] = field(default_factory=list)  # tokens scheduled per step it ran in


class VllmEngine:
    def __init__(self, num_blocks: int, *, block_size: int = 16, max_num_batched_tokens: int = 2048,
                 max_num_seqs: int = 256, enable_prefix_caching: bool = True, watermark: float = 0.0):
        sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True, watermark=watermark,
                                is_encoder_decoder=False)
        model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, dtype="float32", seed=0,
                            max_model_len=MAX_MODEL_LEN)
        cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
        config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache,
                            device_config=DeviceConfig(device="cpu"))
        kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                                          dtype=torch.float32))])
        cache.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
                                   block_size=block_size, log_stats=True)
        init_none_hash(sha256)
        self.block_hasher = get_request_block_hasher(block_size, sha256)
        # per-run counters: blocks whose cached content allocation evicted, prefix-cache stats
        self.evictions = self.queries = self.hits = 0
        pool, kvm = self.scheduler.kv_cache_manager.block_pool, self.scheduler.kv_cache_manager
        evict, make_stats = pool._maybe_evict_cached_block, kvm.make_prefix_cache_stats

        def counted_evict(block):
            evicted = evict(block)
            self.evictions += bool(evicted)
            return evicted

        def accumulated_stats():
            st = make_stats()
            if st is not None:
                self.queries += st.queries
                self.hits += st.hits
            return st

        pool._maybe_evict_cached_block = counted_evict
        kvm.make_prefix_cache_stats = accumulated_stats

    def free_queue(self) -> list[int]:
        """The free-block queue, head (allocated next) to tail."""
        return [b.block_id for b in self.scheduler.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()]

    def run(self, requests) -> dict:
        """Serve inferlab ``Request``s (sorted by arrival) to the end; per request id, its Outcome."""
        s = self.scheduler
        out: dict = {r.id: Outcome() for r in requests}
        reply = {str(r.id): list(r.output_tokens()) for r in requests}
        by_vid = {str(r.id): r.id for r in requests}
        now, nxt, n, live, idle = 0.0, 0, len(requests), 0, 0
        while nxt < n or live:
            while nxt < n and requests[nxt].arrival_s <= now:
                r = requests[nxt]
                nxt += 1
                s.add_request(VRequest(request_id=str(r.id), prompt_token_ids=list(r.prompt),
                                       sampling_params=SamplingParams(max_tokens=r.max_new_tokens, ignore_eos=True,
                                                                      detokenize=False),
                                       pooling_params=None, arrival_time=r.arrival_s, block_hasher=self.block_hasher))
                live += 1
            if not live:
                now = max(now, requests[nxt].arrival_s)
                continue
            before = {rid: (req.status, req.num_preemptions) for rid, req in s.requests.items()}
            so = s.schedule()
            if so.total_num_scheduled_tokens == 0:
                idle += 1
                if nxt < n:
                    now = max(now, requests[nxt].arrival_s)
                    continue
                if idle > 3:
                    raise RuntimeError(f"vllm stuck with {len(s.waiting)} waiting, {len(s.running)} running")
                continue
            idle = 0
            now += 1.0
            ids, sampled, held = [], [], {}
            for vid, k in so.num_scheduled_tokens.items():
                req, o = s.requests[vid], out[by_vid[vid]]
                held[vid] = req
                status0, _ = before.get(vid, (RequestStatus.WAITING, 0))
                o.scheduled.append(k)
                if status0 in (RequestStatus.WAITING, RequestStatus.PREEMPTED):  # admitted in this step
                    hit = req.num_computed_tokens - k
                    if o.cached_tokens is None:
                        o.cached_tokens = hit
                    else:
                        o.recomputed_tokens += req.num_tokens - hit
                ids.append(vid)
                if req.num_computed_tokens >= req.num_tokens:  # caught up: the model samples a token
                    tok = reply[vid][len(req.output_token_ids)]
                    sampled.append([tok])
                    if not req.output_token_ids:
                        o.first_token_s = now
                else:
                    sampled.append([])  # a prefill chunk: nothing sampled
            s.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={v: i for i, v in enumerate(ids)},
                                                       sampled_token_ids=sampled))
            for vid in ids:
                req, o = held[vid], out[by_vid[vid]]
                o.preemptions = req.num_preemptions
                o.output_tokens = len(req.output_token_ids)
                if req.is_finished():
                    o.finish_s = now
                    live -= 1
        self.scheduler.kv_cache_manager.make_prefix_cache_stats()  # the last step's counts
        return out


def inferlab_outcomes(run) -> dict:
    """The same fields from an inferlab Run's records."""
    return {r.id: Outcome(cached_tokens=r.cached_tokens, recomputed_tokens=r.recomputed_tokens,
                          preemptions=r.preemptions,
                          first_token_s=None if r.ttft_s is None else r.arrival_s + r.ttft_s,
                          finish_s=r.finish_s, output_tokens=r.output_tokens) for r in run.requests}


FIELDS = ("cached_tokens", "recomputed_tokens", "preemptions", "first_token_s", "finish_s", "output_tokens")


def differences(engine: dict, ours: dict) -> list[tuple]:
    """(request id, field, engine's value, inferlab's value) wherever they differ."""
    return [(rid, f, getattr(engine[rid], f), getattr(ours[rid], f))
            for rid in engine for f in FIELDS if getattr(engine[rid], f) != getattr(ours[rid], f)]

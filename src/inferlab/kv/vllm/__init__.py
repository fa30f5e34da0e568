"""vLLM v1, cut as vLLM cuts it: ``block_pool`` (blocks, free queue, block hashes),
``kv_cache_manager`` (per-request block tables: lookup, allocate_slots, free, hit metrics) and
``scheduler`` (admission, chunked prefill, preemption, the decode clock). The rules, with their
sources in vLLM's code: docs/engines/vllm.md."""

from .block_pool import NONE_HASH, BlockPool, FreeBlockQueue, block_keys
from .kv_cache_manager import KVCacheManager, VllmRequest
from .scheduler import VLLM_VERSIONS, PagedManager

__all__ = ["NONE_HASH", "BlockPool", "FreeBlockQueue", "block_keys", "KVCacheManager", "VllmRequest",
           "VLLM_VERSIONS", "PagedManager"]

"""vLLM v1's KV manager and scheduler: the names the registry and the facade import. The code
lives in :mod:`inferlab.kv.vllm` (block pool, KV-cache manager, scheduler); the rules in
docs/engines/vllm.md."""

from .vllm import NONE_HASH, VLLM_VERSIONS, BlockPool, FreeBlockQueue, KVCacheManager, PagedManager, VllmRequest, block_keys

__all__ = ["NONE_HASH", "VLLM_VERSIONS", "BlockPool", "FreeBlockQueue", "KVCacheManager", "PagedManager",
           "VllmRequest", "block_keys"]

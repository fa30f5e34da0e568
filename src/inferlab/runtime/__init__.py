"""The measuring runtime: a real llama-family GGUF (or the case study's SmallTransformer) in
torch, generating with and without KV caches (contiguous, paged, int8, sliding window, prefix
reuse), profiled and compared with inferlab.perf_model. Needs the `runtime` extra (torch,
tokenizers, gguf, numpy); the core never imports this package."""

from .generate import GenerationResult, PrefixCache, SamplingParams, generate
from .kv_cache import CACHE_KINDS, CacheSpec
from .llama import LlamaModel, load_gguf

__all__ = ["CACHE_KINDS", "CacheSpec", "GenerationResult", "LlamaModel", "PrefixCache", "SamplingParams", "generate", "load_gguf"]

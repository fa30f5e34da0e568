"""SGLang, cut as SGLang cuts it: ``radix_cache`` (the tree: match, insert, locks, eviction),
``schedule_policy`` (waiting-queue order and the PrefillAdder's budgets) and ``scheduler`` (the
loop: prefill-first rounds, decode, retraction, the new-token ratio). The rules, with their
sources in SGLang's code: docs/engines/sglang.md."""

from .radix_cache import Node, RadixCache, RadixTree
from .schedule_policy import CLIP_MAX_NEW_TOKENS, SCHEDULE_POLICIES, PrefillAdder, calc_priority
from .scheduler import SGLANG_VERSIONS, RadixManager, SglangRequest

__all__ = ["Node", "RadixCache", "RadixTree", "CLIP_MAX_NEW_TOKENS", "SCHEDULE_POLICIES", "PrefillAdder",
           "calc_priority", "SGLANG_VERSIONS", "RadixManager", "SglangRequest"]

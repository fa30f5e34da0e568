"""SGLang's scheduler with the radix cache: the names the registry and the facade import. The
code lives in :mod:`inferlab.kv.sglang` (radix cache, schedule policy, scheduler); the rules in
docs/engines/sglang.md."""

from .sglang import (CLIP_MAX_NEW_TOKENS, SCHEDULE_POLICIES, SGLANG_VERSIONS, Node, PrefillAdder, RadixCache,
                     RadixManager, RadixTree, SglangRequest, calc_priority)

__all__ = ["CLIP_MAX_NEW_TOKENS", "SCHEDULE_POLICIES", "SGLANG_VERSIONS", "Node", "PrefillAdder", "RadixCache",
           "RadixManager", "RadixTree", "SglangRequest", "calc_priority"]

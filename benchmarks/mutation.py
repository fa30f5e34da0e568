"""Mutation benchmark: how many small deliberate bugs in the core does the test suite catch?

    flock /tmp/inferlab-heavy.lock python benchmarks/mutation.py [--per-target 25] [--seed 1]
        [--targets speed,placement,...] [--timeout-factor 4] [--json benchmarks/results/mutation.json]
    python benchmarks/mutation.py --merge benchmarks/results/mutation_core.json mutation_sglang.json ... \
        --json benchmarks/results/mutation.json   # runs made apart (one per target), counted as one

Each mutant changes one AST node of one core module: a comparison flipped (< <=, > >=, == !=,
in / not in, is / is not), + and - swapped, * and / swapped, a term dropped (a + b -> a, a - b -> a),
an integer or small float constant moved by one (n -> n + 1, n -> n - 1; 0 -> 1), a float of 100 or
more x10 and /10 (a unit slip), min and max swapped, and / or swapped, a `not` removed. Nothing is
mutated inside docstrings, raise or assert statements (error messages), annotations, decorators
(a cache's maxsize) or the KV managers' check_invariants (an oracle the tests call, not
behaviour). The repository's src/ and tests/ are copied to /tmp/mut-*, so /work/main is never
touched (other people edit it meanwhile); each mutant is written into the copy and the
target's test subset runs against it (PYTHONPATH = the copy's src, -x, -m "not slow", the tests that
fail on the unmutated copy deselected). A mutant is killed when the subset fails or runs past
timeout-factor x the unmutated run (an endless loop); it survives when the subset passes. Mutation
sites are sampled (--per-target N per target, --seed): the share killed is an estimate; --all takes
every site. The golden digests of tests/equivalence are not in any subset: they catch every change,
not bugs.

Survivors known to be equivalent (no valid input can tell them from the original) are listed in
EQUIVALENT with the reason, keyed by module, the start of the mutated line and the mutation; they
are reported apart and left out of the killed share.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# target -> (modules under src/inferlab, test subset); the KV managers are one target per engine
PERF_TESTS = ["tests/perf", "--ignore=tests/perf/test_heldout.py"]  # the held-out refits score calibration, not these modules
TARGETS = {
    "placement": (["perf/placement.py"], PERF_TESTS),
    "speed": (["perf/speed.py"], PERF_TESTS),
    "kv_size": (["perf/kv_size.py"], PERF_TESTS),
    "plan": (["quant/plan.py"], ["tests/quant", *PERF_TESTS]),
    "llamacpp": (["kv/llamacpp/server.py", "kv/llamacpp/slots.py", "kv/llamacpp/prompt_cache.py"], ["tests/kv"]),
    "vllm": (["kv/vllm/block_pool.py", "kv/vllm/kv_cache_manager.py", "kv/vllm/scheduler.py"], ["tests/kv"]),
    "sglang": (["kv/sglang/radix_cache.py", "kv/sglang/schedule_policy.py", "kv/sglang/scheduler.py"], ["tests/kv"]),
    "tokenizer": (["runtime/tokenizer.py"], ["tests/runtime/test_vocab_files.py", "tests/runtime/test_tokenizer_edges.py",
                                            "tests/runtime/test_tokenizer_template.py"]),
}

KV_TARGETS = ("llamacpp", "vllm", "sglang")

# (module, the mutated line's source as it starts, mutation) -> why no test can kill it
EQUIVALENT: dict[tuple[str, ...], str] = {  # (module, line start, mutation[, node])
    ("perf/placement.py", "if not _gpus_fit(best, fit_target_bytes) and gpus:", "boolop And->Or"):
        "when the full offload already fits, searching anyway finds the same largest -ngl (GPU bytes grow with "
        "-ngl), and without GPUs `not _gpus_fit` is False and gpus empty either way",
    ("perf/placement.py", "shares = tuple(tensor_split) if tensor_split else (tuple(g.memory_gb for g in gpus) if len(gpus) > 1",
     "cmp Gt->GtE"):
        "with one GPU the split shares are (memory_gb,) instead of (1.0,): _split_counts gives a single device "
        "every layer whatever its share; only the layout memo's key differs",
    ("perf/speed.py", '"bound": "compute" if comp_s > mem_s', "cmp Gt->GtE"):
        "differs only when compute and memory take exactly the same seconds, where both roofs bind and the label "
        "is a convention (the step time is max() of the two either way)",
    ("perf/speed.py", "nkvo_blocks = sum(g.n_blocks for g in placement.devices[1:]", "const -1"):
        "devices[0:] adds the host, which never holds a block without its cache (with -nkvo it holds every cache, "
        "without it its own blocks'; every layer caches K/V or a latent), so it adds 0 blocks",
    ("perf/placement.py", "ngl_max = L + 1 if gpus else 0", "const +1", "0"):
        "without GPUs place() has already set n_gpu_layers to 0, so ngl_max only bounds min(0, ngl_max) and the "
        "--fit search that uses it is never reached",
    ("perf/placement.py", "if n_gpu_layers_total and len(shares) == 1:", "const -1"):
        "the one-GPU branch is a fast path: the general split gives one share every layer (_split_counts "
        "returns [n]) and the output layer to that GPU, the same ranges",
    ("quant/plan.py", "if hit is not None and hit[0] is tensors:", "const +1"):
        "hit[1] (the plan) is never the tensor table, so the memo always misses and the plan is recomputed: the same plan",
    ("perf/kv_size.py", "if context <= 0:", "cmp LtE->Lt"):
        "at context 0 the general formula gives the same zeros (min(0, window) and 0 cells)",
    ("kv/sglang/radix_cache.py", "boff += step", "augassign Add->Sub"):
        "_advance runs only after a match floored to a page boundary inside an edge, which then splits; the "
        "edge's remainder diverges from the prompt within its first page, so the next lookup from the cursor "
        "finds no child either way (unless the prompt repeats that page elsewhere) and insert slices by `matched`",
    ("perf/placement.py", "used = model.n_experts_used / model.n_experts if model.is_moe else 1.0", "const +1"):
        "the share multiplies expert tensors only, and a model that is not MoE has none",
    ("perf/placement.py", "used = model.n_experts_used / model.n_experts if model.is_moe else 1.0", "const -1"):
        "the share multiplies expert tensors only, and a model that is not MoE has none",
    ("quant/plan.py", "if len(_FILE_PLANS) > 64:", "const -1"): "the memo's size bound: a smaller memo computes the same plans",
    ("quant/plan.py", "if len(_FILE_PLANS) > 64:", "const +1"): "the memo's size bound: a larger memo computes the same plans",
    ("quant/plan.py", "if len(_FILE_PLANS) > 64:", "cmp Gt->GtE"): "the memo's size bound, one entry fewer: the same plans",
    ("perf/placement.py", "if len(pre.memo) > 4096:", "const -1"): "the memo's size bound: the same layouts",
    ("perf/placement.py", "if len(pre.memo) > 4096:", "const +1"): "the memo's size bound: the same layouts",
    ("perf/placement.py", "if len(pre.memo) > 4096:", "cmp Gt->GtE"): "the memo's size bound: the same layouts",
    ("kv/sglang/schedule_policy.py", "return 0 * new_token_ratio", "binop Mult->Div"):
        "0 / ratio == 0 * ratio == 0 for every ratio the scheduler holds: it never falls below min = init * 0.14, "
        "and init = min(0.7 * schedule_conservativeness, 1) with conservativeness > 0 (checked)",
    ("kv/sglang/schedule_policy.py", "if max(map(_out_len, running)) <= CLIP_MAX_NEW_TOKENS:", "cmp LtE->Lt"):
        "when the longest max_new_tokens is exactly 4096 the clipping branch sums min(out - done, 4096) = out - done, "
        "the unclipped branch's figure",
    ("kv/sglang/radix_cache.py", "step = min(n, runs[bi][1] - boff)", "call min->max"):
        "the cursor _advance returns is read only by the next child lookup below the edge the page-floored match just split, whose one child is the split-off rest; that rest's first page holds the divergence, so no lookup finds it from any cursor (unless the prompt repeats that page elsewhere), and insert slices by `matched`, not by the cursor",
    ("kv/sglang/radix_cache.py", "step = min(n, runs[bi][1] - boff)", "binop Sub->Add"):
        "the cursor _advance returns is read only by the next child lookup below the edge the page-floored match just split, whose one child is the split-off rest; that rest's first page holds the divergence, so no lookup finds it from any cursor (unless the prompt repeats that page elsewhere), and insert slices by `matched`, not by the cursor",
    ("kv/sglang/radix_cache.py", "step = min(n, runs[bi][1] - boff)", "drop right term"):
        "the cursor _advance returns is read only by the next child lookup below the edge the page-floored match just split, whose one child is the split-off rest; that rest's first page holds the divergence, so no lookup finds it from any cursor (unless the prompt repeats that page elsewhere), and insert slices by `matched`, not by the cursor",
    ("kv/sglang/radix_cache.py", "bi, boff = bi + 1, 0", "binop Add->Sub"):
        "the cursor _advance returns is read only by the next child lookup below the edge the page-floored match just split, whose one child is the split-off rest; that rest's first page holds the divergence, so no lookup finds it from any cursor (unless the prompt repeats that page elsewhere), and insert slices by `matched`, not by the cursor",
    ("kv/sglang/radix_cache.py", "bi, boff = bi + 1, 0", "drop right term"):
        "the cursor _advance returns is read only by the next child lookup below the edge the page-floored match just split, whose one child is the split-off rest; that rest's first page holds the divergence, so no lookup finds it from any cursor (unless the prompt repeats that page elsewhere), and insert slices by `matched`, not by the cursor",
    ("kv/sglang/radix_cache.py", "bi, boff = bi + 1, 0", "const -1"):
        "the cursor _advance returns is read only by the next child lookup below the edge the page-floored match just split, whose one child is the split-off rest; that rest's first page holds the divergence, so no lookup finds it from any cursor (unless the prompt repeats that page elsewhere), and insert slices by `matched`, not by the cursor",
    ("kv/sglang/radix_cache.py", "return self.last_access < other.last_access", "cmp Lt->LtE"):
        "heapq only compares distinct heap entries, and no two of them share an access time: every touch takes a new tick; a split's upper node copies the lower one's, but enters the heap only after the lower one left it",
    ("kv/sglang/radix_cache.py", "self.root.lock_ref = 1", "const +1"):
        "the root's lock count is never read: inc_lock/dec_lock stop below the root, evict never pushes it",
    ("kv/sglang/radix_cache.py", "self.root.lock_ref = 1", "const -1"):
        "the root's lock count is never read: inc_lock/dec_lock stop below the root, evict never pushes it",
    ("kv/sglang/radix_cache.py", "self.tick = 0", "const +1"):
        "every access time moves by one; only their order is used (LRU heap)",
    ("kv/sglang/radix_cache.py", "self.tick += 1", "const +1"):
        "a stride of 2 instead of 1 keeps every access time's order (LRU heap, the new leaf strictly newer)",
    ("kv/sglang/radix_cache.py", "self.root = Node((), None, 0)", "const +1"):
        "the root's access time is never compared: the root is never a leaf in the eviction heap",
    ("kv/sglang/radix_cache.py", "return runs[0][0] if self.page_size == 1 else first_tokens_key(runs, self.page_size)", "const +1"):
        "a fast path: first_tokens_key(runs, 1) is runs[0][0] (one token is always one run)",
    ("kv/sglang/radix_cache.py", "return runs[0][0] if self.page_size == 1 else first_tokens_key(runs, self.page_size)", "const -1"):
        "a fast path: first_tokens_key(runs, 1) is runs[0][0] (one token is always one run)",
    ("kv/sglang/radix_cache.py", "if p == 1:", "const +1"):
        "a fast path: first_tokens_key(((start + boff, n - boff), ...), 1) is start + boff, the key the p == 1 branch computes",
    ("kv/sglang/radix_cache.py", "if p == 1:", "const -1"):
        "a fast path: first_tokens_key(((start + boff, n - boff), ...), 1) is start + boff, the key the p == 1 branch computes",
    ("kv/sglang/radix_cache.py", "if rest and matched < length:", "cmp Lt->LtE"):
        "at matched == length the rest is slice_runs(runs, length, length) = (), which insert treats as no rest",
    ("kv/sglang/radix_cache.py", "if rest and matched < length:", "boolop And->Or"):
        "match_prefix ignores the rest it is given; for insert rest is True and the condition is unchanged",
    ("kv/sglang/radix_cache.py", "while length - matched >= p and bi < nruns:", "cmp Lt->LtE"):
        "the cursor reaches the end of the runs only when every token matched, where length - matched >= p already failed",
    ("kv/sglang/schedule_policy.py", "scratch = RadixCache(1)", "const +1"):
        "a page-2 scratch tree floors each share to an even count, and the deprioritise threshold 32 is even: floor(s / 2) * 2 >= 32 exactly when s >= 32",
    ("kv/sglang/schedule_policy.py", "weight[node] = weight.get(node, 0) + 1", "const +1"):
        "dfs-weight only sorts children by weight (stably) and tests membership: counting from 1 or in steps of 2 "
        "shifts or scales every weight alike, so the order is the same",
    ("kv/sglang/scheduler.py", "retracted += 1", "augassign Add->Sub"):
        "_retract reads `retracted` only as a truth value (has one been retracted yet); -1, -2 ... are as true as 1, 2 ...",
    ("kv/sglang/scheduler.py", "retracted += 1", "const +1"):
        "_retract reads `retracted` only as a truth value (has one been retracted yet); 2, 4 ... are as true as 1, 2 ...",
    ("kv/sglang/scheduler.py", "if self.private_tokens or self.tree.evictable_tokens != self.tree.total_tokens:", "boolop Or->And"):
        "check_drained runs check_invariants first; with no live request that already demands 0 private cells and no locks (every node evictable), so this second test can never fire, in either form",
    ("kv/sglang/scheduler.py", "if self.available() < need:", "cmp Lt->LtE"):
        "in _decode_fits (0.5.23's check_decode_mem): at available == need it evicts need - available = 0 tokens, which frees nothing (the same text in _decode is killed by test_a_decode_step_that_exactly_fits_...)",
    ("kv/sglang/scheduler.py", "if self.page_size == 1:", "const -1"):
        "_decode_need's page-1 fast path: with page_size 1 the paged sum counts one cell per request (n % 1 == 0), len(reqs), and page 0 is invalid",
    ("kv/sglang/scheduler.py", "if self.page_size > 1:", "const -1"):
        "page-1 paths: the paged need sums one cell per request (n % 1 == 0), len(running); the batch eviction for len(running) cells finds them free (the step evicted or retracted for exactly that just before)",
    ("kv/sglang/scheduler.py", "if self.page_size > 1:", "cmp Gt->GtE"):
        "page-1 paths: the paged need sums one cell per request (n % 1 == 0), len(running); the batch eviction for len(running) cells finds them free (the step evicted or retracted for exactly that just before)",
    ("kv/sglang/scheduler.py", "seq.last_node, seq.prefix_len = self.tree.root, 0", "const +1"):
        "a finished or retracted request's prefix_len is never read again: finished ones are gone, a retracted one is re-matched (prefix_len set from the match) before anything reads it, and invariants check live ones only",
    ("kv/sglang/scheduler.py", "if self.available() < want:", "cmp Lt->LtE"):
        "release_req's eviction of the 20-step shortfall: at available == want it evicts 0 tokens, which frees nothing",
    ("kv/sglang/scheduler.py", "if self.page_size == 1 and self.available() >= len(self.running):", "cmp GtE->Gt"):
        "at available == len(running) the general per-request loop allocates the same cells, records the same Allocate events in the same order and samples the same tokens as the inlined fast path",
    ("kv/sglang/scheduler.py", "if self.page_size == 1 and self.available() >= len(self.running):", "const -1"):
        "page_size == 0 is never true: every page-1 decode takes the general loop, which does the same (see GtE->Gt)",
    ("kv/sglang/scheduler.py", "if c >= seq.prompt_len + seq.num_output:", "binop Add->Sub"):
        "every running request has caught up (num_computed = prompt + outputs - 1 before the step), so c >= prompt + outputs holds, and c >= prompt - outputs or c >= prompt hold as well",
    ("kv/sglang/scheduler.py", "if c >= seq.prompt_len + seq.num_output:", "drop right term"):
        "every running request has caught up (num_computed = prompt + outputs - 1 before the step), so c >= prompt + outputs holds, and c >= prompt - outputs or c >= prompt hold as well",
    ("kv/sglang/scheduler.py", "if seq.num_output == 1 and seq.first_token_s is None:", "cmp Eq->NotEq"):
        "dead in the decode fast path: a running request sampled at least its first token at prefill (num_output >= 2 after this step's increment) and the simulator stamped its first_token_s then, so the condition is false in every form",
    ("kv/sglang/scheduler.py", "if seq.num_output == 1 and seq.first_token_s is None:", "cmp Is->IsNot"):
        "dead in the decode fast path: a running request sampled at least its first token at prefill (num_output >= 2 after this step's increment) and the simulator stamped its first_token_s then, so the condition is false in every form",
    ("kv/sglang/scheduler.py", "if seq.num_output == 1 and seq.first_token_s is None:", "boolop And->Or"):
        "dead in the decode fast path: a running request sampled at least its first token at prefill (num_output >= 2 after this step's increment) and the simulator stamped its first_token_s then, so the condition is false in every form",
    ("kv/sglang/scheduler.py", "if seq.num_output == 1 and seq.first_token_s is None:", "const +1"):
        "dead in the decode fast path: a running request sampled at least its first token at prefill (num_output >= 2 after this step's increment) and the simulator stamped its first_token_s then, so the condition is false in every form",
    ("kv/sglang/scheduler.py", "if seq.num_output == 1 and seq.first_token_s is None:", "const -1"):
        "dead in the decode fast path: a running request sampled at least its first token at prefill (num_output >= 2 after this step's increment) and the simulator stamped its first_token_s then, so the condition is false in every form",
    ("kv/sglang/scheduler.py", "grow = 1 if self.page_size == 1 else", "const +1"):
        "the general decode loop's page-1 branch is never reached: at page 1 the step has already evicted or retracted until len(running) cells are free, so the inlined fast path runs; page_size == 0 sends page 1 to the paged formula, which gives the same one cell (n % 1 == 0). Its other constants (page 2, n % p == 1, else 1) are killed by the paged tests",
    ("kv/sglang/scheduler.py", "grow = 1 if self.page_size == 1 else", "const -1"):
        "the general decode loop's page-1 branch is never reached: at page 1 the step has already evicted or retracted until len(running) cells are free, so the inlined fast path runs; page_size == 0 sends page 1 to the paged formula, which gives the same one cell (n % 1 == 0). Its other constants (page 2, n % p == 1, else 1) are killed by the paged tests",
    ("runtime/tokenizer.py", "for k in range(1, len(merged)):", "const -1"):
        "the split at 0 pairs the empty piece with the whole one; no vocabulary holds the empty piece",
    ("runtime/tokenizer.py", "found.sort(key=lambda m: m[:3])", "const +1"):
        "(score, left id, right id) is unique per split already: the fourth element never breaks a tie",
    ("runtime/tokenizer.py", 'pairs = [tuple(m.split(" ", 1)) for m in merges]', "const +1"):
        "differs only for a merge of three or more space-separated parts; a GGUF merge is two byte-level pieces, "
        "which hold no space (byte-level BPE writes it as \u0120)",
    ("runtime/tokenizer.py", "unk = next((tokens[i] for i, kind in enumerate(token_types) if kind == UNKNOWN_TOKEN_TYPE), None)",
     "cmp Eq->NotEq"):
        "with the 256 byte tokens (llama.cpp cannot load a SentencePiece vocabulary without them: it looks up "
        "<0x0A>) byte fallback spells every character, so the unknown token is never emitted",
    # vLLM and llama.cpp KV managers (issue 18; each checked where noted with a battery of 300 random workloads:
    # records, summaries, timelines, per-step costs and events equal, event hash values aside)
    ("kv/vllm/block_pool.py", "self.map_epoch += 1", "const +1"):
        "the hash-map epoch grows by 2 instead of 1: lookup memos compare it for equality only, and it still changes "
        "with every change of the map",
    ("kv/vllm/block_pool.py", "if lo >= pos:", "cmp GtE->Gt"):
        "a full block that begins exactly where a run begins is keyed by the spanning-block rule (parent key, its "
        "runs) instead of the stretch rule (parent key, first id): both are functions of the parent key and the "
        "block's tokens, so every lookup hits the same blocks; only hash values differ (battery)",
    ("kv/vllm/kv_cache_manager.py", "if memo is not None and memo[0] == self.pool.map_epoch and memo[1] == n:",
     "const +1", "1"):
        "memo[2] is the hit list, never equal to an int: the memo always misses and the lookup is recomputed, "
        "giving the same hits (battery)",
    ("kv/vllm/kv_cache_manager.py", "if self.max_model_len is None and -(-(c + 1) // bs) - len(req.blocks) <= 1 and (",
     "cmp LtE->Lt"):
        "the decode fast path's guard: the mutant sends some decode tokens to allocate_slots' general path (the "
        "fast path's reference), which does the same block work: one block from the head of the free queue, the "
        "filled block registered (battery)",
    ("kv/vllm/kv_cache_manager.py", "if self.max_model_len is None and -(-(c + 1) // bs) - len(req.blocks) <= 1 and (",
     "const -1"):
        "the decode fast path's guard (c + 0, or <= 0): only which of two equal paths does the block work "
        "changes (battery)",
    ("kv/vllm/kv_cache_manager.py", "not self.enable_prefix_caching or (c + 1) // bs - req.num_cached_blocks <= 1):",
     "cmp LtE->Lt"):
        "the decode fast path's guard: the general path registers the filled block the same way (battery)",
    ("kv/vllm/kv_cache_manager.py", "not self.enable_prefix_caching or (c + 1) // bs - req.num_cached_blocks <= 1):",
     "const -1"):
        "the decode fast path's guard: only which of two equal paths does the block work changes (battery)",
    ("kv/vllm/scheduler.py", "need = sum((x + k - 1) // bs - (x - 1) // bs for x in c)", "binop Sub->Add",
     "x + k - 1"):
        "over-counts the blocks k decode steps need, so the decode fast-forward only gets shorter (k halves, or "
        "the steps are taken one by one, which give the same records); what moves is the float rounding of summed "
        "step times and kv_mean's trapezoid over a stretch (battery: records equal but for last-digit rounding)",
    ("kv/vllm/scheduler.py", "if c > s.prompt_len + s.out_len - 2 or len(s.blocks) != -(-c // bs) or (",
     "boolop Or->And"):
        "weakens _check_decode_clock, the decode clock's invariant check (an oracle the tests call, like "
        "check_invariants): with a correct clock it passes either way",
    ("kv/vllm/block_pool.py", "if self.num_stale > self.COMPACT_AT and self.num_stale * 2 > len(self.tail) - self.start:",
     "cmp Gt->GtE"):
        "the free queue's rebuild from its own live entries happens one stale copy earlier: the same queue "
        "(test_paged compares rebuilds at any point with a plain list)",
    ("kv/llamacpp/prompt_cache.py", "if self.limit_size > 0:", "const +1"):
        "in update(): alloc keeps size() <= limit_size (it skips a state over the limit and evicts for room), so "
        "update's byte loop never evicts, and with a 1-byte limit limit_size / size_per_token <= 1 <= limit_tokens; "
        "(the same text in alloc is not equivalent: test_alloc_makes_room_under_a_one_byte_limit kills it there)",
    ("kv/llamacpp/server.py", "k = min(k, q.out_len - q.num_output - 1, self.n_ctx_slot - 2 - q.num_computed)",
     "const +1", "1"):
        "one decode step fewer in a fast-forward stretch (the next step is taken one by one, with the same "
        "records); what moves is float rounding and kv_mean_tokens, whose fast-forward trapezoid differs from "
        "the per-step sum anyway (fast_forward=True vs False differ there on the original too)",
    ("kv/vllm/block_pool.py", "if self.start > self.COMPACT_AT and self.start * 2 > len(tail):", "cmp Gt->GtE"):
        "the free queue drops its consumed front one pop earlier: the same queue (test_vllm_rules' compaction "
        "case and test_paged's plain-list reference check the queue itself)",
    ("kv/llamacpp/server.py", "if n_past == seq.prompt_len and n_past > 0:", "cmp Gt->GtE"):
        "differs only when n_past == prompt_len == 0, an empty prompt: Request refuses one, and llama.cpp's "
        "update_slots releases a slot with an empty prompt before this rule",
    ("kv/llamacpp/prompt_cache.py", "size_per_token = max(1.0, f32(f32(self.size()) / f32(max(1, n))))", "const +1",
     "1"):
        "max(2, n) differs from max(1, n) only with at most 1 cached token, which never exceeds the token limit "
        "(limit_tokens_cur >= limit_tokens >= 1 where the loop runs): nothing is evicted either way",
}


def equivalent_because(module: str, line: str, kind: str, node: str | None = None) -> str | None:
    """The reason listed for this mutant; a key's optional 4th element names the mutated node's source
    (two sites of one kind on one line, e.g. two constants, where only one is equivalent)."""
    for key, why in EQUIVALENT.items():
        m, start, k = key[:3]
        if m == module and k == kind and line.startswith(start) and (len(key) < 4 or key[3] == node):
            return why
    return None


CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
            ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}


def _skip_regions(tree: ast.AST) -> set[int]:
    """ids of nodes not to mutate: raise/assert statements, annotations, docstrings (and all below them)."""
    skip: set[int] = set()

    def mark(n):
        for sub in ast.walk(n):
            skip.add(id(sub))

    for n in ast.walk(tree):
        if isinstance(n, (ast.Raise, ast.Assert)):
            mark(n)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in [*n.args.args, *n.args.kwonlyargs, *n.args.posonlyargs, n.args.vararg, n.args.kwarg]:
                if a is not None and a.annotation is not None:
                    mark(a.annotation)
            if n.returns is not None:
                mark(n.returns)
        elif isinstance(n, ast.AnnAssign):
            mark(n.annotation)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for dec in n.decorator_list:  # lru_cache(maxsize=...): a cache's size changes no result
                mark(dec)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "check_invariants":
            mark(n)  # the simulator's own invariant checks are test oracles, not behaviour
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                mark(first)
    return skip


def sites(tree: ast.AST) -> list[tuple[ast.AST, str, object]]:
    """Every (node, mutation name, detail) in a deterministic order (ast.walk)."""
    skip = _skip_regions(tree)
    out = []
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Compare):
            for i, op in enumerate(n.ops):
                if type(op) in CMP_SWAP:
                    out.append((n, f"cmp {type(op).__name__}->{CMP_SWAP[type(op)].__name__}", i))
        elif isinstance(n, ast.BinOp):
            if type(n.op) in BIN_SWAP:
                out.append((n, f"binop {type(n.op).__name__}->{BIN_SWAP[type(n.op)].__name__}", None))
            if isinstance(n.op, (ast.Add, ast.Sub)):
                out.append((n, "drop right term", None))
        elif isinstance(n, ast.AugAssign) and type(n.op) in (ast.Add, ast.Sub):
            out.append((n, f"augassign {type(n.op).__name__}->{BIN_SWAP[type(n.op)].__name__}", None))
        elif isinstance(n, ast.Constant) and type(n.value) in (int, float) and not isinstance(n.value, bool):
            if isinstance(n.value, float) and abs(n.value) >= 100:  # 1e9 +- 1 is no bug anyone makes: a unit slip is
                out.append((n, "const x10", None))
                out.append((n, "const /10", None))
            else:
                out.append((n, "const +1", None))
                if n.value != 0:
                    out.append((n, "const -1", None))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("min", "max"):
            out.append((n, f"call {n.func.id}->{'max' if n.func.id == 'min' else 'min'}", None))
        elif isinstance(n, ast.BoolOp):
            out.append((n, f"boolop {type(n.op).__name__}->{'Or' if isinstance(n.op, ast.And) else 'And'}", None))
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            out.append((n, "drop not", None))
    return out


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, new: ast.AST):
        self.target, self.new = target, new

    def visit(self, node):
        if node is self.target:
            return self.new
        return self.generic_visit(node)


def mutate(source: str, k: int) -> tuple[str, str, str, int]:
    """The source with site k mutated; (new source, mutation, original node's source, line)."""
    tree = ast.parse(source)
    node, kind, detail = sites(tree)[k]
    seg = ast.get_source_segment(source, node) or ast.unparse(node)
    line = getattr(node, "lineno", 0)
    new = copy.deepcopy(node)
    if kind.startswith("cmp"):
        new.ops[detail] = CMP_SWAP[type(node.ops[detail])]()
    elif kind.startswith("binop"):
        new.op = BIN_SWAP[type(node.op)]()
    elif kind == "drop right term":
        new = copy.deepcopy(node.left)
    elif kind.startswith("augassign"):
        new.op = BIN_SWAP[type(node.op)]()
    elif kind == "const +1":
        new.value = node.value + 1
    elif kind == "const -1":
        new.value = node.value - 1
    elif kind == "const x10":
        new.value = node.value * 10
    elif kind == "const /10":
        new.value = node.value / 10
    elif kind.startswith("call"):
        new.func.id = "max" if node.func.id == "min" else "min"
    elif kind.startswith("boolop"):
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "drop not":
        new = copy.deepcopy(node.operand)
    tree = ast.fix_missing_locations(_Replace(node, new).visit(tree))
    return ast.unparse(tree), kind, seg, line


def _pytest(work: Path, tests: list[str], deselect: list[str], timeout: float) -> tuple[str, float, str]:
    env = {**os.environ, "PYTHONPATH": str(work / "src"), "PYTHONDONTWRITEBYTECODE": "1",
           "INFERLAB_ALLOW_ACCEPTANCE_SKIP": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", "--no-header", "-rN",
           *tests, *[f"--deselect={d}" for d in deselect]]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    dt = time.perf_counter() - t0
    if r.returncode == 0:
        return "passed", dt, r.stdout
    if r.returncode == 5:  # nothing collected
        return "no-tests", dt, r.stdout
    return "failed", dt, r.stdout


def _failing(stdout: str) -> list[str]:
    return [ln.split()[1] for ln in stdout.splitlines() if ln.startswith(("FAILED ", "ERROR ")) and "::" in ln]


def _baseline(work: Path, tests: list[str]) -> tuple[float, list[str]]:
    """Seconds of the unmutated subset, and its failing tests (deselected for the mutants)."""
    deselect: list[str] = []
    for _ in range(5):
        env = {**os.environ, "PYTHONPATH": str(work / "src"), "PYTHONDONTWRITEBYTECODE": "1", "INFERLAB_ALLOW_ACCEPTANCE_SKIP": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "-rfE", *tests,
               *[f"--deselect={d}" for d in deselect]]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
        dt = time.perf_counter() - t0
        if r.returncode == 0:
            return dt, deselect
        bad = _failing(r.stdout)
        if not bad:
            raise SystemExit(f"the unmutated subset {tests} fails without naming a test:\n{r.stdout[-2000:]}")
        deselect += bad
    raise SystemExit(f"the unmutated subset {tests} keeps failing: {deselect}")


def _share(c: dict) -> float | None:
    denom = c["killed"] + c["timeout"] + c["survived"]
    return (c["killed"] + c["timeout"]) / denom if denom else None


def stale_equivalents() -> list[list[str]]:
    """EQUIVALENT keys whose line no longer starts any line of its module (the code moved on: the claim
    is about code that is gone, so the key should go)."""
    stale = []
    for key in EQUIVALENT:
        path = REPO / "src" / "inferlab" / key[0]
        lines = [ln.strip() for ln in path.read_text().splitlines()] if path.is_file() else []
        if not any(ln.startswith(key[1]) for ln in lines):
            stale.append(list(key))
    return stale


def merge(paths: list[str], out: str) -> dict:
    """One result from several runs' files (one run per target, e.g. the core and each engine's KV
    managers run apart): the mutants of every part, counted again per target and in total. A survivor
    that EQUIVALENT now explains (listed after its run) counts as equivalent, and one it no longer
    explains as a survivor; both are marked "reclassified_at_merge". Each part's command is kept."""
    parts, mutants, sites_of, source_of = [], [], {}, {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        for name, c in d["targets"].items():
            if name in source_of:
                raise SystemExit(f"target {name!r} is in both {source_of[name]} and {p}: merge one run per target")
            source_of[name], sites_of[name] = p, c.get("sites")
        parts.append({"file": os.path.relpath(p, REPO) if os.path.isabs(p) else p, "command": d.get("command"), "date": d.get("date"),
                      "seed": d.get("seed"), "per_target": d.get("per_target"), "per_kv_target": d.get("per_kv_target"),
                      "seconds": d.get("seconds"), "targets": list(d["targets"])})
        mutants += d["mutants"]
    per_target: dict[str, dict] = {name: {"killed": 0, "survived": 0, "equivalent": 0, "timeout": 0, "sites": sites_of[name], "mutants": 0,
                                          "from": source_of[name]} for name in source_of}
    for r in mutants:
        if r["status"] in ("survived", "equivalent"):
            why = equivalent_because(r["module"], r["source_line"], r["mutation"], r["node"])
            status = "equivalent" if why else "survived"
            if status != r["status"]:
                r["status"], r["reclassified_at_merge"] = status, True
            if why:
                r["equivalent_because"] = why
            else:
                r.pop("equivalent_because", None)
        c = per_target[r["target"]]
        c[r["status"]] += 1
        c["mutants"] += 1
    for c in per_target.values():
        c["killed_share"] = _share(c)
    total_killed = sum(c["killed"] + c["timeout"] for c in per_target.values())
    total = sum(c["killed"] + c["timeout"] + c["survived"] for c in per_target.values())
    summary = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(["benchmarks/mutation.py", *sys.argv[1:]]),
               "merged_from": parts, "killed": total_killed, "non_equivalent": total,
               "killed_share": total_killed / total if total else None,
               "shares": {name: c["killed_share"] for name, c in per_target.items()},
               "below_90_percent": [name for name, c in per_target.items() if c["killed_share"] is not None and c["killed_share"] < 0.9],
               "targets": per_target, "survivors": [r for r in mutants if r["status"] == "survived"],
               "equivalent": [r for r in mutants if r["status"] == "equivalent"], "stale_equivalent_keys": stale_equivalents(),
               "mutants": mutants}
    for name, c in per_target.items():
        share = f"{c['killed_share']:.0%}" if c["killed_share"] is not None else "-"
        print(f"[{name}] killed {c['killed'] + c['timeout']} of {c['killed'] + c['timeout'] + c['survived']} non-equivalent ({share}), "
              f"{c['equivalent']} equivalent  ({c['from']})")
    share = f"{summary['killed_share']:.1%}" if summary["killed_share"] is not None else "-"
    print(f"\nkilled {total_killed} of {total} non-equivalent mutants ({share}) over {len(per_target)} targets from {len(parts)} files")
    for r in summary["survivors"]:
        print(f"  SURVIVED {r['module']}:{r['line']} {r['mutation']}: {r['node'][:60]!r} in {r['source_line'][:100]!r}")
    for key in summary["stale_equivalent_keys"]:
        print(f"  STALE EQUIVALENT key (no such line in {key[0]} now): {key[1][:80]!r} {key[2]}")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    Path(out).write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    ap.add_argument("--per-target", type=int, default=25, help="mutants sampled per target")
    ap.add_argument("--per-kv-target", type=int, default=None, help="mutants per KV-manager target (default: --per-target)")
    ap.add_argument("--all", action="store_true", help="every site (slow)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout-factor", type=float, default=4.0)
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "mutation.json"))
    ap.add_argument("--keep", action="store_true", help="keep the /tmp/mut-* copy")
    ap.add_argument("--merge", nargs="+", metavar="RESULT.json", help="combine these runs' files (one run per target) into --json; runs nothing")
    args = ap.parse_args()
    if args.merge:
        merge(args.merge, args.json)
        return
    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in names if t not in TARGETS]
    if unknown:
        raise SystemExit(f"unknown target(s) {unknown}; known: {', '.join(TARGETS)}")

    work = Path(tempfile.mkdtemp(prefix="mut-", dir="/tmp"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    shutil.copytree(REPO / "src", work / "src", ignore=ignore)
    shutil.copytree(REPO / "tests", work / "tests", ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", work / "pyproject.toml")
    started = time.time()
    results, per_target = [], {}
    try:
        for name in names:
            modules, tests = TARGETS[name]
            modules = [m for m in modules if (work / "src" / "inferlab" / m).is_file()]
            base_s, deselect = _baseline(work, tests)
            timeout = max(60.0, args.timeout_factor * base_s)
            all_sites = []
            for m in modules:
                src = (work / "src" / "inferlab" / m).read_text()
                all_sites += [(m, k) for k in range(len(sites(ast.parse(src))))]
            n_want = args.per_kv_target if (args.per_kv_target is not None and name in KV_TARGETS) else args.per_target
            rng = random.Random(f"{args.seed}:{name}")  # per target: a target's sample does not depend on the others
            chosen = all_sites if args.all else rng.sample(all_sites, min(n_want, len(all_sites)))
            print(f"[{name}] {len(all_sites)} sites in {', '.join(modules)}; {len(chosen)} mutants; "
                  f"tests {' '.join(tests)} ({base_s:.1f} s unmutated, {len(deselect)} failing there deselected)", flush=True)
            counts = {"killed": 0, "survived": 0, "equivalent": 0, "timeout": 0, "sites": len(all_sites), "mutants": len(chosen)}
            for m, k in sorted(chosen):
                path = work / "src" / "inferlab" / m
                original = path.read_text()
                new, kind, seg, line = mutate(original, k)
                path.write_text(new)
                try:
                    outcome, dt, out = _pytest(work, tests, deselect, timeout)
                finally:
                    path.write_text(original)
                if outcome == "no-tests":
                    raise SystemExit(f"[{name}] no tests collected for {tests}")
                status = {"failed": "killed", "timeout": "timeout", "passed": "survived"}[outcome]
                src_line = original.splitlines()[line - 1].strip() if 0 < line <= len(original.splitlines()) else ""
                why = equivalent_because(m, src_line, kind, seg)
                if status == "survived" and why:
                    status = "equivalent"
                counts[status] += 1
                killer = _failing(out)[:1]
                rec = {"target": name, "module": m, "line": line, "mutation": kind, "node": seg[:200], "source_line": src_line[:200], "status": status,
                       "seconds": round(dt, 2), "killed_by": killer[0] if killer else None}
                if why:
                    rec["equivalent_because"] = why
                    if status != "equivalent":
                        rec["listed_equivalent_but_killed"] = True  # the equivalence claim is wrong: fix EQUIVALENT
                results.append(rec)
                mark = {"killed": ".", "timeout": "T", "survived": "S", "equivalent": "e"}[status]
                print(f"  {mark} {m}:{line} {kind}: {seg[:70]!r} ({dt:.1f} s)", flush=True)
            denom = counts["killed"] + counts["timeout"] + counts["survived"]
            counts["killed_share"] = (counts["killed"] + counts["timeout"]) / denom if denom else None
            per_target[name] = counts
            print(f"[{name}] killed {counts['killed'] + counts['timeout']} of {denom} non-equivalent mutants "
                  f"({counts['killed_share']:.0%}), {counts['equivalent']} equivalent", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    total_killed = sum(c["killed"] + c["timeout"] for c in per_target.values())
    total = sum(c["killed"] + c["timeout"] + c["survived"] for c in per_target.values())
    summary = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv), "seed": args.seed,
               "per_kv_target": args.per_kv_target,
               "per_target": args.per_target if not args.all else "all", "seconds": round(time.time() - started),
               "killed": total_killed, "non_equivalent": total, "killed_share": total_killed / total if total else None,
               "targets": per_target, "survivors": [r for r in results if r["status"] == "survived"],
               "equivalent": [r for r in results if r["status"] == "equivalent"], "mutants": results}
    print(f"\nkilled {total_killed} of {total} non-equivalent mutants ({summary['killed_share']:.1%}) in {summary['seconds']} s")
    for r in summary["survivors"]:
        print(f"  SURVIVED {r['module']}:{r['line']} {r['mutation']}: {r['node'][:60]!r} in {r['source_line'][:100]!r}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

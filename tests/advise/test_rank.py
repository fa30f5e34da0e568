"""Placement ranking for models that do not fit: never slower than --fit, every command parses, and
each ranked figure is re-computed from its own command line by place() and decode_step_time()."""

import re
import sys
from pathlib import Path

import pytest

from inferlab.advise.flags import parse_command
from inferlab.advise.rank import rank_placements
from inferlab.api.setup import configure
from inferlab.perf.placement import place
from inferlab.perf.speed import decode_step_time

sys.path.insert(0, str(Path(__file__).parent))
from _llama_help import help_flags, llama_server_help  # noqa: E402

CASES = [("llama-3.1-70b", "rtx4090", None),  # a dense 70B on 24 GB
         ("qwen2.5-32b", "rtx4060ti", None),  # a 32B on 16 GB
         ("qwen3-30b-a3b", "rtx4060ti", None),  # a MoE on 16 GB
         ("qwen3-30b-a3b", "rtx3090", "Q8_0"),  # the same MoE at 8 bits on 24 GB (its Q4_K_M fits there)
         ("gpt-oss-20b", "rtx4060", None)]  # a MoE on 8 GB


@pytest.mark.parametrize("model,machine,quant", CASES)
def test_best_ranked_is_at_least_the_fit_default_and_parses(model, machine, quant):
    s = configure(model, machine, quant=quant, n_ctx=8192, profile=False)
    L = s.spec.n_layers
    assert not place(s.spec, s.machine, s.scheme, 8192, "f16", L + 1).fits  # it really does not fit
    base, ranked, n = rank_placements(s, 8192, top=5)
    assert ranked and n > L
    assert ranked[0].tok_per_s >= base.tok_per_s
    assert [r.tok_per_s for r in ranked] == sorted((r.tok_per_s for r in ranked), reverse=True)
    help_text = llama_server_help()
    for r in (base, *ranked):
        for cmd in (r.command, r.ot_command):
            if cmd is None:
                continue
            flags = parse_command("llamacpp", cmd.text)
            if help_text is not None:
                shown = help_flags(help_text)
                assert all(w in shown for w in cmd.argv[1:] if w.startswith("-") and not re.fullmatch(r"-?\d+", w))
            if cmd is r.command and r.rank:
                # re-place the command as written and time it: the ranked figure must be what it says
                ngl, c = int(flags["-ngl"]), int(flags["-c"])
                kv = flags.get("-ctk", "f16")
                ncm = int(flags.get("-ncmoe", 0)) + (L if flags.get("-cmoe") else 0)
                p = place(s.spec, s.machine, s.scheme, c, kv, ngl, n_cpu_moe=ncm)
                assert p.fits
                assert decode_step_time(p, s.machine, c // 2, 1, s.speed)["tok_per_s"] == pytest.approx(r.tok_per_s)
    if s.spec.is_moe:
        assert ranked[0].n_cpu_moe > 0 and "--n-cpu-moe" in ranked[0].command.argv
        assert ranked[0].tok_per_s > base.tok_per_s  # experts to RAM beats dropping whole layers


def test_ot_pattern_selects_exactly_the_experts_of_the_first_blocks():
    s = configure("qwen3-30b-a3b", "rtx4060ti", n_ctx=8192, profile=False)
    _, ranked, _ = rank_placements(s, 8192, top=1)
    best = ranked[0]
    pattern = best.ot_command.argv[best.ot_command.argv.index("-ot") + 1]
    regex, _, buft = pattern.rpartition("=")
    assert buft == "CPU"
    # llama.cpp's expert tensor names (plain, fused gate_up, and the "chexps" variant its LLM_FFN_EXPS_REGEX also covers)
    names = [f"blk.{i}.ffn_{k}_{c}exps.weight" for i in range(s.spec.n_layers) for k in ("up", "down", "gate", "gate_up") for c in ("", "ch")]
    hit = {int(n.split(".")[1]) for n in names if re.search(regex, n)}
    assert hit == set(range(best.n_cpu_moe))  # llama.cpp matches -ot patterns with std::regex_search
    assert not re.search(regex, "blk.0.attn_q.weight") and not re.search(regex, f"blk.{best.n_cpu_moe}.ffn_up_exps.weight")
    assert not re.search(regex, "blk.0.ffn_up_shexp.weight")  # the shared expert stays with attention


def test_nothing_fits_is_explained_not_crashed():
    from inferlab.api.advise import advise

    r = advise("gpt-oss-120b", "rtx4090")  # 64 GB of RAM: its Q4_K_M does not fit anywhere
    assert not r.placements and r.engines == ()
    assert any("host memory" in n and "no placement" in n for n in r.notes)

"""Planned bytes against published GGUF sizes (independent truth: real files and llama.cpp's own table)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from inferlab.models.catalog import MODELS
from inferlab.quant.plan import effective_bpw, weight_bytes
from inferlab.quant.presets import Preset, presets, resolve_quant

# a copy of ../shared/reference/gguf_sizes_dev.json (published sizes with their sources)
SIZES = Path(__file__).with_name("data") / "gguf_sizes_dev.json"
MODEL_IDS = {
    "Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "Qwen2.5-7B-Instruct": "qwen2.5-7b",
    "Llama-2-7B (llama-bench size column)": "llama-2-7b",
}
GB, GiB = 1e9, 2**30


def _rows() -> list[dict]:
    if not SIZES.is_file():
        pytest.skip(f"{SIZES} not present")
    return json.loads(SIZES.read_text())


def _quant(row: dict) -> Preset:
    """The llama-quantize run a row's file came from: bartowski's files (and mradermacher's "-i1-"
    repositories) are made with an imatrix; a row noted "2023 rules" with the Q2_K mix of 2023."""
    q = resolve_quant("preset:" + row["quant"].upper())
    made_with_imatrix = row["uploader"] == "bartowski" or "-i1-GGUF" in row["source_url"] or ".i1-" in row["source_url"]
    if made_with_imatrix and q.imatrix is None and q.display_name is None:
        q = Preset(q.name, imatrix=True)
    if _is_2023_q2k(row):
        q = Preset(q.name, rules="2023")
    return q


def _metadata_bytes(rows: list[dict]) -> dict[str, int]:
    """File bytes beyond tensor data (header, tokenizer), measured on each model's exact-byte row."""
    out = {}
    for r in rows:
        if "size_bytes" in r:
            mid = MODEL_IDS[r["model"]]
            out[mid] = r["size_bytes"] - weight_bytes(MODELS[mid], _quant(r))["total"]
    return out


def _predicted_and_actual(r: dict, meta: dict[str, int]) -> tuple[float, float]:
    mid = MODEL_IDS[r["model"]]
    tensor_bytes = weight_bytes(MODELS[mid], _quant(r))["total"]
    if "size_bytes" in r:
        return tensor_bytes + meta[mid], r["size_bytes"]
    if r["size_unit"].startswith("GiB"):  # llama-bench's size column: tensor data only
        return tensor_bytes, r["size_listed"] * GiB
    return tensor_bytes + meta[mid], r["size_listed"] * GB


def _is_2023_q2k(r: dict) -> bool:
    return r["quant"] == "Q2_K" and "2023 rules" in r["notes"]


def test_exact_byte_rows_differ_only_by_a_few_mb_of_metadata():
    rows = _rows()
    meta = _metadata_bytes(rows)
    assert set(meta) == {"llama-3.1-8b", "qwen2.5-7b"}
    for mid, extra in meta.items():
        # GGUF header + tokenizer (128k-152k tokens and their merges): a few MB, never negative
        assert 1e6 < extra < 12e6, (mid, extra)


def test_every_published_size_within_half_a_percent():
    rows = _rows()
    meta = _metadata_bytes(rows)
    worst = 0.0
    for r in rows:
        pred, actual = _predicted_and_actual(r, meta)
        err = abs(pred - actual) / actual
        worst = max(worst, err)
        assert err < 0.005, f"{r['model']} {r['quant']} ({r['uploader']}): planned {pred / GB:.3f} GB, published {actual / GB:.3f} GB"
    assert len(rows) == 65
    assert worst > 0  # the comparison is real: rounding alone makes some rows differ


def test_llama2_q2k_of_2023_needs_the_2023_rules():
    """llama-bench's Llama-2-7B Q2_K (2.63 GiB) was made before llama.cpp moved Q2_K's ffn_gate/ffn_up
    from Q3_K to Q2_K; today's rules plan a file about 10% smaller."""
    rows = _rows()
    r = next(r for r in rows if _is_2023_q2k(r))
    m = MODELS["llama-2-7b"]
    published = r["size_listed"] * GiB
    assert abs(weight_bytes(m, Preset("Q2_K", rules="2023"))["total"] - published) / published < 0.005
    assert weight_bytes(m, Preset("Q2_K"))["total"] < 0.92 * published


def test_llama_quantize_help_table_for_llama3_8b():
    """quantize.cpp's QUANT_OPTIONS list GiB of tensor data for Llama-3-8B (3 significant figures)."""
    m = MODELS["llama-3-8b"]
    n = 0
    for p in presets().values():
        g = re.match(r"\s*([\d.]+)G, .*Llama-3-8B", p.help)
        if not g or p.name == "Q2_K_S":  # Q2_K_S's line repeats Q2_K's size (2.96G) while its mix is smaller
            continue
        planned = weight_bytes(m, Preset(p.name))["total"] / GiB
        assert planned == pytest.approx(float(g.group(1)), rel=0.005), p.name
        n += 1
    assert n == 14


def test_seed_table_prints_exactly():
    """The seed's bpw/GB table for Llama 3.1 8B, formatted as the seed formats it."""
    m = MODELS["llama-3.1-8b"]
    lines = [f"  {q:7s} {effective_bpw(m, q):5.2f} bpw  {weight_bytes(m, q)['total'] / GB:6.2f} GB"
             for q in ["F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K", "Q2_K"]]
    assert lines == [
        "  F16     16.00 bpw   16.06 GB",
        "  Q8_0     8.50 bpw    8.53 GB",
        "  Q6_K     6.56 bpw    6.59 GB",
        "  Q5_K_M   5.70 bpw    5.73 GB",
        "  Q4_K_M   4.89 bpw    4.91 GB",
        "  Q3_K     3.44 bpw    3.45 GB",
        "  Q2_K     2.63 bpw    2.64 GB",
    ]


def test_seed_names_agree_under_both_readings_where_the_seed_relies_on_it():
    """F16, Q8_0 and Q6_K plan the same file as a bare type and as a preset; Q2_K does not."""
    m = MODELS["llama-3.1-8b"]
    for q in ("F16", "Q8_0", "Q6_K"):
        assert weight_bytes(m, q) == weight_bytes(m, "preset:" + q)
    pure, mix = weight_bytes(m, "Q2_K")["total"], weight_bytes(m, "preset:Q2_K")["total"]
    assert mix > 1.15 * pure  # the preset keeps attn_v, ffn_down, attn_output and output in more bits
    assert round((mix + 7.8e6) / GB, 2) == 3.18  # + the file's metadata = bartowski's 3.18 GB listing

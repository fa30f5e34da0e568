"""`inferlab gguf-plan`: the GGUF that llama-quantize would write, before it exists.

Every tensor with its GGML type and bytes (from quant.plan, the one source of bytes), grouped so
a block's pattern reads at a glance: one row per tensor role, type and shape, with the layers
that get it written as ranges. ``--tensors`` lists every tensor; ``--quant all`` (or a comma
list) puts presets side by side.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import click

from .common import echo_json, safe

GB, GiB = 1e9, 2**30
# colour per bits-per-weight band: the eye finds the expensive tensors first
_TYPE_STYLES = ((20, "grey62"), (8.4, "green"), (6.5, "cyan"), (5.4, "blue"), (4.4, "yellow"), (3.4, "magenta"), (0, "red"))


def _style(type_name: str) -> str:
    from ..quant.types import ggml_type

    bpw = ggml_type(type_name).bits_per_weight
    return next(s for lo, s in _TYPE_STYLES if bpw >= lo)


def _fmt_bytes(n: float) -> str:
    if n >= GB:
        return f"{n / GB:,.2f} GB"
    if n >= 1e6:
        return f"{n / 1e6:,.1f} MB"
    if n >= 1e3:
        return f"{n / 1e3:,.1f} kB"
    return f"{int(n)} B"


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 3, 6, 9, 10] -> "0-3, 6, 9-10"."""
    out, start = [], None
    for i, x in enumerate(layers):
        if start is None:
            start = x
        if i + 1 == len(layers) or layers[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def _shape(shape: tuple[int, ...]) -> str:
    return " × ".join(str(d) for d in shape)


def _groups(plan) -> list[dict]:
    """Rows of the grouped table: global tensors alone, block tensors by (role, shape, type)."""
    rows: list[dict] = []
    by_key: dict[tuple, dict] = {}
    order: dict[str, int] = {}
    for e in plan:
        if e.layer is None:
            rows.append({"tensor": e.name, "shape": e.shape, "type": e.ggml_type, "layers": [], "count": 1,
                         "bytes": e.n_bytes, "n_elements": e.n_elements})
            continue
        role = e.name.split(".", 2)[2]  # blk.N.<role>
        order.setdefault(role, len(order))
        key = (role, e.shape, e.ggml_type)
        g = by_key.get(key)
        if g is None:
            g = by_key[key] = {"tensor": f"blk.*.{role}", "shape": e.shape, "type": e.ggml_type, "layers": [], "count": 0,
                               "bytes": 0, "n_elements": 0, "_role": role}
        g["layers"].append(e.layer)
        g["count"] += 1
        g["bytes"] += e.n_bytes
        g["n_elements"] += e.n_elements
    blocks = sorted(by_key.values(), key=lambda g: (order[g["_role"]], g["layers"][0]))
    globals_first = [r for r in rows if r["tensor"] == "token_embd.weight" or not r["tensor"].startswith("output")]
    globals_last = [r for r in rows if r not in globals_first]
    return globals_first + blocks + globals_last


def _summary(qp) -> dict:
    """A QuantPlan as the renderers read it (its fields, and its tensors under "_plan")."""
    from ..api.report import plain

    d = plain(qp)
    d.pop("tensors")
    return {**d, "_plan": [_Entry(t.name, t.shape, t.type, t.n_bytes, t.n_elements, t.layer) for t in qp.tensors]}


class _Entry(NamedTuple):
    name: str
    shape: tuple[int, ...]
    ggml_type: str
    n_bytes: int
    n_elements: int
    layer: int | None


@click.command("gguf-plan")
@click.argument("source")
@click.option("--quant", "quant", default=None,
              help="llama-quantize preset (Q4_K_M, Q8_0, IQ4_XS...), 'type:Q4_K' for one GGML type, a comma list to compare, "
                   "or 'all'. Default: a GGUF's own tensors, else Q4_K_M.")
@click.option("--tensors", "all_tensors", is_flag=True, help="List every tensor instead of grouping repeated layers.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every tensor with its type and bytes).")
def gguf_plan(source, quant, all_tensors, as_json):
    """The GGUF llama-quantize would write from SOURCE: every tensor, its type and bytes, totals and bits per weight.

    SOURCE: a catalog id, a .gguf file, a Hugging Face folder or config.json, or org/name in the local HF cache.
    """
    from ..api import plan
    from ..models.resolve import resolve_model

    spec = resolve_model(source)
    report = plan(spec, quant)
    if as_json:
        d = report.to_dict()
        if not (len(report.plans) == 1 or all_tensors):
            for q in d["plans"]:
                q.pop("tensors")
        if not report.failed:
            d.pop("failed")
        echo_json(d)
        return
    summaries = [_summary(q) for q in report.plans]
    failed = [(f.quant, f.error) for f in report.failed]
    own = None
    if report.file_total_bytes is not None:
        own = summaries[0] if quant is None else _summary(plan(spec, None).plans[0])
    from rich.console import Console

    console = Console()
    _header(console, spec, own)
    if len(summaries) == 1:
        _one(console, summaries[0], all_tensors, spec.n_layers)
    else:
        _side_by_side(console, spec, summaries, failed, own, per_role=len(summaries) <= 6 or all_tensors)


def _header(console, spec, own) -> None:
    facts = [f"[bold]{safe(spec.name)}[/]", safe(spec.arch), f"{spec.n_layers} layers", f"d_model {spec.d_model}",
             f"{spec.n_heads}/{spec.n_kv_heads} heads"]
    if spec.is_moe:
        facts.append(f"{spec.n_experts} experts ({spec.n_experts_used} used)")
    if spec.tied_embeddings:
        facts.append("tied embeddings")
    console.print(" · ".join(facts))
    x = spec.extra
    if own is not None:
        console.print(f"source file: {spec.file_type or 'mixed'} · {_fmt_bytes(own['total_bytes'])} of tensors · "
                      f"{own['bits_per_weight']:.2f} bits per weight")
        tok = f"tokenizer {x['n_vocab_tokens']:,} tokens ({x.get('tokenizer_model')})" if x.get("n_vocab_tokens") else "no tokenizer"
        facts = [f"trained context {spec.n_ctx_train:,}", "chat template ✓" if x.get("chat_template") else "no chat template", tok]
        if x.get("imatrix"):
            facts.append("imatrix ✓")
        if x.get("vision_bytes") or x.get("mmproj"):
            vb = x.get("vision_bytes") or x["mmproj"]["n_bytes"]
            facts.append(f"vision projector {_fmt_bytes(vb)} (not in the table)")
        console.print(" · ".join(facts))
    elif x.get("checkpoint_bytes"):
        q = (x.get("quantization") or {}).get("label")
        console.print(f"checkpoint: {_fmt_bytes(x['checkpoint_bytes'])} of safetensors" + (f" ({q})" if q else ""))


def _layers(layers: list[int], n_layers: int) -> str:
    return "" if not layers else f"all {n_layers}" if layers == list(range(n_layers)) else _ranges(layers)


def _one(console, s: dict, all_tensors: bool, n_layers: int) -> None:
    from rich import box
    from rich.table import Table

    total = s["total_bytes"]
    t = Table(title=s["label"], box=box.SIMPLE_HEAD, title_justify="left", show_footer=True, pad_edge=False)
    t.add_column("tensor", footer="total", no_wrap=True)
    t.add_column("shape (ne)", style="dim", no_wrap=True)
    t.add_column("type", footer=f"{s['bits_per_weight']:.2f} bpw")
    if not all_tensors:
        t.add_column("layers", overflow="fold", max_width=48)
        t.add_column("n", justify="right", footer=str(len(s["_plan"])))
    t.add_column("bytes", justify="right", footer=_fmt_bytes(total))
    t.add_column("share", justify="right", footer="100%")
    rows = (
        [{"tensor": e.name, "shape": e.shape, "type": e.ggml_type, "bytes": e.n_bytes} for e in s["_plan"]]
        if all_tensors else _groups(s["_plan"])
    )
    for r in rows:
        ty = f"[{_style(r['type'])}]{r['type']}[/]"
        share = f"{100 * r['bytes'] / total:.1f}%" if total else "-"
        cells = [r["tensor"], _shape(r["shape"]), ty]
        if not all_tensors:
            cells += [_layers(r["layers"], n_layers), str(r["count"])]
        t.add_row(*cells, _fmt_bytes(r["bytes"]), share)
    console.print(t)
    by_type = " · ".join(f"[{_style(k)}]{k}[/] {_fmt_bytes(v)}" for k, v in s["bytes_by_type"].items())
    console.print(f"  {_fmt_bytes(total)} ({total / GiB:.2f} GiB) of tensor data · {s['n_params']:,} weights · "
                  f"{s['bits_per_weight']:.3f} bits per weight")
    console.print(f"  by type: {by_type}")


def _side_by_side(console, spec, summaries, failed, own, per_role: bool) -> None:
    from rich import box
    from rich.table import Table

    t = Table(title="llama-quantize presets side by side", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    t.add_column("quant", no_wrap=True)
    t.add_column("GB", justify="right")
    t.add_column("GiB", justify="right")
    t.add_column("bpw", justify="right")
    if own is not None:
        t.add_column("vs file", justify="right")
    t.add_column("where the bytes go (by type)", overflow="fold")
    for s in summaries:
        total = s["total_bytes"]
        mix = " ".join(f"[{_style(k)}]{k}[/] {100 * v / total:.0f}%" for k, v in s["bytes_by_type"].items() if v / total >= 0.005)
        cells = [s["quant"] + ("*" if s["needs_imatrix"] else ""), f"{total / GB:,.3f}", f"{total / GiB:,.3f}", f"{s['bits_per_weight']:.2f}"]
        if own is not None:
            cells.append(f"{100 * (total / own['total_bytes'] - 1):+.0f}%")
        t.add_row(*cells, mix)
    console.print(t)
    if any(s["needs_imatrix"] for s in summaries):
        console.print("  * llama-quantize makes this preset only with an importance matrix (--imatrix)")
    for q, err in failed:
        console.print(f"  [red]{q}[/]: {err}")
    if per_role:
        _roles_table(console, summaries)


def _roles_table(console, summaries) -> None:
    """Per tensor role, the type each preset gives it (with layer counts where a preset mixes)."""
    from rich import box
    from rich.table import Table

    t = Table(title="type per tensor role", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    t.add_column("tensor", no_wrap=True)
    for s in summaries:
        t.add_column(s["quant"])
    roles: dict[str, list[dict[str, int]]] = {}
    for i, s in enumerate(summaries):
        for e in s["_plan"]:
            role = e.name if e.layer is None else "blk.*." + e.name.split(".", 2)[2]
            cols = roles.setdefault(role, [defaultdict(int) for _ in summaries])
            cols[i][e.ggml_type] += 1
    for role, cols in roles.items():
        cells = []
        for c in cols:
            parts = sorted(c.items(), key=lambda kv: -kv[1])
            cells.append(" ".join(f"[{_style(k)}]{k}[/]" + (f"×{n}" if len(parts) > 1 else "") for k, n in parts))
        t.add_row(role, *cells)
    console.print(t)

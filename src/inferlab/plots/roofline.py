"""Plot of a RooflineReport: each device's roof on log-log axes, the ridge point, and where the
weight matmuls, attention and whole decode/prefill steps sit."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

from . import new_figure, save

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_MARKERS = {("weights", "decode"): "v", ("weights", "prefill"): "^", ("attention", "decode"): "s", ("attention", "prefill"): "D",
            ("model", "decode"): "o", ("model", "prefill"): "P"}
_COLORS = {"decode": "#d62728", "prefill": "#1f77b4"}


def figure(report):
    r = report
    fig, axes = new_figure()
    ax = cast("Axes", axes)  # one row, one column: a single Axes
    xs = [p.intensity_flop_per_byte for p in r.points] + [x.ridge_flop_per_byte for x in r.roofs]
    lo, hi = max(min(xs) / 4, 1e-2), max(xs) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for x in r.roofs:
        style = "-" if x.device == r.device else ":"
        ax.plot(grid, [min(x.peak_flops, i * x.bandwidth_bytes_per_s) / 1e12 for i in grid], style, linewidth=2.2 if style == "-" else 1.2,
                label=f"{x.device}: {x.peak_flops / 1e12:.3g} TFLOP/s, {x.bandwidth_bytes_per_s / 1e9:.4g} GB/s")
    main = next(x for x in r.roofs if x.device == r.device)
    ax.axvline(main.ridge_flop_per_byte, color="gray", linestyle="--", linewidth=1,
               label=f"ridge point of {r.device}: {main.ridge_flop_per_byte:.1f} FLOP/byte (batch {r.ridge_batch:.0f} at {r.bits_per_weight:.2f} bpw)")
    seen = set()
    for p in r.points:
        key = (p.op, p.phase)
        label = None if key in seen else f"{p.phase} {p.op}" + (" (whole step)" if p.op == "model" else "")
        seen.add(key)
        ax.scatter(p.intensity_flop_per_byte, p.attainable_flops / 1e12, marker=_MARKERS.get(key, "o"), s=60, zorder=5,
                   color=_COLORS.get(p.phase, "k"), edgecolor="black", linewidth=0.5, label=label)
        tag = f"B{p.batch}" if p.op == "weights" else f"{p.context_tokens}"
        ax.annotate(tag, (p.intensity_flop_per_byte, p.attainable_flops / 1e12), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable throughput (TFLOP/s)")
    what = f"{r.model} ({r.quant}, KV {r.kv_type})" if r.model else f"weight matmuls at {r.bits_per_weight:.2f} bpw"
    ax.set_title(f"roofline of {r.machine}: {what}")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def save_roofline(report, path: str | os.PathLike):
    """Draw a RooflineReport and write it to ``path`` (.png or .svg)."""
    return save(figure(report), path)

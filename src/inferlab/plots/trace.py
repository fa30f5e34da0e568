"""Plots of a TraceReport: a timeline of the steps per device or link (load, prefill), and the
time per token per device with the decode curve per KV type (decode)."""

from __future__ import annotations

import os

from . import BOUND_COLORS, new_figure, save


def _timeline(ax, steps, title: str) -> None:
    rows: list[str] = []
    for st in steps:
        if st.where not in rows:
            rows.append(st.where)
    t = 0.0
    seen = set()
    for st in steps:
        y = rows.index(st.where)
        if st.s > 0:
            label = st.bound if st.bound not in seen else None
            seen.add(st.bound)
            ax.barh(y, st.s, left=t, height=0.6, color=BOUND_COLORS.get(st.bound, "#000000"), edgecolor="white", linewidth=0.5, label=label)
        t += st.s
    ax.set_yticks(range(len(rows)), [r if len(r) <= 28 else r[:27] + "…" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_ylabel("device or link")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    if seen:
        ax.legend(title="bound by", loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no time spent (nothing to read or copy)", transform=ax.transAxes, ha="center")
    ax.set_xlim(0, max(t, 1e-9) * 1.02)


def figure(report):
    """A matplotlib Figure of a TraceReport."""
    r = report
    head = f"{r.model} · {r.quant} on {r.machine} · -ngl {r.n_gpu_layers} · -c {r.n_ctx} · KV {r.kv_type}"
    if r.phase == "load":
        fig, (a, b) = new_figure(2, 1)
        _timeline(a, r.steps, f"load, first launch: {r.total_s or 0:.2f} s (weights from the drive)")
        _timeline(b, r.second_launch, f"second launch: {r.second_launch_s or 0:.2f} s (file in the OS page cache)")
    elif r.phase == "prefill":
        fig, a = new_figure()
        if r.steps:
            _timeline(a, r.steps, f"prefill of {r.n_tokens} tokens: {r.total_s:.3f} s, {r.tok_per_s:.0f} tok/s")
        else:
            _no_run(a, r)
    else:
        fig, (a, b) = new_figure(1, 2)
        if r.steps:
            _per_device(a, r)
            _curve(b, r)
        else:
            _no_run(a, r)
            b.set_axis_off()
    fig.suptitle(head, fontsize=10)
    fig.tight_layout()
    return fig


def _no_run(ax, r) -> None:
    ax.text(0.5, 0.5, f"does not fit: {r.reason}\nno {r.phase} (it would not run)", transform=ax.transAxes, ha="center", wrap=True)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("device")
    ax.set_title(f"{r.phase}: does not fit")


def _per_device(ax, r) -> None:
    """The lesson's "time per token": each device's share of one decode step, weights vs KV vs the
    fixed per-block cost, stacked (devices run one after another)."""
    devices: list[str] = []
    for st in r.steps:
        if st.where not in devices:
            devices.append(st.where)
    left = [0.0] * len(devices)
    for name, color, label in (("read weights", "#1f77b4", "weights"), ("read KV cache", "#ff7f0e", "KV cache"),
                               ("per-block cost", "#7f7f7f", "per-block cost")):
        ms = [sum(st.s for st in r.steps if st.where == d and st.name == name) * 1e3 for d in devices]
        ax.barh(range(len(devices)), ms, left=left, color=color, label=label, height=0.6)
        left = [a + b for a, b in zip(left, ms)]
    ax.set_yticks(range(len(devices)), devices)
    ax.invert_yaxis()
    ax.set_xlabel("time per decode step (ms)")
    ax.set_ylabel("device (layers run one after another)")
    ax.set_title(f"decode at {r.context_tokens} tokens, batch {r.batch}: {r.total_s * 1e3:.1f} ms, {r.tok_per_s:.1f} tok/s")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)


def _curve(ax, r) -> None:
    kinds: dict[str, list] = {}
    for c in r.curve:
        kinds.setdefault(c.kv_type, []).append(c)
    for kv, pts in kinds.items():
        ax.plot([p.context_tokens for p in pts], [p.tok_per_s for p in pts], marker="o", label=f"KV {kv} (-ngl {pts[0].n_gpu_layers})")
    ax.set_xlabel("context (cached tokens per sequence)")
    ax.set_ylabel("decode speed (tokens/s)")
    ax.set_title("decode slows as the context grows")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if kinds:
        ax.legend(fontsize=8)


def save_trace(report, path: str | os.PathLike):
    """Draw a TraceReport and write it to ``path`` (.png or .svg)."""
    return save(figure(report), path)

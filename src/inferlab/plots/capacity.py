"""Plots of a CapacityReport, as the case study draws them: KV growth against context for several
batch sizes with the memory line, the cache's share of GPU memory, and sessions per strategy."""

from __future__ import annotations

import os

from . import new_figure, save

GB = 1e9
BATCHES = (1, 8, 16, 32, 64, 80)


def figure(report):
    r = report
    fig, axes = new_figure(1, 3)
    ax1, ax2, ax3 = axes
    top = max(max(r.contexts) * 1.5, 4096)
    xs = [int(top * i / 60) or 1 for i in range(61)]
    per_tok = r.kv_per_token[0].bytes_per_token  # the first KV type asked for (the baseline)
    batches = sorted(set(BATCHES) | ({r.target_sessions} if r.target_sessions else set()))
    for b in batches:
        ax1.plot(xs, [b * per_tok * x / GB for x in xs], label=f"B={b}")
        ax2.plot(xs, [100 * b * per_tok * x / r.gpu_bytes for x in xs], label=f"B={b}")
    ax1.axhline(r.budget_bytes / GB, color="red", linestyle="--", label=f"memory left for KV ({r.budget_bytes / GB:.1f} GB)")
    ax1.set_ylim(0, max(r.budget_bytes / GB * 2.5, 1))
    ax1.set_xlabel("context length (tokens)")
    ax1.set_ylabel(f"KV cache ({r.kv_per_token[0].kv_type}) (GB)")
    ax1.set_title("KV cache growth vs context")
    ax1.legend(fontsize=7, loc="upper left")
    ax2.axhline(100 * r.budget_bytes / r.gpu_bytes, color="red", linestyle="--", label="available after weights")
    ax2.set_ylim(0, 150)
    ax2.set_xlabel("context length (tokens)")
    ax2.set_ylabel("KV cache (% of GPU memory)")
    ax2.set_title(f"share of {r.gpu_bytes / GB:.0f} GB")
    ax2.legend(fontsize=7, loc="upper left")
    for row in r.rows:
        ax3.plot([c.context_tokens for c in row.cells], [c.sessions for c in row.cells], marker="o", label=f"{row.strategy} (formula)")
        eng = [(c.context_tokens, c.engine_sessions) for c in row.cells if c.engine_sessions is not None]
        if eng:
            ax3.plot([e[0] for e in eng], [e[1] for e in eng], marker="x", linestyle=":", label=f"{row.strategy} ({r.engine})")
    if r.target_sessions:
        ax3.axhline(r.target_sessions, color="black", linestyle="--", label=f"target: {r.target_sessions} sessions")
    ax3.set_xlabel("context length (tokens)")
    ax3.set_ylabel("concurrent sessions that fit")
    ax3.set_title("sessions per strategy")
    ax3.legend(fontsize=6, loc="upper right")
    for a in axes:
        a.grid(True, alpha=0.3)
    fig.suptitle(f"{r.model} on {r.machine} ({r.engine}, weights {r.weights_bytes / GB:.1f} GB)")
    fig.tight_layout()
    return fig


def save_capacity(report, path: str | os.PathLike):
    """Draw a CapacityReport and write it to ``path`` (.png or .svg)."""
    return save(figure(report), path)

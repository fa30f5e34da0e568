"""Plots of inferlab's reports, one module per subject (trace, roofline, capacity ...).

matplotlib is imported inside the functions that draw (``pip install 'inferlab[plot]'``). Every
plot is a fixed size (``FIGSIZE_IN`` at ``DPI``: 1200 x 720 pixels as PNG, 864 x 518.4 pt as SVG),
with labelled axes, units and a legend. :func:`check_plot_path` validates a destination before any
computation; :func:`save` writes through a temporary file in the same folder and renames it
(``inferlab.fileio``), so a failed or interrupted write never leaves half a file under the name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError
from ..fileio import atomic_write, check_output_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")
FIGSIZE_IN = (12.0, 7.2)  # inches
DPI = 100  # PNG pixels per inch: 1200 x 720


def check_plot_path(path: str | os.PathLike, *, what: str = "plot file") -> Path:
    """The destination of a plot, checked before anything is computed (fileio.check_output_path):
    a .png or .svg name in a folder that exists and can be written, not a folder or a link."""
    return check_output_path(path, tuple("." + f for f in FORMATS), what=what)


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise MissingDependencyError("matplotlib", "plots", "plot") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def new_figure(nrows: int = 1, ncols: int = 1, **kw: Any) -> tuple[Figure, Any]:
    """A figure of the fixed size and its axes: one Axes for 1 x 1, else an array of them (plt.subplots)."""
    plt = pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=FIGSIZE_IN, dpi=DPI, **kw)
    return fig, axes


def save(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` (its extension picks PNG or SVG) atomically (fileio.atomic_write:
    a temporary file in the same folder, then a rename); the figure is closed either way."""
    p = check_plot_path(path)
    fmt = p.suffix.lower().lstrip(".")
    plt = pyplot()
    try:
        return atomic_write(p, lambda fh: fig.savefig(fh, format=fmt, dpi=DPI))  # fixed size: no bbox_inches="tight"
    finally:
        plt.close(fig)


def image_bytes(fig, fmt: str = "svg") -> bytes:
    """The figure as PNG or SVG bytes (for a web page), closed afterwards."""
    import io

    from ..errors import UnknownNameError

    if fmt not in FORMATS:
        raise UnknownNameError("plot format", fmt, FORMATS)
    plt = pyplot()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=DPI)
    finally:
        plt.close(fig)
    return buf.getvalue()


# the colours of the bounds, shared by every plot
BOUND_COLORS = {"memory": "#1f77b4", "compute": "#2ca02c", "link": "#d62728", "disk": "#9467bd", "cpu-kernels": "#ff7f0e",
                "overhead": "#7f7f7f", "none": "#c7c7c7"}

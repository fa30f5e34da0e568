"""inferlab.plots: every plot is a readable PNG or SVG of the fixed size, written atomically.

Readable: each panel has labelled axes with units and a legend (checked on the matplotlib figure);
the files are images of 1200 x 720 pixels (PNG header) or 864 x 518.4 pt (SVG), not blank."""

import re
import struct

import pytest

pytest.importorskip("matplotlib")

from inferlab.api.roofline import roofline  # noqa: E402
from inferlab.api.trace import trace  # noqa: E402
from inferlab.errors import InvalidValueError  # noqa: E402
from inferlab.plots import check_plot_path, save  # noqa: E402
from inferlab.plots import roofline as roofline_plot  # noqa: E402
from inferlab.plots import trace as trace_plot  # noqa: E402


def _reports():
    return {
        "load": (trace_plot, trace("load", "qwen2.5-32b", "rtx4060ti", n_ctx=8192)),
        "prefill": (trace_plot, trace("prefill", "qwen2.5-32b", "rtx4060ti", n_ctx=8192, n_tokens=2000)),
        "decode": (trace_plot, trace("decode", "qwen2.5-32b", "rtx4060ti", n_ctx=8192)),
        "roofline": (roofline_plot, roofline("a100-40gb", "llama-2-7b", quant="type:F16", n_ctx=4096)),
        "roofline-bare": (roofline_plot, roofline("rtx4090")),
    }


REPORTS = _reports()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_every_panel_has_labelled_axes_with_units_and_a_legend(name):
    mod, rep = REPORTS[name]
    fig = mod.figure(rep)
    axes = [a for a in fig.axes if a.axison]
    assert axes
    for a in axes:
        assert re.search(r"\(.+\)", a.get_xlabel()), a.get_xlabel()  # a unit in brackets
        assert a.get_ylabel()
        assert a.get_legend() is not None and a.get_legend().get_texts()
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_png_and_svg_files_of_the_expected_size(tmp_path, name):
    mod, rep = REPORTS[name]
    save_fn = mod.save_trace if mod is trace_plot else mod.save_roofline
    png, svg = tmp_path / f"{name}.png", tmp_path / f"{name}.svg"
    save_fn(rep, png)
    save_fn(rep, svg)
    data = png.read_bytes()
    assert _png_size(data) == (1200, 720)
    import matplotlib.image as mpimg

    px = mpimg.imread(str(png))
    assert px.shape[:2] == (720, 1200)
    ink = (px[..., :3].mean(axis=2) < 0.9).mean()  # share of non-white pixels
    assert ink > 0.02, ink
    text = svg.read_text()
    assert 'width="864pt"' in text and 'height="518.4pt"' in text
    assert text.count("<path") > 20
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([png.name, svg.name])  # no temporary left behind


def test_a_configuration_that_does_not_fit_plots_the_reason_not_a_speed(tmp_path):
    rep = trace("decode", "qwen2.5-32b", "rtx4060ti", n_ctx=8192, n_gpu_layers=99)
    fig = trace_plot.figure(rep)
    texts = " ".join(t.get_text() for a in fig.axes for t in a.texts)
    assert "does not fit" in texts and "tok/s" not in texts
    save(fig, tmp_path / "x.png")


@pytest.mark.parametrize("bad,needle", [("nope/x.png", "does not exist"), ("x.jpg", ".png or .svg"), ("x", ".png or .svg"), (".", ".png")])
def test_bad_plot_paths_are_refused_before_anything_is_drawn(tmp_path, bad, needle):
    with pytest.raises(InvalidValueError, match=re.escape(needle)):
        check_plot_path(tmp_path / bad if bad != "." else tmp_path)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "r.png"
    out.write_bytes(b"old")
    mod, rep = REPORTS["roofline-bare"]
    fig = mod.figure(rep)

    def boom(*a, **k):
        raise RuntimeError("disk full")

    fig.savefig = boom
    with pytest.raises(RuntimeError):
        save(fig, out)
    assert out.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["r.png"]

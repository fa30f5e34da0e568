"""Class 3: no hang, no unbounded read. Generated cases: every kind of file that is not a regular
file (FIFO, character device, a symlink to either, a folder) under each trace suffix; a trace
whose single line never ends (a text file of zeros). Each must end within seconds with one line."""

from __future__ import annotations

import os

import pytest

from _robust_cli import assert_bad_input, run_cli

KINDS = ["fifo", "dev-zero", "dev-urandom", "link-to-fifo", "link-to-null"]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_trace_that_is_not_a_regular_file(tmp_path, kind, suffix):
    trace = tmp_path / f"trace{suffix}"
    if kind == "fifo":
        os.mkfifo(trace)  # a read would wait forever for a writer
    elif kind.startswith("dev-"):
        os.symlink(f"/dev/{kind[4:]}", trace)  # never ends
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "f")
        os.symlink(tmp_path / "f", trace)
    else:
        os.symlink("/dev/null", trace)
    assert_bad_input(run_cli("simulate", "--trace", trace, "--capacity-tokens", "384", timeout=20), "not a regular file")


def test_a_line_that_never_ends_is_cut_at_a_bound(tmp_path):
    trace = tmp_path / "t.jsonl"
    with trace.open("wb") as f:  # 40 MB, no newline: a reader holding it whole would need it all
        f.truncate(40 << 20)
    assert_bad_input(run_cli("simulate", "--trace", trace, "--capacity-tokens", "384"), "t.jsonl:1", "longer than")


def test_the_library_refuses_the_same_without_blocking(tmp_path):
    from inferlab.errors import InvalidValueError
    from inferlab.kv.traces import load_azure, load_mooncake

    os.mkfifo(tmp_path / "f.jsonl")
    for loader in (load_mooncake, load_azure):
        for p in (tmp_path / "f.jsonl", "/dev/zero", tmp_path):
            with pytest.raises(InvalidValueError, match="regular file|folder"):
                loader(p)

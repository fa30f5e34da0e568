"""Suite-wide: test helper modules importable, acceptance tests that may not skip, and a run summary
that lists every skip and expected failure with its reason.

Acceptance tests: those marked ``@pytest.mark.acceptance`` and every test in ACCEPTANCE_FILES (the
checks against independent truth: llama.cpp's tokenizer files, the real traces, the seed lesson's
printed figures, held-out and hand-derived speed figures). A skip of one is turned into a failure
("an acceptance test never skips quietly"), unless it is also marked ``gpu`` (it needs a CUDA device,
which a CPU runner lacks) or INFERLAB_ALLOW_ACCEPTANCE_SKIP=1 is set (then it is listed loudly).
INFERLAB_SKIP_SUMMARY=path also writes the summary as JSON."""

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

# test helper modules (tests/_paths.py) importable from every test file
sys.path.insert(0, str(Path(__file__).resolve().parent))

ACCEPTANCE_FILES = (
    "tests/runtime/test_vocab_files.py",
    "tests/kv/test_workloads_traces.py",
    "tests/perf/test_seed_lesson.py",
    "tests/perf/test_heldout.py",
    "tests/perf/test_batched_decode.py",
    "tests/perf/test_boundaries.py",
)
ALLOW_ENV = "INFERLAB_ALLOW_ACCEPTANCE_SKIP"


def pytest_configure(config):
    config.addinivalue_line("markers", "acceptance: a check against independent truth: a skip fails the run "
                                       f"(unless it is also marked gpu, or {ALLOW_ENV}=1)")


def _rel(path) -> str:
    try:
        return Path(path).resolve().relative_to(Path(__file__).resolve().parents[1]).as_posix()
    except ValueError:
        return str(path)


def _is_acceptance(item) -> bool:
    return item.get_closest_marker("acceptance") is not None or _rel(item.path) in ACCEPTANCE_FILES


def _reason(rep) -> str:
    if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:
        return str(rep.longrepr[2]).removeprefix("Skipped: ")
    return str(getattr(rep, "wasxfail", "") or rep.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if (rep.skipped and not hasattr(rep, "wasxfail") and _is_acceptance(item)
            and item.get_closest_marker("gpu") is None and os.environ.get(ALLOW_ENV) != "1"):
        rep.outcome = "failed"
        rep.longrepr = (f"acceptance test skipped: {_reason(rep)}\n"
                        f"(an acceptance test may not skip; set {ALLOW_ENV}=1 to let it, it is then listed in the summary)")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    # a whole acceptance file skipped at import (a missing package): a failure too
    if rep.skipped and _rel(getattr(collector, "path", "")) in ACCEPTANCE_FILES and os.environ.get(ALLOW_ENV) != "1":
        rep.outcome = "failed"
        rep.longrepr = f"acceptance file skipped at collection: {_reason(rep)}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    groups = {"skipped": stats.get("skipped", []), "xfailed": stats.get("xfailed", []), "xpassed": stats.get("xpassed", [])}
    if not any(groups.values()):
        return
    by_reason = defaultdict(list)
    for kind, reps in groups.items():
        for rep in reps:
            by_reason[(kind, _reason(rep))].append(rep.nodeid or _rel(getattr(rep, "fspath", "")))
    n = {k: len(v) for k, v in groups.items()}
    terminalreporter.section(f"every skip and expected failure with its reason: {n['skipped']} skipped, "
                             f"{n['xfailed']} xfailed, {n['xpassed']} xpassed", sep="=")
    for (kind, reason), ids in sorted(by_reason.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
        terminalreporter.write_line(f"{kind.upper()} x{len(ids)}: {reason}")
        for nodeid in sorted(ids):
            terminalreporter.write_line(f"    {nodeid}")
    path = os.environ.get("INFERLAB_SKIP_SUMMARY")
    if path:
        Path(path).write_text(json.dumps([{"kind": k, "reason": r, "tests": sorted(ids)} for (k, r), ids in by_reason.items()], indent=1))

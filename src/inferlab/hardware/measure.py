"""Measuring on a shared machine: repeated timings that stop when they agree, the interference
around them (other processes' CPU use, steal time), DRAM read bandwidth, and real-time priority.

calibrate builds its figures from these; detect uses the quick bandwidth read when no profile is
saved. numpy is imported inside the functions that use it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InvalidValueError, MissingDependencyError, check_positive

STABLE_TOL = 0.05  # the two fastest repetitions of a figure agree within 5 %
BUSY_CPUS = 0.5  # other processes may use this many CPUs beyond those a measurement leaves free (RT throttling leaves them ~0.1)
STEAL_MAX = 0.05  # share of CPU time the hypervisor may give to other guests


@dataclass(frozen=True)
class Measurement:
    """Repeated timings of one figure, in ``unit``; spread = (max - min) / median."""

    what: str
    unit: str
    samples: tuple[float, ...]
    detail: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    interference: "Interference | None" = None  # what else ran while it was measured
    extra: dict | None = None  # facts a fit needs besides the samples (bytes per token, layers...)

    @property
    def spread(self) -> float:
        return (max(self.samples) - min(self.samples)) / self.median if self.median else 0.0

    @property
    def best(self) -> float:
        """The capability figure: the fastest repetition (a machine cannot run faster than it can;
        other work only ever slows a repetition down, so the median of a disturbed run is low)."""
        return max(self.samples)

    @property
    def best_two_gap(self) -> float:
        """(best - second best) / best: 0 when the two fastest repetitions agree."""
        top = sorted(self.samples, reverse=True)
        return (top[0] - top[1]) / top[0] if len(top) > 1 and top[0] else 1.0

    def stable(self, tol: float = STABLE_TOL) -> bool:
        """The two fastest repetitions agree within ``tol`` (a sustained rate, not one lucky run)."""
        return len(self.samples) >= 2 and self.best_two_gap <= tol

    def to_json(self) -> dict:
        out = {"best": self.best, "median": self.median, "min": min(self.samples), "max": max(self.samples), "spread": self.spread,
               "best_two_gap": self.best_two_gap, "samples": list(self.samples), "unit": self.unit, "detail": self.detail}
        if self.interference is not None:
            out["interference"] = self.interference.to_json()
        if self.extra:
            out["extra"] = dict(self.extra)
        return out


# ---------------------------------------------------------------- interference: what else ran meanwhile



def _cpu_jiffies() -> tuple[float, float, float] | None:
    """(busy, steal, total) jiffies of all CPUs since boot, from /proc/stat (Linux), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            f = [float(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(f) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = f[:8]
    return user + nice + system + irq + softirq, steal, sum(f[:8])


@dataclass(frozen=True)
class Interference:
    """What else used this machine while a figure was measured.

    others_cpus: CPUs' worth of time used by other processes (all busy time less this process's);
    free_cpus: CPUs the measurement left free (the machine's less the threads it ran);
    steal_share: share of time the hypervisor ran other guests on these CPUs;
    load_avg: the 1-minute load average at the start."""

    others_cpus: float | None
    free_cpus: float
    steal_share: float | None
    load_avg: float | None
    n_cpus: int

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if self.others_cpus is not None and self.others_cpus > self.free_cpus + BUSY_CPUS:
            out.append(f"other processes used {self.others_cpus:.1f} of {self.n_cpus} CPUs while it ran "
                       f"({self.free_cpus:.0f} left free): the machine is busy")
        if self.steal_share is not None and self.steal_share > STEAL_MAX:
            out.append(f"the hypervisor stole {self.steal_share:.0%} of the CPU time (other guests on this host)")
        return tuple(out)

    def to_json(self) -> dict:
        return {"others_cpus": self.others_cpus, "free_cpus": self.free_cpus, "steal_share": self.steal_share,
                "load_avg": self.load_avg, "n_cpus": self.n_cpus, "problems": list(self.problems)}


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class watch:  # noqa: N801 (a context manager used as a function)
    """``with watch(threads) as w: ...`` then ``w.result``: the Interference over the block."""

    def __init__(self, threads: int):
        self.threads = threads
        self.result: Interference | None = None

    def __enter__(self) -> "watch":
        self.n = usable_cpus()
        try:
            self.load = os.getloadavg()[0]
        except (OSError, AttributeError):
            self.load = None
        self.j0, self.own0, self.t0 = _cpu_jiffies(), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        j1, own1, t1 = _cpu_jiffies(), time.process_time(), time.perf_counter()
        others = steal = None
        wall = max(t1 - self.t0, 1e-9)
        if self.j0 and j1 and wall > 0.05:
            hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # jiffies per CPU-second (USER_HZ)
            busy = (j1[0] - self.j0[0]) / hz  # CPU-seconds busy, all processes
            others = max(0.0, busy - (own1 - self.own0)) / wall  # CPUs' worth used by the others
            steal = (j1[1] - self.j0[1]) / max(j1[2] - self.j0[2], 1.0)
        self.result = Interference(others, max(0, self.n - self.threads), steal, self.load, self.n)


def repeat_until_stable(one: Callable[[], float], *, at_least: int = 3, at_most: int = 12, tol: float = STABLE_TOL) -> list[float]:
    """Samples of ``one()`` (a rate: higher is better), at least ``at_least`` and until the two
    fastest agree within ``tol`` or ``at_most`` were taken."""
    samples = [one() for _ in range(at_least)]
    while len(samples) < at_most and not Measurement("", "", tuple(samples)).stable(tol):
        samples.append(one())
    return samples


def _numpy():
    try:
        import numpy as np
    except ImportError:
        raise MissingDependencyError("numpy", "measuring memory bandwidth", extra="files") from None
    return np


def default_working_set_bytes(llc_bytes: int | None = None) -> int:
    """Total bytes read per pass: 4x the last-level cache, at least 256 MiB, at most 1/8 of free RAM."""
    want = max(4 * (llc_bytes or 32 * 2**20), 256 * 2**20)
    try:
        import psutil

        want = min(want, psutil.virtual_memory().available // 8)
    except ImportError:
        pass
    return int(want)


def _timed_parallel(threads: int, work: Callable[[int], object], repeats: int, amount: float = 1.0) -> list[float]:
    """Rates (``amount`` over the wall time) of running work(i) for i in range(threads) at once,
    after one warm-up round: at least ``repeats`` rounds, more until the two fastest agree
    (repeat_until_stable)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(work, range(threads)))  # warm-up: pages touched, threads started

        def one() -> float:
            t0 = time.perf_counter()
            list(pool.map(work, range(threads)))
            return amount / (time.perf_counter() - t0)

        return repeat_until_stable(one, at_least=repeats, at_most=max(3 * repeats, 6))


def read_bandwidth_gbs(threads: int, total_bytes: int | None = None, repeats: int = 5, clock: str = "wall") -> Measurement:
    """DRAM read bandwidth, GB/s (10^9 B/s): ``threads`` threads each take the maximum of their own
    slice of one float64 array of ``total_bytes`` (numpy's reduction runs in C without the GIL;
    a max is one vector instruction per 32 bytes, so memory, not arithmetic, bounds it: a sum,
    with its pairwise additions, reads about 15 % slower with two threads here).

    clock "wall": bytes over the wall time of the whole pass (what calibrate records).
    clock "cpu": each slice's bytes over the CPU time of the thread that read it, summed; the
    same figure on an idle machine, and not dragged down by other processes on a busy one
    (there it errs high: threads that did not overlap each had the memory bus alone).
    """
    check_positive("threads", threads)
    if clock not in ("wall", "cpu"):
        raise InvalidValueError(f"clock {clock!r} is not one of wall, cpu")
    np = _numpy()
    total_bytes = total_bytes or default_working_set_bytes()
    data = np.ones(total_bytes // 8, dtype=np.float64)
    parts = np.array_split(data, threads)
    if clock == "wall":
        with watch(threads) as w:
            samples = tuple(_timed_parallel(threads, lambda i: np.maximum.reduce(parts[i]), repeats, data.nbytes / 1e9))
        return Measurement(f"read bandwidth, {threads} thread(s)", "GB/s", samples, interference=w.result,
                           detail=f"np.maximum.reduce over {threads} slice(s) of a {data.nbytes / 2**20:.0f} MiB float64 array, wall clock")
    else:
        def timed(i: int) -> float:
            c0 = time.thread_time()
            np.maximum.reduce(parts[i])
            return parts[i].nbytes / max(time.thread_time() - c0, 1e-9)

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(timed, range(threads)))  # warm-up
            samples = tuple(sum(pool.map(timed, range(threads))) / 1e9 for _ in range(repeats))
    return Measurement(f"read bandwidth, {threads} thread(s)", "GB/s", samples,
                       detail=f"np.maximum.reduce over {threads} slice(s) of a {data.nbytes / 2**20:.0f} MiB float64 array, {clock} clock")


@contextlib.contextmanager
def realtime(enabled: bool = True):
    """Run the block at real-time priority (SCHED_FIFO 10; the threads llama.cpp starts inherit
    it), so that other processes on a shared machine stay off the cores while it is timed; yields
    '' or why it could not (not root, not Linux). The old policy comes back afterwards."""
    if not enabled:
        yield "not asked for"
        return

    def tasks() -> list[int]:  # every thread of this process (an OpenMP pool started earlier too)
        try:
            return [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            return [0]

    try:
        old = {t: (os.sched_getscheduler(t), os.sched_getparam(t)) for t in tasks()}
        for t in old:
            os.sched_setscheduler(t, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, OSError) as exc:
        yield f"real-time priority not available ({exc})"
        return
    try:
        yield ""
    finally:
        for t in tasks():
            policy, param = old.get(t, (os.SCHED_OTHER, os.sched_param(0)))
            try:
                os.sched_setscheduler(t, policy, param)
            except OSError:
                pass  # the thread ended meanwhile

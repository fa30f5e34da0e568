"""Measure this machine: memory read and copy bandwidth, matmul throughput; save a profile.

Pure Python cannot stream memory fast enough to measure it, so the kernels are numpy's (and
torch's for bf16/int8 matmul and the GPU): each runs in C with the GIL released, one slice of
one array per thread. Working sets are several times the last-level cache so that DRAM, not
cache, is measured. Every figure is the median of several repetitions with its min, max and
spread. numpy and torch are imported inside the functions that use them.

The profile is a JSON file in the user's config directory ($XDG_CONFIG_HOME/inferlab or
~/.config/inferlab); ``detect`` (``--on local``) uses its figures instead of guesses.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

from ..errors import FileFormatError, InvalidValueError, MissingDependencyError, check_positive

PROFILE_VERSION = 1
PROFILE_NAME = "machine_profile.json"


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

    @property
    def spread(self) -> float:
        return (max(self.samples) - min(self.samples)) / self.median if self.median else 0.0

    def to_json(self) -> dict:
        return {"median": self.median, "min": min(self.samples), "max": max(self.samples), "spread": self.spread,
                "samples": list(self.samples), "unit": self.unit, "detail": self.detail}


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


def _timed_parallel(threads: int, work: Callable[[int], object], repeats: int) -> list[float]:
    """Wall time of running work(i) for i in range(threads) at once, after one warm-up round."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(work, range(threads)))  # warm-up: pages touched, threads started
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(work, range(threads)))
            times.append(time.perf_counter() - t0)
    return times


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
        times = _timed_parallel(threads, lambda i: np.maximum.reduce(parts[i]), repeats)
        samples = tuple(data.nbytes / t / 1e9 for t in times)
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


def copy_bandwidth_gbs(threads: int, total_bytes: int | None = None, repeats: int = 5) -> Measurement:
    """Copy bandwidth, GB/s, counted as STREAM does: bytes read + bytes written (2 x size)."""
    check_positive("threads", threads)
    np = _numpy()
    total_bytes = total_bytes or default_working_set_bytes()
    src = np.ones(total_bytes // 16, dtype=np.float64)  # src + dst = total_bytes
    dst = np.zeros_like(src)
    s_parts, d_parts = np.array_split(src, threads), np.array_split(dst, threads)
    times = _timed_parallel(threads, lambda i: np.copyto(d_parts[i], s_parts[i]), repeats)
    return Measurement(f"copy bandwidth, {threads} thread(s)", "GB/s", tuple(2 * src.nbytes / t / 1e9 for t in times),
                       detail=f"np.copyto of {src.nbytes / 2**20:.0f} MiB in {threads} slice(s); read + write counted")


def matmul_tflops(dtype: str, n: int | None = None, threads: int | None = None, repeats: int = 5,
                  target_s: float = 0.15) -> Measurement:
    """Dense square matmul throughput, TFLOP/s (2 n^3 FLOP per product).

    dtype "fp32" uses numpy (its BLAS); "bf16" and "int8" use torch on the CPU
    (torch.matmul in bfloat16; torch._int_mm, int8 x int8 -> int32). Without ``n`` the size is
    chosen so one product takes about ``target_s`` (slow paths, such as bf16 emulated on AVX2,
    get small matrices and the run stays short). Raises MissingDependencyError or
    NotSupportedError when this build cannot do it.
    """
    from ..errors import NotSupportedError

    if dtype == "fp32":
        np = _numpy()
        rng = np.random.default_rng(0)

        def make(k: int) -> tuple[Callable[[], object], str]:
            a = rng.standard_normal((k, k), dtype=np.float32)
            b = rng.standard_normal((k, k), dtype=np.float32)
            return (lambda: a @ b), f"numpy {k}x{k} float32 @"
    elif dtype in ("bf16", "int8"):
        try:
            import torch
        except ImportError:
            raise MissingDependencyError("torch", f"measuring {dtype} matmul", extra="runtime") from None
        if threads:
            torch.set_num_threads(threads)
        if dtype == "int8" and not hasattr(torch, "_int_mm"):
            raise NotSupportedError("this torch has no int8 matmul (torch._int_mm)")

        def make(k: int) -> tuple[Callable[[], object], str]:
            if dtype == "bf16":
                a, b = torch.randn(k, k, dtype=torch.bfloat16), torch.randn(k, k, dtype=torch.bfloat16)
                return (lambda: torch.matmul(a, b)), f"torch {k}x{k} bfloat16 matmul ({torch.get_num_threads()} threads)"
            a = torch.randint(-128, 127, (k, k), dtype=torch.int8)
            b = torch.randint(-128, 127, (k, k), dtype=torch.int8)
            return (lambda: torch._int_mm(a, b)), f"torch._int_mm {k}x{k} int8 -> int32 ({torch.get_num_threads()} threads)"
    else:
        raise InvalidValueError(f"matmul dtype {dtype!r} is not one of fp32, bf16, int8")
    if n is None:  # size the problem: time a 256 product, scale n by the cube root of the time ratio
        probe, _ = make(256)
        try:
            probe()
        except RuntimeError as exc:
            raise NotSupportedError(f"{dtype} matmul is not available on this CPU build: {exc}") from None
        t0 = time.perf_counter()
        probe()
        t = max(time.perf_counter() - t0, 1e-6)
        n = int(min(4096, max(128, 256 * (target_s / t) ** (1 / 3))) // 64 * 64)
    run, how = make(n)
    try:
        run()  # warm-up
    except RuntimeError as exc:
        raise NotSupportedError(f"{dtype} matmul is not available on this CPU build: {exc}") from None
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    flop = 2.0 * n**3  # one multiply and one add per inner-product term
    return Measurement(f"{dtype} matmul", "TFLOP/s", tuple(flop / t / 1e12 for t in times), detail=how)


def gpu_measurements(repeats: int = 5) -> Iterator[tuple[str, Measurement]]:
    """On a CUDA (or ROCm) GPU through torch: device-to-device copy bandwidth and fp16 matmul."""
    import torch

    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        src = torch.empty(2**30 // 2, dtype=torch.float16, device=dev)
        dst = torch.empty_like(src)

        def timed(fn: Callable[[], object]) -> list[float]:
            fn()
            torch.cuda.synchronize(dev)
            out = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize(dev)
                out.append(time.perf_counter() - t0)
            return out

        times = timed(lambda: dst.copy_(src))
        yield f"gpu{i}.copy_bandwidth_gbs", Measurement("GPU copy bandwidth", "GB/s", tuple(2 * src.nbytes / t / 1e9 for t in times),
                                                        detail=f"{torch.cuda.get_device_name(i)}: 1 GiB device-to-device copy")
        n = 8192
        a = torch.randn(n, n, dtype=torch.float16, device=dev)
        b = torch.randn(n, n, dtype=torch.float16, device=dev)
        times = timed(lambda: a @ b)
        yield f"gpu{i}.fp16_matmul_tflops", Measurement("GPU fp16 matmul", "TFLOP/s", tuple(2.0 * n**3 / t / 1e12 for t in times),
                                                        detail=f"{torch.cuda.get_device_name(i)}: {n}x{n} fp16 matmul")
        del src, dst, a, b


@dataclass(frozen=True)
class Step:
    """One step of a calibration run, for the progress bar."""

    key: str  # where the figure goes in the profile, dotted
    label: str
    run: Callable[[], Measurement]


def plan(threads: tuple[int, ...] | None = None, total_bytes: int | None = None, repeats: int = 5,
         matmul_n: int | None = None) -> list[Step]:
    """The CPU steps of a calibration run (GPU steps come from gpu_measurements)."""
    from .probes.cpu import probe_cpu, usable_cpus

    cpu, _ = probe_cpu()
    n = usable_cpus() or 1
    if threads is None:
        threads = tuple(sorted({1, *(t for t in (2, 4, 8, 16, 32, 64) if t <= n), n}))
    total = total_bytes or default_working_set_bytes(cpu.l3_bytes if cpu else None)
    steps = [Step(f"cpu.read_bandwidth_gbs.{t}", f"read bandwidth, {t} thread(s)",
                  (lambda t=t: read_bandwidth_gbs(t, total, repeats))) for t in threads]
    steps.append(Step(f"cpu.copy_bandwidth_gbs.{n}", f"copy bandwidth, {n} thread(s)", lambda: copy_bandwidth_gbs(n, total, repeats)))
    for dt in ("fp32", "bf16", "int8"):
        steps.append(Step(f"cpu.matmul_tflops.{dt}", f"{dt} matmul", (lambda dt=dt: matmul_tflops(dt, matmul_n, n, repeats))))
    return steps


def run_calibration(steps: list[Step], on_step: Callable[[Step, Measurement | None, str], None] | None = None,
                    gpu: bool = True) -> dict:
    """Run the steps, return the profile dict (not yet saved). A step that cannot run (no torch,
    no int8 kernels) is recorded under "skipped" with the reason instead of failing the run."""
    from ..errors import InferlabError
    from .probes.cpu import probe_cpu

    cpu, _ = probe_cpu()
    profile: dict = {"version": PROFILE_VERSION, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "host": {"cpu": cpu.model if cpu else "unknown", "logical_cores": cpu.logical_cores if cpu else None,
                              "physical_cores": cpu.physical_cores if cpu else None,
                              "features": list(cpu.features) if cpu else []},
                     "cpu": {}, "gpu": {}, "skipped": {}}
    t_start = time.perf_counter()
    for step in steps:
        try:
            m = step.run()
        except (InferlabError, ImportError, RuntimeError, MemoryError) as exc:
            profile["skipped"][step.key] = str(exc)
            if on_step:
                on_step(step, None, str(exc))
            continue
        _put(profile, step.key, m.to_json())
        if on_step:
            on_step(step, m, "")
    if gpu:
        try:
            import torch

            has_gpu = torch.cuda.is_available()
            why = "" if has_gpu else "torch sees no CUDA/ROCm device"
        except ImportError:
            has_gpu, why = False, "torch is not installed"
        if has_gpu:
            for key, m in gpu_measurements():
                _put(profile, "gpu." + key, m.to_json())
        else:
            profile["skipped"]["gpu"] = why
    profile["duration_s"] = time.perf_counter() - t_start
    return profile


def _put(profile: dict, dotted: str, value: dict) -> None:
    node = profile
    *path, last = dotted.split(".")
    for p in path:
        node = node.setdefault(p, {})
    node[last] = value


def config_dir() -> str:
    """$XDG_CONFIG_HOME/inferlab, else ~/.config/inferlab."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "inferlab")


def profile_path() -> str:
    return os.path.join(config_dir(), PROFILE_NAME)


def save_profile(profile: dict, path: str | None = None) -> str:
    path = path or profile_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(profile, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def load_profile(path: str | None = None) -> dict | None:
    """The saved profile, or None when there is none. A corrupt file raises FileFormatError."""
    path = path or profile_path()
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise FileFormatError(f"machine profile {path} cannot be read ({exc}); run `inferlab calibrate` again") from None
    if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
        raise FileFormatError(f"machine profile {path} is not a version-{PROFILE_VERSION} profile; run `inferlab calibrate` again")
    return data


__all__ = ["Measurement", "Step", "copy_bandwidth_gbs", "load_profile", "matmul_tflops", "plan",
           "profile_path", "read_bandwidth_gbs", "run_calibration", "save_profile"]

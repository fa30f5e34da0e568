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

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

from ..errors import InferlabError, InvalidValueError, MissingDependencyError, check_positive
from .measure import (BUSY_CPUS, STABLE_TOL, STEAL_MAX, Interference, Measurement, _numpy, _timed_parallel,  # noqa: F401 (calibrate's API)
                      default_working_set_bytes, read_bandwidth_gbs, realtime, repeat_until_stable, usable_cpus, watch)
from .profile import (PROFILE_NAME, PROFILE_VERSION, config_dir, load_profile, profile_id, profile_path,  # noqa: F401
                      rejected_profile_path, save_profile)



def copy_bandwidth_gbs(threads: int, total_bytes: int | None = None, repeats: int = 5) -> Measurement:
    """Copy bandwidth, GB/s, counted as STREAM does: bytes read + bytes written (2 x size)."""
    check_positive("threads", threads)
    np = _numpy()
    total_bytes = total_bytes or default_working_set_bytes()
    src = np.ones(total_bytes // 16, dtype=np.float64)  # src + dst = total_bytes
    dst = np.zeros_like(src)
    s_parts, d_parts = np.array_split(src, threads), np.array_split(dst, threads)
    with watch(threads) as w:
        samples = _timed_parallel(threads, lambda i: np.copyto(d_parts[i], s_parts[i]), repeats, 2 * src.nbytes / 1e9)
    return Measurement(f"copy bandwidth, {threads} thread(s)", "GB/s", tuple(samples), interference=w.result,
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
            int_mm = torch._int_mm  # pyright: ignore[reportPrivateImportUsage]  (defined, checked above, not in torch's exported names)
            return (lambda: int_mm(a, b)), f"torch._int_mm {k}x{k} int8 -> int32 ({torch.get_num_threads()} threads)"
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
    flop = 2.0 * n**3  # one multiply and one add per inner-product term

    def one() -> float:
        t0 = time.perf_counter()
        run()
        return flop / (time.perf_counter() - t0) / 1e12

    with watch(threads or usable_cpus()) as w:
        samples = repeat_until_stable(one, at_least=repeats, at_most=max(3 * repeats, 6))
    return Measurement(f"{dtype} matmul", "TFLOP/s", tuple(samples), detail=how, interference=w.result)


def gpu_measurements(repeats: int = 5) -> Iterator[tuple[str, Measurement]]:
    """On a CUDA (or ROCm) GPU through torch: device-to-device copy bandwidth and fp16 matmul."""
    import torch

    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        src = torch.empty(2**30 // 2, dtype=torch.float16, device=dev)
        dst = torch.empty_like(src)

        def timed(fn: Callable[[], object], dev=dev) -> list[float]:
            fn()
            torch.cuda.synchronize(dev)
            out = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize(dev)
                out.append(time.perf_counter() - t0)
            return out

        times = timed(lambda d=dst, s_=src: d.copy_(s_))
        yield f"gpu{i}.copy_bandwidth_gbs", Measurement("GPU copy bandwidth", "GB/s", tuple(2 * src.nbytes / t / 1e9 for t in times),
                                                        detail=f"{torch.cuda.get_device_name(i)}: 1 GiB device-to-device copy")
        n = 8192
        a = torch.randn(n, n, dtype=torch.float16, device=dev)
        b = torch.randn(n, n, dtype=torch.float16, device=dev)
        times = timed(lambda x=a, y=b: x @ y)
        yield f"gpu{i}.fp16_matmul_tflops", Measurement("GPU fp16 matmul", "TFLOP/s", tuple(2.0 * n**3 / t / 1e12 for t in times),
                                                        detail=f"{torch.cuda.get_device_name(i)}: {n}x{n} fp16 matmul")
        del src, dst, a, b


@dataclass(frozen=True)
class Step:
    """One step of a calibration run, for the progress bar."""

    key: str  # where the figure goes in the profile, dotted
    label: str
    run: Callable[[], Measurement]
    again: bool = False  # a figure timed again after the planned steps (run_calibration's retime), beyond the plan's count


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


class UnstableMeasurementError(InferlabError):
    """calibrate measured figures it will not save: unstable across repetitions, or taken while
    other processes were using the machine."""

    def __init__(self, problems: list[str], kept: str | None = None):
        self.problems = list(problems)
        self.kept = kept  # where the refused figures were written (rejected_profile_path), or None
        more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
        keep = (f"; its figures are kept in {kept}: `inferlab calibrate --accept-rejected` saves them as the profile, flagged"
                if kept else "")
        super().__init__(f"profile not saved: {'; '.join(problems[:2])}{more}{keep}. Run it again on a quiet machine "
                         "(or with --realtime as root), or save it flagged with --accept-noisy")


# ---------------------------------------------------------------- llama.cpp's own kernels on this CPU

# The ggml types calibrate times and the preset that makes each toy: llama.cpp's quantizer
# (llama_model_quantize --pure) for most; IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S and IQ3_XXS need an
# importance matrix, which llama-cpp-python cannot pass, so their toys get random blocks of the
# type written directly (validate.write_random_blocks: "raw:" presets).
LLAMA_CPP_TYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1",
                   "Q8_0": "Q8_0", "Q2_K": "Q2_K", "Q3_K": "Q3_K_S", "Q4_K": "Q4_K_S", "Q5_K": "Q5_K_S", "Q6_K": "Q6_K",
                   "IQ3_S": "IQ3_S", "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "TQ1_0": "TQ1_0", "TQ2_0": "TQ2_0", "MXFP4": "MXFP4_MOE",
                   **{t: f"raw:{t}" for t in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS")}}
# the types of the common presets (Q4_K_M, Q8_0, Q4_0/Q4_1 files), with Q5_0: llama.cpp's quantizer writes
# a Q4_K_M file's Q4_K rows as Q5_0 where a row is not a multiple of 256 wide (SmolLM2's 576: half
# its bytes), and Q5_0's stand-in of then (Q6_K) missed its prefill by +80 % on an AMX Xeon, 2026-12-03
# (its stand-in now, Q8_0's tinyBLAS share, still +15 %: an upper bound); these are timed on toy-stream too
COMMON_PRESET_TYPES = ("F16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
# `--types quick`: those, and one member of each kernel family whose rate the others do not predict:
# IQ2_XXS for the IQ grid types (from Q4_K's rate they were timed +134 ... +260 % fast on the Xeon,
# +447 ... +760 % on a Zen 4 VM whose Q4_K runs at twice Q4_1's bytes a second), Q3_K (from Q4_K: +140 %
# on that Zen 4) and IQ4_XS (+113 %), the main types of the Q3_K_M and IQ4_XS presets. Each type left
# out on both CPUs' full profiles (benchmarks/stand_in_errors.py), the worst decode stand-in from the
# quick types goes from +566 % to +59 % (TQ1_0), the median from 112 % to 13 % (Zen 4), 35 % to 19 % (Xeon)
QUICK_TYPES = (*COMMON_PRESET_TYPES, "Q3_K", "IQ4_XS", "IQ2_XXS")
# the types timed past the cache (validate.STREAM_MODEL) and within it (validate.CACHE_MODEL), so each
# gets a DRAM stall of its own (fit_decode): those of the common presets, and the main types of the
# IQ4_XS and Q5_K_M presets. On an Intel Xeon guest (2 threads, 2026-12-06) the one stall of the
# ladder's Q4_K priced toy-stream Q4_0 +37 %, Q8_0 +14 %, Q5_0 +10 % fast, and validate's IQ4_XS rows
# at the machine's state +19 ... +35 % fast; with a stall for each of those, toy-290m Q5_K_M (186 MB,
# past the cache, Q5_K on the shared stall) was the one row past the cache left outside 15 % (+16.8 %)
STALL_TYPES = (*COMMON_PRESET_TYPES, "IQ4_XS", "Q5_K")


def _bench_measurement(path: str, threads: int, what: str, n_prompt: int, n_gen: int, repeats: int, rt: bool,
                       extra: dict | None = None, probe: str | None = None, levels: dict | None = None) -> Measurement:
    """tg (tokens/s; 1 thread: per CPU-second of the computing thread) or pp of one model, the
    llama-bench method, repeated until the two fastest repetitions agree. ``probe``: the level
    probe (validate.level_probe) timed around every repetition, its speeds kept in extra["probe"],
    and the repetitions run until two of those whose probe reached validate.FAST_LEVEL of its
    fastest run so far agree (``levels``: those fastest runs by thread count and test, shared by
    the steps of one calibration; a fresh dict when not given)."""
    from .validate import FAST_LEVEL, llama_bench

    samples: list[float] = []
    around: list[float] = []
    key = (threads, what)
    levels = {} if levels is None else levels
    with watch(threads) as w:
        while len(samples) < max(3 * repeats, 6):
            with realtime(rt):
                r = llama_bench(path, threads, n_prompt if what == "pp" else 0, n_gen if what == "tg" else 0, repeats, probe=probe)
            samples += list(r.samples(what))
            around += list(r.probe_samples(what))
            judged = samples
            if probe:
                levels[key] = max([levels.get(key, 0.0), *around])  # the probe's fastest so far in this calibration
                fast = [a for a, b in zip(samples, around) if b >= FAST_LEVEL * levels[key]]
                judged = fast if len(fast) >= LEVEL_MIN_REPETITIONS else []  # the repetitions that ran at the machine's level
            if Measurement("", "", tuple(judged)).stable():
                break
            repeats = 2
    clock = "the computing thread's CPU time" if what == "tg" and threads == 1 else "wall clock"
    extra = dict(extra or {})
    if probe:
        extra["probe"] = around
        extra["probe_model"] = os.path.basename(probe)
    return Measurement(f"llama.cpp {what}", "tok/s", tuple(samples), interference=w.result, extra=extra,
                       detail=f"{os.path.basename(path)}, {threads} thread(s), {what}{n_prompt if what == 'pp' else n_gen}, {clock}"
                              + (", each repetition between two runs of the level probe" if probe else ""))


# The cache ladder and validate's state probes are timed this many more times, at the start and the
# end of the plan (their first timing is mid-plan, at KNEE_TYPE's turn), so their figures are medians
# over the calibration's spells and not one spell's: validate carries each state probe's speed to its
# calibrate figure (machine_state), and one figure off by 2 % moves the state of every row. On the
# Xeon guest (2026-12-06, 14:31 UTC) toy-wide-24 ran 62-65 tok/s in one spell at calibrate and 65-74
# an hour later in validate, the state put the DRAM stall at 0.6-0.95x, and the rows past the cache
# came out +6 ... +17 % fast (their prediction at calibrate's state: -7 ... +6 %); re-solved with its
# figure at 66, 68 or 70 tok/s instead of 64.5, 62, 61 or 60 of 66 decode figures were within 15 % at
# state instead of 57. A calibration with them (16:11 UTC, 2599 s, toy-wide-24's figure 66.1 from 59-68
# across its spells), then validate --state: decode at state 32 of 33 within 15 % (mean +1.9 %)
SPREAD_TIMINGS = 2


def llama_cpp_plan(types: tuple[str, ...] = tuple(LLAMA_CPP_TYPES), shapes: tuple[str, ...] | None = None,
                   threads: tuple[int, ...] | None = None, n_gen: int = 64, n_prompt: int = 128, repeats: int = 3,
                   rt: bool = False, directory: str | None = None, rounds: int = 1, probe: bool = True,
                   spread: int = SPREAD_TIMINGS) -> list[Step]:
    """Steps that time llama.cpp on pure-type toy models: tg at 1 thread and at every core, pp at
    every core, on validate.FIT_MODELS (two shapes, so the per-layer cost is not confounded with
    the bytes), and tg of STALL_TYPES on toy-stream too (a third size, ~5x the L3 cache at 4.5 bits
    a weight: the DRAM stall is told apart from the kernels' rates) and on every core on toy-mini
    (all of its bytes in the cache: each type's own stall is told apart from its rate). The toys
    are written and quantized on first use (validate.toy_model's cache).

    ``probe``: every repetition is timed between two runs of the level probe (validate.level_probe,
    toy-wide Q4_K), and a figure is the median of its repetitions whose probe ran at the machine's
    level (llama_cpp_reference): a shared VM's speed moves by a fifth within seconds (toy-thin Q4_K
    decode 296-441 tok/s in one minute, 2026-12-01), and figures taken at different levels do not
    fit one model of the machine.
    ``rounds``: every figure is timed that many times, one pass over all the steps after another
    (same keys: run_calibration keeps the repetitions of every round).
    ``spread``: the cache ladder's runs and validate's state probes among the plan's figures are timed
    that many more times (2 repetitions at least each time), the first before every other step and the
    last after them (SPREAD_TIMINGS)."""
    from ..errors import UnknownNameError
    from .validate import FIT_MODELS, _llama_cpp, physical_cores

    _llama_cpp()  # MissingDependencyError now, not after the bandwidth steps
    for ty in types:
        if ty not in LLAMA_CPP_TYPES:
            raise UnknownNameError("ggml type calibrate can measure with llama.cpp", ty, LLAMA_CPP_TYPES)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InvalidValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if isinstance(spread, bool) or not isinstance(spread, int) or spread < 0:
        raise InvalidValueError(f"spread must be an integer >= 0, got {spread!r}")
    shapes = shapes or FIT_MODELS
    n = physical_cores()
    threads = threads or tuple(sorted({1, n}))
    steps = []
    levels: dict = {}  # the probe's fastest run so far, shared by the steps
    for rnd in range(1, rounds + 1):
        steps += _llama_cpp_round(types, shapes, threads, n_gen, n_prompt, repeats if rnd == 1 else 2, rt, directory,
                                  f" (round {rnd}/{rounds})" if rounds > 1 else "", probe, levels)
    if not spread:
        return steps
    from .validate import KNEE_MODELS, KNEE_TYPE, STATE_PROBES

    t = max(threads)
    keep = {f"llama_cpp.runs.{m}.{ty}.{t}.tg" for m, ty in (*((m, KNEE_TYPE) for m in KNEE_MODELS), *STATE_PROBES)}
    keep &= {s.key for s in steps}  # a state probe of a type not timed here (--types) is not added
    again = [[s for s in _llama_cpp_round(tuple(sorted({ty for _, ty in STATE_PROBES} | {KNEE_TYPE})), shapes, threads, n_gen,
                                          n_prompt, 2, rt, directory, f" (spread {i}/{spread})", probe, levels) if s.key in keep]
             for i in range(1, spread + 1)]
    return again[0] + steps + [s for a in again[1:] for s in a]  # the first before the plan, the rest after it


def _matrices_extra(path: str) -> list[list]:
    """[type, bytes, rows] of the matrices a decode step of the GGUF multiplies, summed by (type, rows)."""
    from ..models.gguf_reader import model_from_gguf
    from ..perf.cpu_model import decode_matrices

    agg: dict[tuple[str, int], int] = {}
    for ty, b, rows in decode_matrices(model_from_gguf(path).tensors):
        agg[(ty, rows)] = agg.get((ty, rows), 0) + b
    return [[ty, b, rows] for (ty, rows), b in sorted(agg.items())]


def _llama_cpp_round(types, shapes, threads, n_gen, n_prompt, repeats, rt, directory, said, probe=True, levels=None) -> list[Step]:
    from ..quant.types import ggml_type
    from .validate import CACHE_MODEL, KNEE_MODELS, KNEE_TYPE, STREAM_MODEL, STREAM_TYPES, TOY_MODELS, decode_bytes_by_type, level_probe, toy_model

    steps = []
    stalled = tuple(t for t in types if t in STALL_TYPES)
    # one type on every shape, then the next: a shared VM's speed moves within minutes, and a type's
    # rate is fitted on its runs of both shapes (and toy-stream), so they are timed back to back
    # (by shape first, toy-thin Q4_0 / toy-wide Q4_0 prefill came out 0.82 at calibrate and 1.03
    # four minutes later, 2026-12-01)
    # the cache ladder (validate.KNEE_MODELS) with KNEE_TYPE's runs, on every core: where decode's
    # weights stop fitting the cache (fit_cache_ramp)
    # toy-mini: the in-cache run of the types with a stall of their own (KNEE_TYPE's is the ladder's toy-wide-2)
    for ty in (*types, *(t for t in (*STREAM_TYPES, KNEE_TYPE) if t not in types)):
        on = [*(m for m in shapes if ty in types), *((STREAM_MODEL,) if ty in STREAM_TYPES + stalled else ()),
              *((CACHE_MODEL,) if ty in stalled and ty != KNEE_TYPE else ())]
        ladder = [m for m in KNEE_MODELS if m not in on] if ty == KNEE_TYPE else []
        for model in (*on, *ladder):
            cfg = TOY_MODELS[model]
            block = ggml_type(ty).block_size
            if cfg.n_embd % block or cfg.n_ff % block or (cfg.n_head_kv * cfg.head_dim) % block:
                continue  # llama.cpp would fall back to another type for some rows
            bandwidth_run = model == STREAM_MODEL and ty in STREAM_TYPES
            for t in (threads if not bandwidth_run and model not in ladder and model != CACHE_MODEL else (max(threads),)):
                for what in (("tg", "pp") if t == max(threads) and n_prompt and model in shapes and model not in ladder else ("tg",)):
                    def run(model=model, ty=ty, t=t, what=what, cfg=cfg) -> Measurement:
                        path = toy_model(model, LLAMA_CPP_TYPES[ty], pure=True, directory=directory)
                        # 2 FLOP per block weight per prompt token; the output head for the last token only
                        block = cfg.n_layer * cfg.n_embd * (2 * cfg.n_embd + 2 * cfg.n_head_kv * cfg.head_dim + 3 * cfg.n_ff)
                        extra = {"n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "bytes_by_type": decode_bytes_by_type(path), "n_prompt": n_prompt,
                                 "matrices": _matrices_extra(path),
                                 "prefill_flops_per_token": 2.0 * (block + cfg.n_vocab * cfg.n_embd / max(n_prompt, 1))}
                        return _bench_measurement(path, t, what, n_prompt, n_gen, repeats, rt, extra,
                                                  probe=level_probe(directory) if probe else None, levels=levels)
                    steps.append(Step(f"llama_cpp.runs.{model}.{ty}.{t}.{what}", f"llama.cpp {model} {ty} {what} {t} thread(s){said}", run))
    return steps


def least_squares(rows: list[tuple[list[float], float]]) -> list[float]:
    """Least squares x for A x = b (normal equations, Gauss-Jordan; a handful of unknowns)."""
    n = len(rows[0][0])
    ata = [[sum(r[0][i] * r[0][j] for r in rows) for j in range(n)] for i in range(n)]
    atb = [sum(r[0][i] * r[1] for r in rows) for i in range(n)]
    m = [ata[i] + [atb[i]] for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c and m[c][c]:
                f = m[r][c] / m[c][c]
                m[r] = [a - f * b for a, b in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] if m[i][i] else 0.0 for i in range(n)]


KNEE_MIN_STALL_SHARE = 0.15  # a cache ramp is told apart when its stall is this share of the ladder's largest step or more
KNEE_MIN_PAST = 2  # ... and this many of the ladder's sizes lie at or past its end (the flat tail where every byte is DRAM's)


def fit_cache_ramp(ladder: list[dict], overhead_s_per_layer: float | None = None) -> dict | None:
    """The size at which decode's weights stop fitting this machine's last-level cache, from the
    cache ladder (validate.KNEE_MODELS: one type at one width, more and more layers): over a grid
    of ramps (lo < hi, see cpu_model.dram_share), least squares on relative error of

        seconds per token = n_layer x overhead + bytes / rate + dram_share(bytes; lo, hi) x bytes x stall

    and the ramp with the smallest squared residual. ``ladder``: dicts with n_layer, bytes (the
    step's weight bytes), s_per_token. ``overhead_s_per_layer``: held at that value, not fitted.
    None when no step up is seen (the stall under KNEE_MIN_STALL_SHARE of the largest run's step,
    every run past the cache already, or fewer than KNEE_MIN_PAST sizes at or past the ramp's end:
    then the rates alone carry it). Returns
    {"ramp_bytes": [lo, hi], "stall_s_per_byte", "max_rel_residual", "ladder_bytes": [smallest, largest]}."""
    runs = sorted(ladder, key=lambda r: r["bytes"])
    if len(runs) < 4:
        return None
    from ..perf.cpu_model import dram_share

    sizes = [r["bytes"] for r in runs]
    lo_b, hi_b = sizes[0], sizes[-1]
    grid = [lo_b + (hi_b - lo_b) * i / 60 for i in range(61)]
    best = None
    for i, lo in enumerate(grid[:-1]):
        for hi in grid[i + 1:]:
            rows = [([r["n_layer"] / r["s_per_token"], r["bytes"] / r["s_per_token"],
                      dram_share(r["bytes"], (lo, hi)) * r["bytes"] / r["s_per_token"]], 1.0) for r in runs]
            if overhead_s_per_layer is None:
                x = least_squares(rows)
            else:
                x = [overhead_s_per_layer] + least_squares([(row[1:], b - row[0] * overhead_s_per_layer) for row, b in rows])
            if x[2] <= 0 or x[1] <= 0 or x[0] < 0:
                continue
            sq = sum((sum(a * b for a, b in zip(row, x)) - 1) ** 2 for row, _ in rows)
            if best is None or sq < best[0]:
                best = (sq, lo, hi, x, rows)
    if best is None:
        return None
    _, lo, hi, x, rows = best
    if x[2] * hi_b < KNEE_MIN_STALL_SHARE * runs[-1]["s_per_token"] or lo <= lo_b:
        return None  # no step up within the ladder, or past the cache from its first size
    if sum(b >= hi for b in sizes) < KNEE_MIN_PAST:
        # no flat tail past it: a decline over the whole ladder, not a cache's edge. A Zen 5 guest (32 MiB
        # L3, every size past it, 2026-12-07) decoded 44 GB/s at 35 MB down to 32 GB/s at 224 MB, and in a
        # quiet calibration that fitted as a ramp of 70-224 MB (5.7 ps a byte): held-out decode on it
        # 23 of 33 within 15 % vs probe, +8.7 % on the mean; refit with no ramp, 33 of 33
        return None
    return {"ramp_bytes": [lo, hi], "stall_s_per_byte": x[2], "overhead_s_per_layer": x[0], "rate_bytes_per_s": 1 / x[1],
            "max_rel_residual": max(abs(sum(a * b for a, b in zip(row, x)) - 1) for row, _ in rows), "ladder_bytes": [lo_b, hi_b]}


# How far the cache ramp's start moves for a step of more layers than the ladder's toy of its bytes
# (fit_ramp_shift, cpu_model.ramp_bytes_for): the grid of shifts tried, bytes a layer. On the Xeon guest
# (2026-12-07) the ladder (toy-wide's width, 2-24 layers) fitted a ramp of 48-86 MB, yet deep steps of
# the same bytes left the cache sooner: pure Q4_K toys of 51-64 MB at calibrate's state took 0.85-0.92
# of their predicted seconds with 3-4 layers and 1.05-1.13 with 12-24 (toy-thin, 24 layers, fitted
# +12 ... +21 % fast on the ramp; held-out toy-125m rows +8 ... +16 % fast over 18 validate runs). The
# shift fitted on each calibration's own toy-thin and toy-wide runs came out 0.25-0.5 MB (0 in one of
# 8), and held out (each calibration refit and scored on every validate run of the day, decode at
# state: benchmarks/cross_scores.py) 2136 -> 2160 of 2376 rows within 15 %; with a ninth calibration
# made with it (0.125 MB) and its two runs, 2685 -> 2714 of 2970, better on 6 calibrations, worse on
# 1 (-2 rows); the Zen 4 and Zen 5 files, with no ramp, unchanged (benchmarks/results/
# xeon_ramp_shift_2026-12-08.json). Part of a deep step's stall the decode fit already gives the cost
# of a chunk started in DRAM (toy-thin starts more chunks a byte than the ladder)
RAMP_SHIFT_GRID_BYTES = tuple(i * 0.125e6 for i in range(25))  # 0 ... 3 MB a layer


def fit_ramp_shift(runs: list[dict], ladder: list[dict], ramp_bytes: list[float], fit: dict) -> dict:
    """The shift of the cache ramp's start per layer beyond the ladder's toy at a run's bytes
    (cpu_model.ramp_bytes_for), from ``runs`` (calibrate's decode runs of the fit models at the
    ladder's thread count: n_layer, bytes_by_type, optionally split_bytes_by_type, chunks, type,
    s_per_token) priced by ``fit`` (fit_decode's entry at that thread count, fitted on the ladder's
    ramp as it is): over RAMP_SHIFT_GRID_BYTES, the shift with the least squared log residual of
    the runs the largest shift puts on the ramp (the smallest shift on a tie; 0 with none of them):

        seconds per token = n_layer x overhead + split_bytes / rate
                            + dram_share(bytes; lo - shift x (n_layer - ladder's layers at bytes), hi) x (bytes x stall + chunks x chunk_s)

    Returns {"shift_bytes_per_layer", "runs": ["model type", ...], "rms_log_residual": {"0": at no
    shift, "fitted": at the shift}}."""
    import math

    from ..perf.cpu_model import dram_share, ladder_layers_at, shifted_ramp_start

    lo, hi = ramp_bytes
    points = [[r["bytes"], r["n_layer"]] for r in ladder]
    on_ramp = []
    for r in runs:
        weights = {k: b for k, b in (r.get("split_bytes_by_type") or r["bytes_by_type"]).items() if k != "F32"}
        total = _weight_bytes(r["bytes_by_type"])
        if not weights or set(r["bytes_by_type"]) <= {"F32"} or any(k not in fit["rate_bytes_per_s"] for k in weights):
            continue
        extra = r["n_layer"] - ladder_layers_at(points, total)  # layers beyond the ladder's toy of its bytes
        if not lo - RAMP_SHIFT_GRID_BYTES[-1] * max(extra, 0.0) < total < hi:
            continue
        base = r["n_layer"] * fit["overhead_s_per_layer"] + sum(b / fit["rate_bytes_per_s"][k] for k, b in weights.items())
        stall = (fit.get("dram_stall_s_per_byte_by_type") or {}).get(r.get("type"), fit["dram_stall_s_per_byte"])  # its type's own, else the shared
        per_share = total * stall + r.get("chunks", 0.0) * fit.get("dram_chunk_s", 0.0)  # seconds once every byte is DRAM's
        on_ramp.append((f"{r['model']} {r['type']}", total, extra, base, per_share, r["s_per_token"]))

    def rms(shift: float) -> float:
        sq = [math.log((base + dram_share(total, (shifted_ramp_start(lo, hi, shift, extra), hi)) * per_share) / s) ** 2
              for _, total, extra, base, per_share, s in on_ramp]
        return math.sqrt(sum(sq) / len(sq)) if sq else 0.0

    best = min(RAMP_SHIFT_GRID_BYTES, key=lambda b: (round(rms(b), 12), b)) if on_ramp else 0.0
    return {"shift_bytes_per_layer": best, "runs": [name for name, *_ in on_ramp], "rms_log_residual": {"0": rms(0.0), "fitted": rms(best)}}


# The weight in the decode fit of a run of a type with its own DRAM stall whose bytes lie partly past
# the cache (0 < dram_bytes < its bytes: toy-wide and toy-thin of STALL_TYPES, between the type's
# toy-mini run in the cache and its toy-stream run past it, which pin its rate and its stall). Those
# runs move with the cache a shared guest gets from minute to minute: on the Xeon guest (2026-12-07,
# 11:29 UTC) toy-thin Q8_0 (98 MB, on the ramp) ran 123-129 tok/s for seven repetitions and 185-194
# in a fast spell of the level probe, its figure stood on the spell, the fit left toy-stream Q8_0 at
# -15 %, and the held-out Q8_0 rows came out +8 ... +21 % at state. Chosen (0.3) on that calibration's
# four validate runs; cross-scored (benchmarks/cross_scores.py, each calibration refit on each run):
# the Xeon's second calibration on its own runs 32 -> 32 of 33 decode rows within 15 %, both on all
# six runs 170 -> 176 of 198; on the stored Zen files, where no ramp is fitted and every run past the
# L3 lies partly past it, Zen 4 (4 x 8) 1031 -> 1026 of 1056 (median 5.6 -> 5.3 %), Zen 5 (7 x 12)
# 2668 -> 2682 of 2772 (5.4 -> 4.7 %)
RAMP_RUN_WEIGHT = 0.3
MEMORY_BOUND_SHARE = 0.9  # a run streaming this share of the bandwidth decode reached is held by memory, not its kernels
MIN_KERNEL_SHARE = 0.25  # a pure-type toy's matrices take at least this share of its step (its per-layer overhead the rest)


def _solve_pinned(rows: list[tuple[list[float], float]], pinned: dict[int, float]) -> list[float]:
    """least_squares with the unknowns of ``pinned`` (index: value) held at their values."""
    free = [i for i in range(len(rows[0][0])) if i not in pinned]
    sub = least_squares([([row[i] for i in free], b - sum(row[i] * v for i, v in pinned.items())) for row, b in rows])
    x = [pinned.get(i, 0.0) for i in range(len(rows[0][0]))]
    for i, v in zip(free, sub):
        x[i] = v
    return x


def fit_decode(runs: list[dict], bandwidth_bytes_per_s: float | None = None) -> dict:
    """Per thread count: one overhead per layer for every type, a rate per type and, where the runs
    say how many of their bytes the L3 cannot hold ("dram_bytes") and span three sizes or more,
    a DRAM stall per byte, and one of its own for a type whose runs hold its bytes in the cache and
    stream half of them or more from DRAM (own_stall_types), held at 0 where it comes out negative
    (the bound-constrained least squares: its runs past the cache ran no slower a byte than in it),
    the shared one held at the cache ladder's type's own where it has one (own_stall_types);
    least squares on relative error (each row divided by its seconds, so fast and slow runs weigh
    alike; a run of an own-stall type partly past the cache at RAMP_RUN_WEIGHT):

        seconds per token = n_layer x overhead + split_bytes_t / rate_t + dram_bytes x stall_t
                            + dram_chunks x seconds a chunk start

    dram_chunks: the chunks of rows the threads start in DRAM ("dram_chunks": cpu_model.decode_chunks
    x the run's share of bytes from DRAM; none on one thread), fitted where a run has them and held
    out where their cost comes out negative.

    split_bytes_t: the type's bytes weighted by how unevenly their rows split over the threads
    ("split_bytes_by_type", cpu_model.split_bytes; the plain bytes when a run lacks them).
    ``bandwidth_bytes_per_s``: runs that streamed MEMORY_BOUND_SHARE of it or more from DRAM
    (dram_bytes, else all their bytes, over the step less its per-layer cost) are left out (memory
    held them: they say nothing of the kernels); a type left with no run then takes that
    bandwidth as its rate (it was seen to run at least that fast).

    ``runs``: dicts with threads, n_layer, bytes_by_type, s_per_token (and optionally
    split_bytes_by_type, dram_bytes, and type: a pure-type run's). Returns {threads:
    {"overhead_s_per_layer", "rate_bytes_per_s": {type: rate}, "dram_stall_s_per_byte",
    "dram_stall_s_per_byte_by_type", "max_rel_residual", "residuals": [{model, type, residual}] (each
    fitted run's fitted seconds over its measured ones, less 1), "left_out"}}."""
    from .validate import KNEE_TYPE

    def weights(r: dict) -> dict:  # F32 is a quantized toy's norms (a few KB), but an F32 toy's weights
        by_type = r.get("split_bytes_by_type") or r["bytes_by_type"]
        return {k: b for k, b in by_type.items() if k != "F32" or set(by_type) <= {"F32"}}

    def feats(r: dict, types: list[str], dram: bool, own: tuple[str, ...] | list[str] = (),
              none: tuple[str, ...] | list[str] = (), chunk: bool = False) -> list[float]:  # one row of the least squares, before / seconds
        # an F32 toy's DRAM bytes take no stall (its rate is the bandwidth itself: cpu_model.cpu_decode_compute_s)
        f32 = set(r["bytes_by_type"]) <= {"F32"}
        stalled = 0.0 if f32 or r.get("type") in none else r.get("dram_bytes", 0.0)
        # a pure-type run's DRAM bytes are its type's: on that type's own stall where it has one, else the shared one
        mine = r.get("type") if r.get("type") in own else None
        return [r["n_layer"]] + [weights(r).get(k, 0) for k in types] + ([0.0 if mine else stalled] if dram else []) \
            + [stalled if k == mine else 0.0 for k in own] + ([0.0 if f32 else r.get("dram_chunks", 0.0)] if chunk else [])

    def own_stall_types(sel: list[dict], types: list[str]) -> list[str]:
        """Types whose runs tell their own DRAM stall from their rate: one of their runs holds its
        bytes in the cache (5 % past it at most) and one streams at least half of them from DRAM
        (calibrate's toy-mini and toy-stream runs of STALL_TYPES; with none in the cache the stall
        and the rate trade off on the ramp's fitted edges). The ladder's type is one (toy-wide-2 in
        the cache, toy-wide-24 past it), and the shared stall of the others is held at its own: on
        the shared one with the types that have no runs in and past the cache, the ladder's runs came
        out +23 % at 35 MB ... -15 % at 224 MB (the Xeon guest, 2026-12-07 14:37 UTC: 23 ps a byte,
        the ladder's own 40); on its own stall (and the ramp fitted with the per-layer cost held),
        every one within 4 %."""
        out = []
        for k in types:
            share = [r.get("dram_bytes", 0.0) / max(total(r), 1.0) for r in sel if r.get("type") == k]
            if k != "F32" and len(share) >= 3 and min(share) <= 0.05 and max(share) >= 0.5:
                out.append(k)
        return out

    def total(r: dict) -> float:
        return sum(b for k, b in r["bytes_by_type"].items() if k != "F32" or set(r["bytes_by_type"]) <= {"F32"})

    def weight(r: dict, own: list[str]) -> float:  # a row's weight in the least squares (RAMP_RUN_WEIGHT)
        share = r.get("dram_bytes", 0.0) / max(total(r), 1.0)
        return RAMP_RUN_WEIGHT if r.get("type") in own and 0.0 < share < 1.0 else 1.0

    out = {}
    for t in sorted({r["threads"] for r in runs}):
        every = [r for r in runs if r["threads"] == t]
        all_types = sorted({k for r in every for k in weights(r)})
        sel, left_out = every, []
        own: list[str] = []
        none: list[str] = []  # types whose own stall came out negative: held at 0
        for _ in range(3):  # fit, leave out the runs memory held, fit again
            types = sorted({k for r in sel for k in weights(r)})
            dram = len({round(total(r), -6) for r in sel if "dram_bytes" in r}) >= 3 and any(r.get("dram_bytes", 0) > 0 for r in sel)
            own, none = (own_stall_types(sel, types) if dram else []), []
            # the chunks the threads start in DRAM (cpu_model.dram_chunk_s): on two threads or more
            chunk = dram and any(r.get("dram_chunks", 0.0) > 0 for r in sel)
            while True:
                rows = [([w * f / r["s_per_token"] for f in feats(r, types, dram, own, none, chunk)], w)
                        for r in sel for w in (weight(r, own),)]
                x = least_squares(rows)
                neg = [k for i, k in enumerate(own) if x[1 + len(types) + dram + i] < 0]
                if not neg:
                    if chunk and x[-1] < 0:  # no cost of a chunk start to be told apart: fit without it
                        chunk = False
                        continue
                    break
                # held at 0, not put on the shared stall: a type whose runs past the cache ran no slower
                # a byte than in it would pull the shared stall down with it (the Xeon guest's 1-thread
                # Q4_1, 2026-12-06 11:08: -4.7 ps a byte beside 32-48 for the others; on a machine
                # made of such runs the shared stall came out 11 ps instead of 30 and the ladder's runs
                # -23 %: test_a_types_own_stall_that_comes_out_negative_is_held_at_zero)
                own, none = [k for k in own if k not in neg], none + neg
            # with the ladder's type on a stall of its own the shared one is held at it (below)
            if dram and x[1 + len(types)] < 0 and KNEE_TYPE not in own:  # no shared stall to be told apart: fit without any
                dram, own, none, chunk = False, [], [], False
                rows = [([f / r["s_per_token"] for f in feats(r, types, dram)], 1.0) for r in sel]
                x = least_squares(rows)
            pinned: dict[int, float] = {}  # unknowns held at a value: the shared stall at the ladder's type's own
            if dram and KNEE_TYPE in own:
                # the types without a stall of their own take the ladder's, as the fit of every run gives it:
                # their two shapes alone tell it from their rates poorly (the Xeon guest, 2026-12-07 14:37
                # UTC: 19 ps a byte beside the ladder's 40, and toy-290m Q2_K and Q3_K_M, past the cache,
                # +22 ... +35 % fast at state over eight validate runs; fitted as one unknown with the
                # ladder's, the others pull it to 27)
                j = 1 + len(types)
                pinned = {j: x[j + 1 + own.index(KNEE_TYPE)]}
                x = _solve_pinned(rows, pinned)
            if x[0] < 0:  # no per-layer cost can be told apart: fit the rates alone
                x = _solve_pinned(rows, {**pinned, 0: 0.0})
            if not bandwidth_bytes_per_s:
                break
            # the bytes that come from DRAM (past the L3, where the run says) over the step less its per-layer cost
            held = [r for r in every if r.get("dram_bytes", total(r)) / max(r["s_per_token"] - r["n_layer"] * x[0], 1e-12)
                    >= MEMORY_BOUND_SHARE * bandwidth_bytes_per_s]
            if [r for r in every if r not in held] == sel or len(held) == len(every):
                break
            sel, left_out = [r for r in every if r not in held], held
        # a short calibration's least squares can push a type's bytes onto the per-layer overhead
        # (2026-12-02: Q4_K at 2627 GB/s on 2 threads beside 26 GB/s on 1, its bytes ~1 % of its runs'
        # seconds); such a rate, past t x the 1-thread rate with its bytes under MIN_KERNEL_SHARE of
        # every run of it, is held at t x the 1-thread rate and the rest refitted. Past t x alone is
        # no sign: one thread reaches less of the cache and DRAM than two (the Xeon guest, 2026-12-06:
        # toy-wide Q4_K decode 124 tok/s on 1 thread, 310 on 2, fastest repetitions), and holding every
        # type there drove that calibration's 2-thread overhead to -21 us a layer (worst residual 64 %)
        one, fixed = out.get(1, {}).get("rate_bytes_per_s", {}), dict(pinned)
        while t > 1:
            # the largest share of a run's seconds the fit gives each type's bytes
            kernel_share = [max((row[i] * x[i] / b for row, b in rows if row[i] > 0), default=0.0) for i in range(len(x))]
            new = {i: 1 / (t * one[k]) for i, k in enumerate(types, 1)
                   if i not in fixed and k in one and 0 < x[i] < 1 / (t * one[k]) and kernel_share[i] < MIN_KERNEL_SHARE}
            if not new:
                break
            fixed.update(new)
            x = _solve_pinned(rows, fixed)
        # a run's fitted seconds over its measured ones, less 1: how much faster than the fit of the others it ran
        fitted = [sum(a * c for a, c in zip(row, x)) / b - 1 for row, b in rows]
        resid = [abs(f) for f in fitted]
        rates = {k: 1 / v for k, v in zip(types, x[1:1 + len(types)]) if v > 0}
        for k in all_types:
            if k not in rates and bandwidth_bytes_per_s:
                rates[k] = bandwidth_bytes_per_s  # every run of it was memory-bound
        out[t] = {"overhead_s_per_layer": x[0], "rate_bytes_per_s": rates, "dram_stall_s_per_byte": x[1 + len(types)] if dram else 0.0,
                  # a type's own stall that came out negative, or that the refit above left negative, is held at 0
                  "dram_stall_s_per_byte_by_type": {**{k: max(0.0, x[1 + len(types) + 1 + i]) for i, k in enumerate(own)},
                                                    **{k: 0.0 for k in none}} if dram else {},
                  "dram_chunk_s": max(0.0, x[-1]) if chunk else 0.0,
                  "max_rel_residual": max(resid),
                  "residuals": [{"model": r.get("model"), "type": r.get("type"), "residual": f} for r, f in zip(sel, fitted)],
                  "left_out": [f"{r.get('model', '?')} {r.get('type', '?')}" for r in left_out]}
    return out


def nominal_fp32_peak_tflops() -> float | None:
    """cores x clock x FP32 FLOP per cycle of this CPU (detect's estimate), or None."""
    from .detect import FP32_FLOP_PER_CYCLE
    from .probes.cpu import probe_cpu, usable_cpus

    cpu, _ = probe_cpu()
    if not cpu or not cpu.max_mhz:
        return None
    cores = cpu.physical_cores or usable_cpus() or 1
    return cores * cpu.max_mhz * 1e6 * FP32_FLOP_PER_CYCLE[cpu.simd] / 1e12


def _figures(runs: dict):
    """(model, type, threads, test, figure) of every figure in profile["llama_cpp"]["runs"]."""
    for model, by_type in runs.items():
        for ty, by_threads in by_type.items():
            for t, m in by_threads.items():
                for what, fig in m.items():
                    yield model, ty, t, what, fig


# the share of a (threads, test)'s figures that must have a repetition at the fast level for it to
# stand as the machine's level (probe_levels)
LEVEL_MIN_FIGURE_SHARE = 0.5


def probe_levels(runs: dict) -> tuple[dict, dict]:
    """(fastest, level) of the level probe at each (threads, test) over a calibration's llama.cpp
    ``runs`` (profile["llama_cpp"]["runs"]): its fastest run, and the machine's level, the median of
    its runs within validate.FAST_LEVEL of that fastest (the machine undisturbed), where at least
    LEVEL_MIN_FIGURE_SHARE of the figures have a repetition at it; else the median of all its runs
    (the machine as it ran: a short fast spell is not its level). On the Xeon guest (2026-12-06,
    18:16 UTC) a fast spell at the start set the 2-thread level at 363 tok/s while the probe ran
    260-320 through the rest: 64 of 75 figures had no repetition at it and stood at their fastest
    repetition, the state probes' figures at the fast spell, and every validate run since came out
    -8 % at state (104 of 132 rows within 15 % over eight runs). With the typical level (263): 124
    of 132, while a calibration whose figures all ran at its level (16:11) keeps it (126 of 132)."""
    from .validate import FAST_LEVEL

    probe_runs: dict[tuple[str, str], list[float]] = {}
    figures: dict[tuple[str, str], list[list[float]]] = {}
    for _, _, t, what, fig in _figures(runs):
        probe = (fig.get("extra") or {}).get("probe") or ()
        probe_runs.setdefault((t, what), []).extend(probe)
        if probe:
            figures.setdefault((t, what), []).append(list(probe))
    best = {k: max(v) for k, v in probe_runs.items() if v}
    level = {k: statistics.median(v for v in probe_runs[k] if v >= FAST_LEVEL * b) for k, b in best.items()}
    for k, lv in level.items():
        at = sum(any(b >= FAST_LEVEL * lv for b in probe) for probe in figures.get(k, ()))
        if at < LEVEL_MIN_FIGURE_SHARE * len(figures.get(k, ())):
            level[k] = statistics.median(probe_runs[k])  # never above the fast level: that is the median of the top runs
    return best, level


# A figure stands on its repetitions at the machine's level where it has at least this many (the
# measurement's own stop rule asks for two at level that agree); with fewer it is carried by its
# ratio to the probe (llama_cpp_reference) and timed again after the plan (slow_figures). One
# repetition at level is one sample of a spell's edge: on a Zen 4 guest (2026-12-07, 08:52 UTC)
# toy-wide Q4_0 prefill ran 1391-1518 tok/s beside a probe at 0.75-0.89 of its level and 1565 in its
# one repetition at 0.96, which stood as the figure; Q4_0's prefill share came out high, and the
# held-out Q4_0 rows +9 ... +17 % fast (the calibration before: -4 ... -10 %). Cross-scored (every
# calibration's profile refit on every validate run, vs probe): Zen 5, 7 calibrations x 12 runs,
# decode 2633 -> 2668 and prefill 2636 -> 2649 of 2772 rows within 15 %; Zen 4, 4 x 8 runs (two of
# the calibrations with this rule), decode 1025 -> 1031, prefill 1020 -> 1017 of 1056
LEVEL_MIN_REPETITIONS = 2


def slow_figures(profile: dict) -> list[str]:
    """Keys (Step.key) of the llama.cpp figures fewer than LEVEL_MIN_REPETITIONS of whose repetitions
    ran while the level probe around them reached validate.FAST_LEVEL of the machine's level over the
    whole calibration (probe_levels): each ran in a slow spell. A figure's bar while it was timed
    was the probe's fastest run so far, and early in a run that can be a slow spell's: on a Zen 4 VM, 2026-12-04, 30 of
    165 figures of a full calibration had no repetition at the final level (toy-thin Q4_0 prefill's
    probe at most 0.83 of it). Such a figure can only be carried by its ratio to the probe, and a slow
    spell does not slow every kernel alike (the same VM: toy-wide Q4_0 / the probe 0.97 at level and
    1.06 ten minutes later with the probe at 0.91 of its level; toy-thin Q4_K 0.93 at level in the
    15:49 calibration, 0.82 at 0.87 of it hours later), so
    run_calibration times these again (``retime``)."""
    from .validate import FAST_LEVEL

    runs = (profile.get("llama_cpp") or {}).get("runs") or {}
    _, level = probe_levels(runs)
    out = []
    for model, ty, t, what, fig in _figures(runs):
        probe = (fig.get("extra") or {}).get("probe") or []
        if ((t, what) in level and len(probe) == len(fig.get("samples", ()))
                and sum(b >= FAST_LEVEL * level[(t, what)] for b in probe) < LEVEL_MIN_REPETITIONS):
            out.append(f"llama_cpp.runs.{model}.{ty}.{t}.{what}")
    return out


# A decode figure this far off the fit of the others (its fit_residual) is timed once more after the
# plan (run_calibration's ``misfit``), at most MISFIT_MAX_FIGURES of them per thread count, the worst
# first. The figures on the cache ramp move with the cache a shared guest gets from minute to minute,
# and one caught in a spell pulls its type's rate and own stall with it: on the Xeon guest
# (2026-12-06 21:26 UTC) toy-thin Q8_0 (98 MB, on the ramp) ran 184 tok/s against 130-151 in three
# other calibrations, the fit put toy-thin Q8_0 at -15 % and toy-stream Q8_0 at +16 %, Q8_0's own
# stall came out 33 ps a byte (36-37 in the others), and toy-290m Q8_0 (274 MB) was predicted +16 and
# +22 % fast at state in that calibration's two validate runs (+6 ... +13 % on the mean with the
# others). Both figures of such a pair are timed again (which one ran in a spell, the fit cannot
# tell), and each keeps the repetitions of both timings.
MISFIT_RESIDUAL = 0.08
MISFIT_MAX_FIGURES = 8


def misfit_figures(profile: dict) -> list[tuple[str, float]]:
    """(Step.key, fit residual) of the llama.cpp decode figures whose speed is more than
    MISFIT_RESIDUAL off what the decode fit of the whole calibration gives them (llama_cpp_reference's
    fit_residual: measured over fitted tok/s, less 1), the worst first, at most MISFIT_MAX_FIGURES per
    thread count."""
    by_threads: dict[int, list[tuple[float, str, float]]] = {}
    for m in llama_cpp_reference(profile)["measurements"]:
        r = m.get("fit_residual")
        if r is not None and abs(r) > MISFIT_RESIDUAL:
            by_threads.setdefault(m["threads"], []).append((abs(r), f"llama_cpp.runs.{m['model']}.{m['type']}.{m['threads']}.tg", r))
    return [(k, r) for t in sorted(by_threads) for _, k, r in sorted(by_threads[t], reverse=True)[:MISFIT_MAX_FIGURES]]


def _weight_bytes(bytes_by_type: dict) -> float:
    """A run's matrix bytes: F32 counts only in an F32 toy (else it is the norms, a few KB)."""
    return sum(b for k, b in bytes_by_type.items() if k != "F32" or set(bytes_by_type) <= {"F32"})


def llama_cpp_reference(profile: dict) -> dict:
    """The profile's llama.cpp runs fitted into a reference (the shape of a data/cpu_limits.json
    entry): per-core rates, parallel efficiency, overhead per layer, prefill shares of the fp32
    peak; with the runs, the fit's residuals and the profile's id and date."""
    from ..errors import InvalidValueError
    from ..perf.cpu_model import decode_chunks, dram_share, split_bytes
    from .validate import FAST_LEVEL, FIT_MODELS, KNEE_MODELS, KNEE_TYPE, PROBE_MODEL, PROBE_TYPE, STREAM_MODEL, TOY_MODELS, physical_cores

    n = physical_cores()
    peak = nominal_fp32_peak_tflops() or profile.get("cpu", {}).get("matmul_tflops", {}).get("fp32", {}).get("best") or 1.0
    simd = _simd(profile)
    l3 = profile.get("host", {}).get("l3_bytes")
    measured = profile.get("llama_cpp", {}).get("runs", {})
    probe_best, probe_level = probe_levels(measured)

    def tok_s(fig: dict, t: str, what: str, cap: bool) -> float:
        probe = (fig.get("extra") or {}).get("probe")
        if probe and len(probe) == len(fig["samples"]) and (t, what) in probe_best:
            # the repetitions that ran while the probe ran at the machine's level (validate.FAST_LEVEL of
            # it): chosen by it, not scaled by it (a slow spell does not slow every toy alike: scaled, 23
            # of 163 figures of a full calibration on 2026-12-02 came out 8-29 % above their median at
            # level, 22 of them above their fastest repetition). The figures are then at calibrate's level,
            # the probe's level_tok_s, where validate carries a row's speed relative to the probe
            # (ValidationRow.matched_error)
            fast = [a for a, b in zip(fig["samples"], probe) if b >= FAST_LEVEL * probe_level[(t, what)]]
            if len(fast) >= LEVEL_MIN_REPETITIONS:
                return statistics.median(fast)
            # fewer than LEVEL_MIN_REPETITIONS ran at level: its speed relative to the probe, at the
            # probe's level, never past its fastest repetition (``cap``) where the ladder measured a
            # cache ramp. The probe (70 MB) sits on the Xeon guest's cache ramp, so a spell that takes only cache slows it and not a toy held
            # in or far past the cache (2026-12-06: toy-wide-10 Q4_K 133-146 tok/s beside a probe at
            # 212-303; scaled, 206 tok/s, and the ladder's ramp came out 67-70 MB with a 23 % residual;
            # capped, 48-92 MB and 5 %). Where every toy past toy-mini is past the cache, the probe's
            # spells are the cores' and DRAM's, as the toys': capped there, a slow spell's figures stood
            # at their fastest repetition and decode came out slow (Zen 5 guest, 2026-12-07: 36 of 75
            # 2-thread decode figures none of whose repetitions ran at level, the probe at 272-604 tok/s;
            # held-out decode -9 % on the mean, 26 of 33 rows within 15 %)
            scaled = statistics.median(a / b for a, b in zip(fig["samples"], probe)) * probe_level[(t, what)]
            return min(scaled, max(fig["samples"])) if cap else scaled
        return fig["best"]

    def collect(cap: bool) -> tuple[list[dict], list[dict], list[dict]]:
        """(decode runs, the F32 stream toy's decode runs, prefill runs) of the profile's figures."""
        runs: list[dict] = []
        stream: list[dict] = []
        pp_runs: list[dict] = []
        for model, by_type in measured.items():
            for ty, by_threads in by_type.items():
                for t, m in by_threads.items():
                    if "tg" in m:
                        x = m["tg"]["extra"]
                        # the F32 stream toy waits on DRAM: a slow spell that slows the probe's kernels (another
                        # guest on the core) leaves it as it was (2026-12-01: 53-57 tok/s beside a probe at 78 %
                        # of its best), so its fastest repetition is its figure, not its ratio to the probe
                        bandwidth_run = model == STREAM_MODEL and ty == "F32"
                        rate = m["tg"]["best"] if bandwidth_run else tok_s(m["tg"], t, "tg", cap)
                        run = {"model": model, "type": ty, "threads": int(t), "n_layer": x["n_layer"], "bytes_by_type": x["bytes_by_type"],
                               "s_per_token": 1 / rate, "tg_tok_s": rate}
                        if x.get("matrices"):
                            run["split_bytes_by_type"] = split_bytes([tuple(mx) for mx in x["matrices"]], int(t), simd)
                        if model in TOY_MODELS and ty != "F32":  # a pure toy: its matrices' rows from its shape
                            run["chunks"] = decode_chunks([(ty, 0, rows) for rows in TOY_MODELS[model].decode_matrix_rows()], int(t), simd)
                        (stream if bandwidth_run else runs).append(run)
                    if "pp" in m:
                        x = m["pp"]["extra"]
                        n_embd = x.get("n_embd") or (TOY_MODELS[model].n_embd if model in TOY_MODELS else None)
                        if not n_embd:
                            raise InvalidValueError(f"the profile's prefill run of {model!r} does not say its n_embd; run `inferlab calibrate --engine llama.cpp` again")
                        pp_runs.append({"model": model, "type": ty, "threads": int(t), "n_layer": x["n_layer"], "n_embd": n_embd,
                                        "flops_per_token": x["prefill_flops_per_token"],
                                        "n_prompt": x.get("n_prompt"),
                                        "s_per_token": 1 / tok_s(m["pp"], t, "pp", cap)})
        return runs, stream, pp_runs

    def cache_ladder(runs: list[dict]) -> list[dict]:
        t_max = max(r["threads"] for r in runs)
        return [{"n_layer": r["n_layer"], "bytes": _weight_bytes(r["bytes_by_type"]), "s_per_token": r["s_per_token"]}
                for r in runs if r["model"] in KNEE_MODELS and r["type"] == KNEE_TYPE and r["threads"] == t_max]

    runs, stream, pp_runs = collect(cap=True)
    if not runs:
        raise InvalidValueError("the profile holds no llama.cpp runs to fit; run `inferlab calibrate --engine llama.cpp`")
    # the bytes of each run that come from DRAM: by the cache ramp its ladder measured (every thread
    # count: the cache is the machine's), else (a profile without the ladder) the bytes past lscpu's L3
    ladder = cache_ladder(runs)
    ramp = fit_cache_ramp(ladder)
    capped = True
    if ramp is None and len(ladder) >= 4:
        # no ramp: the figures of the slow spells are carried by the probe, uncapped (tok_s), unless
        # so carried the ladder shows one
        uncapped = collect(cap=False)
        if fit_cache_ramp(cache_ladder(uncapped[0])) is None:
            runs, stream, pp_runs = uncapped
            ladder, capped = cache_ladder(runs), False
    t_max = max(r["threads"] for r in runs)

    def place(ramp: dict | None) -> None:
        for r in runs:
            total = _weight_bytes(r["bytes_by_type"])
            if ramp:
                r["dram_bytes"] = dram_share(total, ramp["ramp_bytes"]) * total  # all of them once past the ramp
            elif l3:  # as calibrated before the ladder: an F32 toy's own weights not counted
                r["dram_bytes"] = max(0.0, sum(b for k, b in r["bytes_by_type"].items() if k != "F32") - l3)
            if r.get("chunks") and r.get("dram_bytes") and total:
                r["dram_chunks"] = r["chunks"] * min(1.0, r["dram_bytes"] / total)  # the chunks started in DRAM (cpu_model.dram_chunk_s)
            elif "dram_chunks" in r:
                del r["dram_chunks"]

    place(ramp)
    if ramp:
        # the ladder differs by its layers alone, so its bytes are the output head's plus n_layer x a
        # layer's: fitted alone, its per-layer cost and its rate trade along the head's seconds (the
        # Xeon guest, 2026-12-07 14:37 UTC: 228 us a layer at 50 GB/s, where the fit of every type gives
        # 35 us; three calibrations an hour apart gave 55, 141 and 228 us) and the ramp's edges move
        # with them. So the ramp is fitted again with the per-layer cost of the decode fit held
        # (61-92 MB -> 48-98 MB there)
        held = fit_cache_ramp(ladder, fit_decode(runs)[t_max]["overhead_s_per_layer"])
        if held:
            ramp = held
            place(ramp)
    # the bandwidth llama.cpp's decode reaches, from the memory-bound toy (F32): its bytes over
    # (seconds per token less the per-layer cost); eta is that over the best read bandwidth this
    # profile measured. Not capped at 1: calibrate's numpy read (a max reduction, one slice per
    # thread) can stream slower than llama.cpp's own kernels (Zen 5 VM, 2 threads: 38 GB/s read,
    # 59-62 GB/s F32 decode), and the bandwidth limit must not be below what decode was seen to do
    bw = max((m.get("best", m.get("median", 0)) for m in profile.get("cpu", {}).get("read_bandwidth_gbs", {}).values()), default=None)
    eta, achieved = 0.7, None
    if stream and bw:
        o = fit_decode(runs)[max(r["threads"] for r in runs)]["overhead_s_per_layer"]
        achieved = max(sum(r["bytes_by_type"].values()) / (r["s_per_token"] - r["n_layer"] * o) for r in stream
                       if r["s_per_token"] > r["n_layer"] * o) / 1e9
        eta = achieved / bw
    fits = fit_decode(runs, achieved * 1e9 if achieved else None)
    one, alln = fits.get(1), fits[max(fits)]
    # a deep step leaves the cache sooner than the ladder's toy of its bytes: the ramp's start per layer
    # beyond it, fitted on the fit models' runs at the ladder's threads as the rates price them
    shift = fit_ramp_shift([r for r in runs if r["threads"] == t_max and r["model"] in FIT_MODELS], ladder, ramp["ramp_bytes"],
                           fits[t_max]) if ramp and t_max in fits else None
    per_core = (one or alln)["rate_bytes_per_s"]
    # every core's rate over the cores x one core's, as fitted: above 1 where one thread reaches less of
    # the cache and DRAM than all of them (the Xeon guest, 2 threads, 2026-12-06: 2.0-5.5 by type;
    # fit_decode holds only a rate its runs do not pin), so decode on every core is priced at its own fit
    eff = {ty: alln["rate_bytes_per_s"][ty] / (max(fits) * per_core[ty])
           for ty in per_core if ty in alln["rate_bytes_per_s"]} if one and max(fits) > 1 else {ty: 1.0 for ty in per_core}

    # prefill: seconds per prompt token = sum of FLOPs_t / (share_t x peak of the threads) + n_layer x
    # n_embd x a cost per layer, token and channel: the rest of the graph (norms, RoPE, the residual
    # adds, quantizing each matmul's activations, attention at calibrate's prompt length) works on
    # rows of n_embd, the same for every type. A cost per layer and token alone (as until 2026-12-02)
    # put the d 512 and d 1024 toys' rest at one figure: held out, the d 1024 toys came out 14-16 %
    # fast (Zen 4 VM, 2 threads; 13 of 13 prefill rows within 15 % with n_embd in, 10 without)
    shares, pp_overhead = {}, 0.0
    if pp_runs:
        t_pp = max(r["threads"] for r in pp_runs)
        sel = [r for r in pp_runs if r["threads"] == t_pp]
        ptypes = sorted({r["type"] for r in sel})
        peak_t = peak * 1e12 * t_pp / n
        rows = [([r["n_layer"] * r["n_embd"] / r["s_per_token"]] + [(r["flops_per_token"] / peak_t if r["type"] == ty else 0.0) / r["s_per_token"]
                                                      for ty in ptypes], 1.0) for r in sel]
        x = least_squares(rows) if len({r["n_layer"] * r["n_embd"] for r in sel}) > 1 else [0.0] + least_squares([(row[1:], b) for row, b in rows])
        if x[0] < 0:
            x = [0.0] + least_squares([(row[1:], b) for row, b in rows])
        pp_overhead = x[0]
        shares = {ty: round(1 / v, 3) for ty, v in zip(ptypes, x[1:]) if v > 0}
        for r in sel:  # the fit's residual: fitted over measured seconds a prompt token, less 1 (below 0: it ran slower)
            if r["type"] in shares:
                fitted = r["n_layer"] * r["n_embd"] * pp_overhead + r["flops_per_token"] / (shares[r["type"]] * peak_t)
                r["fit_residual"] = fitted / r["s_per_token"] - 1
    rid = profile_id(profile)
    resid = {(e["model"], e["type"], t): e["residual"] for t, f in fits.items() for e in f["residuals"]}
    return {"id": rid, "date": profile["date"], "simd": _simd(profile), "cpu": profile["host"]["cpu"], "n_cores": n,
            "per_core_bytes_per_s": per_core, "parallel_efficiency": eff,
            "rates_bytes_per_s_by_threads": {str(t): f["rate_bytes_per_s"] for t, f in fits.items()},
            "overhead_s_per_layer": alln["overhead_s_per_layer"],
            "overhead_s_per_layer_by_threads": {str(t): f["overhead_s_per_layer"] for t, f in fits.items()},
            "max_rel_residual_by_threads": {str(t): f["max_rel_residual"] for t, f in fits.items()},
            "dram_stall_s_per_byte_by_threads": {str(t): f["dram_stall_s_per_byte"] for t, f in fits.items()}, "l3_bytes": l3,
            # seconds a chunk of rows started in DRAM costs (cpu_model.dram_chunk_s), where the fit told it apart
            "dram_chunk_s_by_threads": {str(t): f["dram_chunk_s"] for t, f in fits.items() if f["dram_chunk_s"]},
            # the types whose runs in and past the cache tell their own stall apart (toy-mini's and toy-stream's): legacy and
            # repacked kernels stall more per byte than the ladder's Q4_K (Xeon guest, 2026-12-06, 2 threads:
            # toy-stream Q4_0 +37 %, Q8_0 +14 % predicted fast on the one stall, Q4_K +0.6 %)
            "dram_stall_s_per_byte_by_type_by_threads": {str(t): f["dram_stall_s_per_byte_by_type"] for t, f in fits.items()
                                                         if f["dram_stall_s_per_byte_by_type"]},
            "dram_ramp_bytes": ramp["ramp_bytes"] if ramp else None,
            "dram_ramp_shift_bytes_per_layer": shift["shift_bytes_per_layer"] if shift else 0.0, "cache_ladder": {
                "fit": ramp, "ladder_bytes": sorted(r["bytes"] for r in ladder), "type": KNEE_TYPE, "threads": t_max,
                "layers_by_bytes": sorted([r["bytes"], r["n_layer"]] for r in ladder), "shift_fit": shift,
                "what": "decode's weights come from DRAM past dram_ramp_bytes (cpu_model.dram_share), fitted on the ladder's runs"
                        if ramp else ("no step up seen on the ladder (its smallest size past the cache already, or no step "
                                      "within it): the bytes past lscpu's L3 stall" + ("" if capped else ", and a slow spell's "
                                      "figures are carried by the probe uncapped") + "; decode of models past its largest size "
                                      "is not verified here") if len(ladder) >= 4 else
                        "no ladder in this profile (calibrated before 2026-12-05): the bytes past lscpu's L3 stand in"},
            "left_out_memory_bound_by_threads": {str(t): f["left_out"] for t, f in fits.items() if f["left_out"]},
            "level_probe": {"model": PROBE_MODEL, "type": PROBE_TYPE, "best_tok_s": {f"{t}.{w}": v for (t, w), v in sorted(probe_best.items())},
                            "level_tok_s": {f"{t}.{w}": v for (t, w), v in sorted(probe_level.items())},
                            "n_prompt": next((r["n_prompt"] for r in pp_runs), None)} if probe_best else None,
            "decode_bw_eff": eta, "decode_bw_achieved_gbs": achieved, "read_bandwidth_gbs_best": bw,
            "prefill_eff_vs_fp32_peak_by_type": shares, "prefill_overhead_s_per_layer_token_channel": pp_overhead,
            "prefill_eff_vs_fp32_matmul": statistics.median(shares.values()) if shares else 0.5, "fp32_peak_tflops": peak,
            "engine": profile.get("llama_cpp", {}).get("engine", "llama.cpp"),
            "source": f"inferlab calibrate --engine llama.cpp on this machine ({profile['host']['cpu']}), machine profile {rid}",
            "provenance": f"llama.cpp CPU rates measured on this machine: machine profile {rid} of {profile['date']}",
            "measurements": [{**{k: r[k] for k in ("model", "type", "threads", "tg_tok_s")},
                              **({"fit_residual": resid[(r["model"], r["type"], r["threads"])]}
                                 if (r["model"], r["type"], r["threads"]) in resid else {})} for r in runs],
            "prefill_measurements": [{"model": r["model"], "type": r["type"], "threads": r["threads"], "pp_tok_s": 1 / r["s_per_token"],
                                      **({"fit_residual": r["fit_residual"]} if "fit_residual" in r else {})} for r in pp_runs]}


def _simd(profile: dict) -> str:
    feats = set(profile.get("host", {}).get("features", []))
    return "amx" if any(f.startswith("amx") for f in feats) else "avx512" if any(f.startswith("avx512") for f in feats) \
        else "neon" if "neon" in feats else "avx2"


def problems(profile: dict) -> list[str]:
    """Why the profile's figures should not be trusted: figures whose two fastest repetitions
    disagree, and measurements during which the machine was busy or its CPU time stolen."""
    out = []

    def visit(node, path):
        if isinstance(node, dict) and "samples" in node and "best" in node:
            if node.get("best_two_gap", 0) > STABLE_TOL and len(node["samples"]) >= 2:
                out.append(f"{path}: unstable (the two fastest of {len(node['samples'])} repetitions differ by {node['best_two_gap']:.0%})")
            for why in (node.get("interference") or {}).get("problems", []):
                out.append(f"{path}: {why}")
        elif isinstance(node, dict):
            for k, v in node.items():
                visit(v, f"{path}.{k}" if path else k)

    visit({"cpu": profile.get("cpu", {}), "llama_cpp": profile.get("llama_cpp", {})}, "")
    return out


def run_calibration(steps: list[Step], on_step: Callable[[Step, Measurement | None, str], None] | None = None,
                    gpu: bool = True, retime: int = 0, misfit: bool = False) -> dict:
    """Run the steps, return the profile dict (not yet saved). A step that cannot run (no torch,
    no int8 kernels) is recorded under "skipped" with the reason instead of failing the run. The
    llama.cpp runs, when there are some, are fitted into this CPU's rates (profile["llama_cpp"]
    ["reference"]); profile["problems"] lists what makes figures untrustworthy (``problems``).

    ``retime``: after the steps, up to that many passes over the llama.cpp figures under two of
    whose repetitions ran at the machine's level (slow_figures), each timed again by its step (the
    repetitions of both kept); the passes stop when none is left or a pass left as many as before
    (a slow spell that lasts). Such a step is reported as a Step with ``again`` set; the keys timed
    again in each pass are kept in profile["llama_cpp"]["retimed"].
    ``misfit``: then one pass over the decode figures furthest off the fit of the others
    (misfit_figures), each timed again the same way; their keys and residuals before it are kept in
    profile["llama_cpp"]["misfit_retimed"]."""
    from ..errors import InferlabError
    from .probes.cpu import probe_cpu

    cpu, _ = probe_cpu()
    import platform

    profile: dict = {"version": PROFILE_VERSION, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "host": {"cpu": cpu.model if cpu else "unknown", "logical_cores": cpu.logical_cores if cpu else None,
                              "physical_cores": cpu.physical_cores if cpu else None,
                              "features": list(cpu.features) if cpu else [], "name": platform.node() or "local",
                              "l3_bytes": cpu.l3_bytes if cpu else None},
                     "cpu": {}, "gpu": {}, "skipped": {}}
    t_start = time.perf_counter()

    def run(step: Step) -> None:
        try:
            m = step.run()
        except (InferlabError, ImportError, RuntimeError, MemoryError) as exc:
            profile["skipped"][step.key] = str(exc)
            if on_step:
                on_step(step, None, str(exc))
            return
        old = _get(profile, step.key)
        _put(profile, step.key, _merged(old, m) if old else m.to_json())  # a later round of the same figure: both rounds' samples
        if on_step:
            on_step(step, m, "")

    for step in steps:
        run(step)
    by_key = {s.key: s for s in steps}
    left = None
    for _ in range(retime):
        slow = [k for k in slow_figures(profile) if k in by_key]
        if not slow or (left is not None and len(slow) >= left):
            break
        profile.setdefault("llama_cpp", {}).setdefault("retimed", []).append(slow)
        for k in slow:
            s = by_key[k]
            run(Step(s.key, f"{s.label} again (under two of its repetitions ran at the machine's level)", s.run, again=True))
        left = len(slow)
    if misfit and (profile.get("llama_cpp") or {}).get("runs"):
        off = [(k, r) for k, r in misfit_figures(profile) if k in by_key]
        if off:
            profile["llama_cpp"]["misfit_retimed"] = dict(off)
        for k, r in off:
            s = by_key[k]
            run(Step(s.key, f"{s.label} again ({r:+.0%} off the fit of the others)", s.run, again=True))
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
    if profile.get("llama_cpp", {}).get("runs"):
        try:
            import llama_cpp

            profile["llama_cpp"]["engine"] = f"llama.cpp via llama-cpp-python {getattr(llama_cpp, '__version__', '?')}"
        except ImportError:
            pass
        profile["llama_cpp"]["reference"] = llama_cpp_reference(profile)
    profile["problems"] = problems(profile)
    profile["duration_s"] = time.perf_counter() - t_start
    return profile


def _get(profile: dict, dotted: str) -> dict | None:
    node = profile
    for p in dotted.split("."):
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node if isinstance(node, dict) and "samples" in node else None


def _merged(old: dict, m: Measurement) -> dict:
    """A figure measured again in a later round: the samples of every round, best and spread over
    all of them; the interference of the round that ran the fastest repetition (the one scored),
    every round's kept under interference_rounds."""
    extra = dict(m.extra or old.get("extra") or {})
    p_old, p_new = (old.get("extra") or {}).get("probe"), (m.extra or {}).get("probe")
    if p_old is not None and p_new is not None and len(p_old) == len(old["samples"]) and len(p_new) == len(m.samples):
        extra["probe"] = list(p_old) + list(p_new)  # the level probe around each repetition of both rounds
    elif "probe" in extra:  # one round without its probe: the probe's runs no longer pair with the samples
        del extra["probe"]
    both = Measurement(m.what, m.unit, tuple(old["samples"]) + tuple(m.samples), m.detail, extra=extra or None)
    out = both.to_json()
    rounds = old.get("interference_rounds") or ([old["interference"]] if "interference" in old else [])
    new = m.interference.to_json() if m.interference is not None else None
    if new is not None:
        rounds = rounds + [new]
    if rounds:
        out["interference_rounds"] = rounds
        out["interference"] = new if (new is not None and max(m.samples) >= max(old["samples"])) else old.get("interference", new)
    out["rounds"] = old.get("rounds", 1) + 1
    return out


def _put(profile: dict, dotted: str, value: dict) -> None:
    node = profile
    *path, last = dotted.split(".")
    for p in path:
        node = node.setdefault(p, {})
    node[last] = value


__all__ = ["Measurement", "Step", "copy_bandwidth_gbs", "load_profile", "matmul_tflops", "plan",
           "profile_path", "read_bandwidth_gbs", "run_calibration", "save_profile"]

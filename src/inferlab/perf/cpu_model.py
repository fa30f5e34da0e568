"""How fast llama.cpp's CPU backend can dequantize-and-dot weights, per core and ggml type.

Decode on a CPU reads every weight once per token. When the cores are fast and few memory
channels feed them, bandwidth limits it (bytes / (η·β)); when the cores are few or slow, the
dequantize+dot kernels do (bytes / (rate per core x threads)). The rates are measured with
llama.cpp itself (tg of single-type models, benchmarks/cpu_decode_rates.py) and stored as data
with their source in data/cpu_limits.json, one reference CPU per ISA class.

Where the rates come from, for a device (``reference_for``):
1. this machine's own rates, measured by ``inferlab calibrate --engine llama.cpp`` and attached
   to the detected device by hardware.detect (``attach_rates``): the machine profile's id and date;
2. without llama.cpp, the reference of the device's ISA class scaled by what ``inferlab calibrate``
   measured here against the same figures on the reference (``scaled_reference``);
3. otherwise the reference of the device's ISA class as measured (a catalog CPU), or of the
   widest class it also runs when its own has none (``nearest_reference``: AMX -> AVX-512).
A ggml type the chosen rates lack takes a stand-in of its kernel family (data: kernel_families);
``rate_provenance`` says which, so a prediction can name it. Standard library only (core).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache, lru_cache
from importlib import resources

from ..errors import InvalidValueError, UnknownNameError
from ..hardware.device import Device


@cache
def limits() -> dict:
    """The table (data/cpu_limits.json): reference CPUs, each with per-type rates and sources."""
    return json.loads(resources.files("inferlab.data").joinpath("cpu_limits.json").read_text())


# ---------------------------------------------------------------- kernel families and stand-ins

@cache
def _family_of() -> dict[str, str]:
    return {ty: fam for fam, f in limits()["kernel_families"]["families"].items() for ty in f["types"]}


def kernel_family(ggml_type: str) -> str:
    """The llama.cpp CPU kernel family of a ggml type (float, legacy, k-quant, iq-grid, iq-nonlinear,
    fp4, ternary, low-bit); UnknownNameError for a name that is no ggml type."""
    fam = _family_of().get(str(ggml_type).upper())
    if fam is None:
        raise UnknownNameError("ggml type", ggml_type, list(_family_of()))
    return fam


def _bpw(ty: str) -> float:
    from ..quant.types import ggml_types

    t = ggml_types().get(ty)
    return t.bits_per_weight if t else 8.0


def _candidates(ty: str, prefill: bool = False) -> list[str]:
    """Stand-ins to try for ``ty``: the data's list (for a prompt matmul, prefill_stand_ins where
    the type's prompt kernel is another one than its decode kernel), then the rest of its family
    by nearest bits per weight, then the family it falls back to (the same way)."""
    data = limits()["kernel_families"]
    listed = data["prefill_stand_ins"].get(ty) if prefill else None
    out = list(listed if listed is not None else data["stand_ins"].get(ty, []))
    fam = _family_of()[ty]
    seen = {fam}
    while fam is not None:
        members = [m for m in data["families"][fam]["types"] if m != ty]
        out += sorted(members, key=lambda m: abs(_bpw(m) - _bpw(ty)))
        fam = data["families"][fam]["falls_back_to"]
        fam = None if fam in seen else fam
        if fam:
            seen.add(fam)
    return out


def resolve_type(table: Mapping[str, float], ggml_type: str, prefill: bool = False) -> tuple[str, str]:
    """(the key of ``table`` that times ``ggml_type``, '' when it was measured itself or a sentence
    naming the stand-in and its kernel family). ``prefill``: ``table`` holds prompt-matmul shares,
    and the type's first stand-ins are those of its prompt kernel (data: prefill_stand_ins).
    Every ggml type resolves while ``table`` holds one type of any family; a name that is no ggml
    type raises UnknownNameError."""
    ty = str(ggml_type).upper()
    kernel_family(ty)  # raises for a name that is no ggml type
    if ty in table:
        return ty, ""
    seen = {ty}
    queue = _candidates(ty, prefill)
    while queue:
        c = queue.pop(0)
        if c in seen:
            continue
        seen.add(c)
        if c in table:
            same = "same" if kernel_family(c) == kernel_family(ty) else "nearest measured"
            return c, (f"{ty} ({kernel_family(ty)} kernels) not measured: stand-in {c} ({same} kernel family"
                       f"{'' if same == 'same' else ': ' + kernel_family(c)})")
        if c in _family_of():
            queue += _candidates(c, prefill)
    raise UnknownNameError("ggml type with a CPU rate", ggml_type, list(table))


# ---------------------------------------------------------------- which rates stand for a device

_ATTACHED: dict[str, dict] = {}  # Device.source -> rates measured (or scaled) for that device


def attach_rates(device: Device, reference: dict) -> None:
    """Make ``reference`` (a dict shaped like a data/cpu_limits.json entry, with an id and a date)
    the rates of ``device`` and of every device derived from it (same source string: detect puts
    the profile's id and date there). hardware.detect calls it for the calibrated host."""
    if not device.source:
        raise InvalidValueError(f"device {device.name!r} has no source string to attach CPU rates to")
    for key in ("id", "date", "per_core_bytes_per_s", "parallel_efficiency", "overhead_s_per_layer"):
        if key not in reference:
            raise InvalidValueError(f"CPU rates for {device.name!r} lack {key!r}")
    _ATTACHED[device.source] = reference
    _rate_for_plan.cache_clear()
    _prefill_rate_for_plan.cache_clear()


def attached_rates(device: Device) -> dict | None:
    """The rates attached to ``device`` (this machine's profile), or None."""
    return _ATTACHED.get(device.source)


def _simd_of(device: Device) -> str:
    """The vector ISA class of a CPU device, from its ``isa`` features (detected); a catalog host
    without them may name its ISA in its notes, else AVX2 (the common desktop and server baseline)."""
    words = {w.lower() for w in device.isa} or set(device.notes.lower().replace(",", " ").split())
    if any(w.startswith("amx") for w in words):
        return "amx"
    if any(w.startswith("avx512") for w in words):
        return "avx512"
    if "neon" in words or "asimd" in words or "apple" in device.name.lower():
        return "neon"
    return "avx2"


def measured_reference(device: Device) -> dict | None:
    """The stored reference CPU of ``device``'s ISA class, or None when none was measured."""
    simd = _simd_of(device)
    return next((r for r in limits()["references"] if r["simd"] == simd), None)


# The ISA classes a CPU of each class also runs, widest first: an AMX CPU has AVX-512 (llama.cpp's
# AMX path covers a few types' matmuls when it is compiled in; every other kernel, and all of them
# in a build without it, is the AVX-512 code), and an AVX-512 CPU has AVX2.
_ISA_SUBSETS = {"amx": ("avx512", "avx2"), "avx512": ("avx2",)}


def nearest_reference(device: Device) -> dict | None:
    """The stored reference of ``device``'s ISA class, else of the widest class this CPU also runs
    (an AMX Xeon: the AVX-512 reference), else None."""
    by_simd = {r["simd"]: r for r in limits()["references"]}
    simd = _simd_of(device)
    return next((by_simd[c] for c in (simd, *_ISA_SUBSETS.get(simd, ())) if c in by_simd), None)


def reference_for(device: Device) -> dict:
    """The rates that stand for ``device``: this machine's own (attached from its profile), else the
    stored reference of its ISA class or of the nearest class it also runs (nearest_reference),
    else the first entry (a stand-in: its rates may be far from this CPU's)."""
    return _ATTACHED.get(device.source) or nearest_reference(device) or limits()["references"][0]


def rates_label(device: Device) -> str:
    """One line naming the CPU rates a prediction for ``device`` uses (profile id and date, or
    the stored reference and how it was adapted)."""
    ref = reference_for(device)
    how = ref.get("provenance")
    if how:
        return how
    if measured_reference(device) is ref:
        kind = "measured"
    elif nearest_reference(device) is ref:
        kind = f"the nearest ISA class measured: this CPU has {_simd_of(device)}"
    else:
        kind = "a stand-in (no reference of this ISA class)"
    return f"llama.cpp CPU rates: reference {ref['id']} ({ref.get('simd', '?')}, {kind}, {ref.get('date', '?')[:10]})"


def rate_provenance(device: Device, ggml_types: Iterable[str]) -> list[str]:
    """Where the CPU rates of each type come from: the rates' label, then one sentence per type
    that takes a stand-in, and one more where its prompt matmuls take another stand-in than its
    decode (prefill_stand_ins: Q5_0's tinyBLAS kernel on x86)."""
    ref = reference_for(device)
    shares = ref.get("prefill_eff_vs_fp32_peak_by_type") or {}
    out = [rates_label(device)]
    ramp, ladder = ref.get("dram_ramp_bytes"), (ref.get("cache_ladder") or {}).get("ladder_bytes") or []
    if ramp:
        shift = ref.get("dram_ramp_shift_bytes_per_layer") or 0.0
        out.append(f"decode waits on DRAM for weights past {ramp[0] / 1e6:.0f}-{ramp[1] / 1e6:.0f} MB (calibrate's cache ladder"
                   + (f"; its start {shift / 1e6:.2f} MB lower for each layer a model has beyond the ladder's toy of its size)" if shift else ")"))
    elif len(ladder) >= 4:
        out.append(f"no cache step on calibrate's ladder up to {ladder[-1] / 1e6:.0f} MB: decode of larger models is not verified here")
    for ty in sorted({str(t).upper() for t in ggml_types}):
        key, why = resolve_type(ref["per_core_bytes_per_s"], ty)
        if why:
            out.append(why)
        if shares and ty not in shares:
            p_key, p_why = resolve_type(shares, ty, prefill=True)
            if p_key != key:
                out.append(f"prompt matmuls: {p_why}")
    return out


# ---------------------------------------------------------------- scaling a reference by calibrate's figures

# Which calibrate figure each kernel family's decode rate follows when a reference is carried to
# another CPU without llama.cpp: the quantized kernels are int8 dot products (vpmaddubsw /
# vpdpbusd), the float ones fp32 FMAs.
_SCALE_BY = {"float": "fp32_matmul_gflops_per_core", "legacy": "int8_matmul_gops_per_core",
             "k-quant": "int8_matmul_gops_per_core", "iq-grid": "int8_matmul_gops_per_core",
             "iq-nonlinear": "int8_matmul_gops_per_core", "fp4": "int8_matmul_gops_per_core",
             "ternary": "int8_matmul_gops_per_core", "low-bit": "int8_matmul_gops_per_core"}


def scaled_reference(ref: dict, here: Mapping[str, float], *, rid: str, date: str) -> dict:
    """``ref`` carried to this CPU by what ``inferlab calibrate`` measured on both: each type's
    per-core rate x (this CPU's / the reference's per-core int8 or fp32 matmul rate, by kernel
    family), the per-layer overhead / the fp32 ratio (graph nodes are float work), prefill shares
    kept (they are shares of the fp32 rate, which is this CPU's). ``here`` and the reference's
    ``calibrate_figures`` hold fp32_matmul_gflops_per_core and int8_matmul_gops_per_core; a figure
    missing on either side scales nothing and is named in the provenance."""
    theirs = ref.get("calibrate_figures") or {}
    ratios, missing = {}, []
    for fig in sorted(set(_SCALE_BY.values())):
        if theirs.get(fig) and here.get(fig):
            ratios[fig] = here[fig] / theirs[fig]  # this CPU's kernels vs the reference's, same calibrate kernel
        else:
            missing.append(fig)
    out = dict(ref)
    out["per_core_bytes_per_s"] = {ty: r * ratios.get(_SCALE_BY[kernel_family(ty)], 1.0)
                                   for ty, r in ref["per_core_bytes_per_s"].items()}
    out.pop("rates_bytes_per_s_by_threads", None)  # measured on the reference only
    out["overhead_s_per_layer"] = ref["overhead_s_per_layer"] / ratios.get("fp32_matmul_gflops_per_core", 1.0)
    out.pop("fp32_peak_tflops", None)  # prefill shares apply to this device's own fp32 figure
    out.pop("measurements", None)
    out["id"], out["date"], out["scaled_from"] = rid, date, ref["id"]
    said = ", ".join(f"{k.split('_matmul')[0]} x{v:.2f}" for k, v in ratios.items()) or "nothing (no common figures)"
    out["provenance"] = (f"llama.cpp CPU rates: reference {ref['id']} ({ref['simd']}) scaled by machine profile {rid} of "
                         f"{date} ({said})" + (f"; not scaled by {', '.join(missing)} (not measured on both)" if missing else ""))
    return out


# ---------------------------------------------------------------- rates

def cpu_decode_rate_bytes_per_s(device: Device, ggml_type: str, n_threads: int | None = None) -> float:
    """Bytes of ``ggml_type`` weights per second that llama.cpp's CPU kernels can dequantize and
    dot with one token's activations, using ``n_threads`` threads on ``device`` (default: its
    cores). This is the compute limit of CPU decode only; the caller takes the minimum with the
    memory limit η·β. Threads past the physical cores add nothing (SMT shares the vector units).

    rate = per-core rate of the type x threads x parallel efficiency (both measured with llama.cpp;
    data/cpu_limits.json or the machine profile says on which CPU, how and when). A type not
    measured there takes a stand-in of its kernel family (resolve_type).
    """
    if not device.is_cpu:
        raise InvalidValueError(f"{device.name!r} is a {device.backend} device; CPU decode rates apply to cpu devices")
    used = _threads_used(device, n_threads)
    ref = reference_for(device)
    rates = ref["per_core_bytes_per_s"]
    key, _ = resolve_type(rates, ggml_type)
    eff_table = ref["parallel_efficiency"]
    eff = eff_table[resolve_type(eff_table, key)[0]] if used > 1 else 1.0  # threads synchronise after every matmul
    return rates[key] * used * eff  # per-core rate x threads x measured parallel efficiency


def cpu_decode_rate_for_mix(device: Device, bytes_by_type: Mapping[str, float], n_threads: int | None = None) -> float:
    """The same limit for a model whose weights mix types (Q4_K_M: Q4_K and Q6_K...): total bytes
    over the sum of each type's time, bytes_t / rate_t (a harmonic mean weighted by bytes)."""
    total = sum(bytes_by_type.values())
    if total <= 0:
        raise InvalidValueError(f"bytes_by_type must hold some bytes, got {dict(bytes_by_type)!r}")
    t = sum(b / cpu_decode_rate_bytes_per_s(device, ty, n_threads) for ty, b in bytes_by_type.items() if b)
    return total / t


def _row_chunks(n_rows: int, n_threads: int, repacked: bool) -> tuple[int, int]:
    """(chunks, rows a chunk) of one decode matmul of ``n_rows`` rows over ``n_threads`` threads, the
    way llama.cpp's CPU backend splits them (data/cpu_limits.json "matmul_split"): the plain path
    hands out chunks of 64 rows, or one chunk per thread when there would be fewer than 4 a thread;
    the repacked path (CPU_REPACK buffers) 4 chunks a thread, at least 8 rows each."""
    s = limits()["matmul_split"]
    nth, nr0 = n_threads, n_rows
    if repacked:
        min_rows = s["repack_rows_multiple"]
        dr0 = -(-nr0 // (nth * s["chunks_per_thread_min"]))  # chunk_size0 = ceil(nr0 / (4 nth))
        nchunk = -(-nr0 // dr0)
        if nr0 // nchunk < min_rows <= nr0:
            nchunk = -(-nr0 // min_rows)
        dr0 = -(-nr0 // nchunk)
        if nchunk < nth and -(-nr0 // nth) >= min_rows:
            nchunk, dr0 = nth, -(-nr0 // nth)
        nchunk = min(nchunk, -(-nr0 // min_rows))
    else:
        nchunk = -(-nr0 // s["chunk_rows"])
        if nchunk < nth * s["chunks_per_thread_min"]:
            nchunk = nth  # re-chunked by thread
        dr0 = -(-nr0 // nchunk)
    return nchunk, dr0


def busiest_thread_rows(n_rows: int, n_threads: int, repacked: bool) -> int:
    """Rows of one decode matmul (one token) that the busiest of ``n_threads`` threads computes
    (the chunks of _row_chunks). Every thread computes as fast as the others, so the busiest gets
    ceil(chunks / threads) chunks."""
    if n_threads <= 1 or n_rows <= 0:
        return n_rows
    nchunk, dr0 = _row_chunks(n_rows, n_threads, repacked)
    per_thread = -(-nchunk // n_threads)  # chunks of the busiest thread
    return min(n_rows, per_thread * dr0)


def decode_chunks(matrices: Iterable[tuple[str, float, int]], n_threads: int, simd: str) -> int:
    """Chunks of rows the threads take in one decode step's matmuls (_row_chunks), over the
    ``matrices`` ((ggml type, bytes, rows); F32 and rows 0 left out); 0 on one thread. Two or more
    threads take a matmul's chunks from one counter, so a thread's next chunk is not where its last
    one ended (dram_chunk_s)."""
    if n_threads <= 1:
        return 0
    return sum(_row_chunks(rows, n_threads, is_repacked(simd, ty, rows))[0] for ty, _, rows in matrices if rows > 0 and ty != "F32")


def is_repacked(simd: str, ggml_type: str, n_rows: int) -> bool:
    """Whether llama.cpp's CPU backend repacks a weight of this type and row count on this ISA class."""
    s = limits()["matmul_split"]
    return str(ggml_type).upper() in s["repacked_types_by_simd"].get(simd, ()) and n_rows % s["repack_rows_multiple"] == 0


def split_bytes(matrices: Iterable[tuple[str, float, int]], n_threads: int, simd: str) -> dict[str, float]:
    """Bytes by type of the matrices one decode step multiplies, each weighted by how unevenly its
    rows split over the threads (busiest thread's rows x threads / rows: 1 when they split evenly).
    ``matrices``: (ggml type, bytes, rows; rows 0 when unknown: even). The step waits for the
    busiest thread at every matmul, so a 576-row projection that is not repacked takes, on 2
    threads, 9 chunks of 64 rows: 5 and 4, 320 / 288 = 1.11x its even share."""
    out: dict[str, float] = {}
    for ty, n_bytes, rows in matrices:
        f = busiest_thread_rows(rows, n_threads, is_repacked(simd, ty, rows)) * n_threads / rows if rows > 0 else 1.0
        out[ty] = out.get(ty, 0.0) + n_bytes * f
    return out


def split_bytes_by_type(device: Device, matrices: Iterable[tuple[str, float, int]], n_threads: int | None = None) -> dict[str, float]:
    """split_bytes for ``device``'s ISA class and thread count."""
    return split_bytes(matrices, _threads_used(device, n_threads), _simd_of(device))


def dram_share(total_bytes: float, ramp_bytes: tuple[float, float] | list[float]) -> float:
    """Share of a decode step's weights that come from DRAM, not the last-level cache, when the step
    reads ``total_bytes`` of weights: 0 up to the ramp's first size, all of them past its second,
    linear between. A step sweeps the same weights in the same order every token, so once they
    overflow the cache each one is evicted before its next use and all of them stream from DRAM,
    not only the bytes past the cache's size (calibrate's ladder, an Intel Xeon guest at 2 threads,
    2026-12-05: toy-wide Q4_K decode 30 GB/s at 35-70 MB, 19-22 GB/s at 104 MB, 14.9-16.2 GB/s at
    121, 147, 172 and 224 MB: flat once past, where bytes - cache would keep falling)."""
    lo, hi = ramp_bytes
    if total_bytes <= lo:
        return 0.0
    if total_bytes >= hi:
        return 1.0
    return (total_bytes - lo) / (hi - lo)


def ladder_layers_at(layers_by_bytes: list, total_bytes: float) -> float:
    """The layers of calibrate's cache ladder toy (toy-wide's width, calibrate.fit_ramp_shift) at
    ``total_bytes`` of weights: linear between its sizes ([bytes, n_layer] pairs), held at its
    smallest and largest toy's layers beyond them."""
    pts = sorted((float(b), float(n)) for b, n in layers_by_bytes)
    if total_bytes <= pts[0][0]:
        return pts[0][1]
    for (b0, n0), (b1, n1) in zip(pts, pts[1:]):
        if total_bytes <= b1:
            return n0 + (n1 - n0) * (total_bytes - b0) / (b1 - b0) if b1 > b0 else n1
    return pts[-1][1]


def ramp_bytes_for(ref: dict, total_bytes: float, n_layer: int | None = None) -> tuple[float, float] | None:
    """The cache ramp (dram_share's first and last size) that a decode step of ``total_bytes`` of
    weights in ``n_layer`` layers meets by the rates ``ref``; None where they hold no ramp. The
    ladder's ramp, its start lowered by dram_ramp_shift_bytes_per_layer for each layer the step has
    beyond the ladder's toy of the same bytes (raised for each one fewer), its end kept: a deep,
    narrow step leaves the cache sooner than the ladder's wide one (calibrate.fit_ramp_shift). No
    n_layer, or a profile without the shift: the ladder's ramp as it is."""
    ramp = ref.get("dram_ramp_bytes")
    if not ramp:
        return None
    lo, hi = float(ramp[0]), float(ramp[1])
    shift = ref.get("dram_ramp_shift_bytes_per_layer") or 0.0
    ladder = (ref.get("cache_ladder") or {}).get("layers_by_bytes") or []
    if shift and n_layer and len(ladder) >= 2:
        lo = shifted_ramp_start(lo, hi, shift, n_layer - ladder_layers_at(ladder, total_bytes))
    return lo, hi


def shifted_ramp_start(lo: float, hi: float, shift_bytes_per_layer: float, extra_layers: float) -> float:
    """The cache ramp's start for a step of ``extra_layers`` more layers than the ladder's toy of
    its bytes (fewer: negative): ``shift_bytes_per_layer`` lower for each, never below 0 nor at
    the ramp's end (which stays: past it every byte is DRAM's)."""
    return min(0.999 * hi, max(0.0, lo - shift_bytes_per_layer * extra_layers))


def dram_bytes(ref: dict, total_bytes: float, stalled_bytes: float | None = None, n_layer: int | None = None) -> float:
    """Bytes of a decode step of ``total_bytes`` of weights (in ``n_layer`` layers) that the rates
    ``ref`` price as read from DRAM: by its cache ramp (calibrate's ladder, ramp_bytes_for and
    dram_share) where it measured one, of the step's ``stalled_bytes`` (default: all; F32 weights
    are left out by the caller: their rate is the bandwidth itself, calibrate's F32 toys stream at
    it); else the bytes past the L3 the profile was calibrated with (profiles before 2026-12-05);
    else none (a stored reference)."""
    ramp = ramp_bytes_for(ref, total_bytes, n_layer)
    if ramp:
        stalled = total_bytes if stalled_bytes is None else stalled_bytes
        return dram_share(total_bytes, ramp) * stalled  # all of them, once past the cache
    return max(0.0, total_bytes - (ref.get("l3_bytes") or 0))  # bytes past the L3


def stalled_bytes_by_type(matrices: list[tuple[str, int, int]]) -> dict[str, float]:
    """A decode step's matrix bytes by ggml type that wait on DRAM once past the cache: all but F32
    (an F32 file's weights stream at the bandwidth, their rate)."""
    by_type: dict[str, float] = {}
    for ty, b, _ in matrices:
        if ty != "F32":
            by_type[ty] = by_type.get(ty, 0.0) + b
    return by_type


def dram_stall_s_per_byte(device: Device, n_threads: int | None = None, stalled_by_type: Mapping[str, float] | None = None) -> float:
    """The DRAM stall per byte past the cache that the rates measured (0 for a stored reference):
    the shared one (the cache ladder's Q4_K), or, given the step's stalled bytes by type, each
    type's own where calibrate told one apart (dram_stall_s_per_byte_by_type_by_threads: STALL_TYPES'
    types) weighed by its bytes."""
    ref = reference_for(device)
    used = str(_threads_used(device, n_threads))
    per_byte = (ref.get("dram_stall_s_per_byte_by_threads") or {}).get(used, 0.0)
    own = (ref.get("dram_stall_s_per_byte_by_type_by_threads") or {}).get(used) or {}
    by_type = stalled_by_type or {}
    total = sum(by_type.values())
    if not per_byte or not own or not total:
        return per_byte
    return sum(b * own.get(ty, per_byte) for ty, b in by_type.items()) / total  # each type's stall, by its bytes


def dram_stall_s(device: Device, total_bytes: float, n_threads: int | None = None, stalled_bytes: float | None = None,
                 stalled_by_type: Mapping[str, float] | None = None, n_layer: int | None = None) -> float:
    """Seconds a decode step waits on DRAM beyond its kernels' time, where the rates measured it
    (this machine's calibrated profile): the bytes the last-level cache does not hold between steps
    (dram_bytes) x a per-byte stall fitted with the rates (dram_stall_s_per_byte). 0 for a stored
    reference. ``stalled_by_type`` (the step's stalled bytes by ggml type) stands for
    ``stalled_bytes`` and prices each type's DRAM bytes at its own stall; ``n_layer`` places a deep
    step on the ramp (ramp_bytes_for)."""
    per_byte = dram_stall_s_per_byte(device, n_threads, stalled_by_type)
    if not per_byte:
        return 0.0
    if stalled_by_type is not None:  # {}: none of the step's bytes stall (an F32 file)
        stalled_bytes = sum(stalled_by_type.values())
    return dram_bytes(reference_for(device), total_bytes, stalled_bytes, n_layer) * per_byte  # DRAM bytes x stall per byte


def dram_chunk_s_per_byte(device: Device, matrices: list[tuple[str, int, int]], n_threads: int | None = None) -> float:
    """The seconds of the chunks a decode step's threads start in DRAM, spread over its stalled
    bytes (all from DRAM): the rates' seconds a chunk start (dram_chunk_s_by_threads, fitted by
    calibrate on two threads or more; 0 otherwise) x the step's chunks (decode_chunks) / its bytes.
    Each thread streams its chunk's rows, then takes the next chunk from a shared counter, away from
    where it was: the hardware prefetcher starts its stream again. A Zen 5 guest (2 threads,
    2026-12-07) fitted 0.58-0.97 us a chunk in seven calibrations: the thin toy (toy-thin: 2324 chunks
    a step over 75 MB as Q6_K) had run up to 16-24 % slower than the fit without it, on one thread
    not (benchmarks/cross_scores.py prints both fits)."""
    used = _threads_used(device, n_threads)
    per_chunk = (reference_for(device).get("dram_chunk_s_by_threads") or {}).get(str(used), 0.0)
    if not per_chunk or used <= 1:
        return 0.0  # a stored reference, one thread: no matrix to walk
    stalled = sum(stalled_bytes_by_type(matrices).values())
    return per_chunk * decode_chunks(matrices, used, _simd_of(device)) / stalled if stalled else 0.0


def dram_chunk_s(device: Device, matrices: list[tuple[str, int, int]], n_threads: int | None = None,
                 n_layer: int | None = None) -> float:
    """Seconds a decode step (of ``n_layer`` layers) loses to the chunks its threads start in DRAM:
    the step's bytes that come from DRAM (dram_bytes) x dram_chunk_s_per_byte, so the chunks' share
    that the cache holds costs nothing."""
    per_byte = dram_chunk_s_per_byte(device, matrices, n_threads)
    if not per_byte:
        return 0.0
    stalled = sum(stalled_bytes_by_type(matrices).values())
    return per_byte * min(stalled, dram_bytes(reference_for(device), sum(b for _, b, _ in matrices), stalled, n_layer))


def decode_overhead_s_per_layer(device: Device) -> float:
    """Fixed seconds per transformer block per decode step on the CPU backend: the block's ~20
    small graph nodes (norms, RoPE, attention, activations) and the threads' barrier after each,
    which cost the same in a thin model as in a wide one; fitted with the rates."""
    return reference_for(device)["overhead_s_per_layer"]


def _threads_used(device: Device, n_threads: int | None) -> int:
    cores = device.n_cores or 1
    threads = cores if n_threads is None else n_threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidValueError(f"n_threads must be an integer >= 1, got {n_threads!r}")
    return min(threads, cores)


def prefill_eff_vs_fp32_peak(device: Device, ggml_type: str) -> float:
    """Share of the CPU's fp32 peak that llama.cpp's prompt matmuls reach with ``ggml_type``
    weights (measured per type: each type has its own kernel path, repacked, tinyBLAS or the
    plain dot loop). A reference without per-type figures has one for every type; a type with
    neither a figure nor a stand-in takes the reference's median."""
    ref = reference_for(device)
    by_type = ref.get("prefill_eff_vs_fp32_peak_by_type")
    if not by_type:
        return ref["prefill_eff_vs_fp32_matmul"]  # one figure for every type (the Zen 3 entry)
    try:
        return by_type[resolve_type(by_type, ggml_type, prefill=True)[0]]
    except UnknownNameError:
        return ref["prefill_eff_vs_fp32_matmul"]


def _fp32_peak_flops(device: Device, used: int) -> float:
    """fp32 FLOP/s of ``used`` cores that the prefill shares are relative to: the peak the rates'
    shares were measured against when they come with one (this machine's profile), else the
    device's own figure (calibrated or estimated by detect, or the catalog's)."""
    ref = reference_for(device)
    if ref.get("fp32_peak_tflops") and ref is _ATTACHED.get(device.source):
        return ref["fp32_peak_tflops"] * 1e12 * used / (ref.get("n_cores") or device.n_cores or 1)
    return (device.fp32_tflops or device.fp16_tflops) * 1e12 * used / (device.n_cores or 1)


def cpu_prefill_s(device: Device, flops_by_type: Mapping[str, float], n_threads: int | None = None,
                  layer_tokens: float = 0.0, n_embd: int = 0) -> float:
    """Seconds the CPU's prompt matmuls take for ``flops_by_type`` (2 FLOP per weight per token,
    by the weights' ggml type): each type at its measured share of the fp32 peak of the threads
    used (the cores share the peak evenly; SMT adds nothing); plus, where the rates measured one
    (this machine's calibrated rates), the rest of the graph (norms, RoPE, residual adds, attention,
    quantizing the activations), which works on rows of ``n_embd``: a cost per layer, prompt token
    and channel x ``layer_tokens`` (n_layer x tokens) x ``n_embd``."""
    if not device.is_cpu:
        raise InvalidValueError(f"{device.name!r} is a {device.backend} device; CPU prefill rates apply to cpu devices")
    if layer_tokens and (isinstance(n_embd, bool) or not isinstance(n_embd, int) or n_embd < 1):
        raise InvalidValueError(f"n_embd must be an integer >= 1 when layer_tokens is given, got {n_embd!r}")
    used = _threads_used(device, n_threads)
    peak = _fp32_peak_flops(device, used)
    ref = reference_for(device)
    if "prefill_overhead_s_per_layer_token_channel" in ref:  # measured on every core
        rest = layer_tokens * n_embd * ref["prefill_overhead_s_per_layer_token_channel"]  # layers x tokens x channels x cost
    else:  # a profile calibrated before 2026-12-02 holds one cost per layer and token
        rest = layer_tokens * ref.get("prefill_overhead_s_per_layer_token", 0.0)
    rest *= (ref.get("n_cores") or used) / used  # on `used` of the cores it was measured on
    return sum(f / (prefill_eff_vs_fp32_peak(device, ty) * peak) for ty, f in flops_by_type.items() if f) + rest


def cpu_decode_rate_for_placement(device: Device, placement, n_threads: int | None = None) -> float:
    """``SpeedModel.cpu_decode_rate``'s signature: the limit for the weights a decode step reads,
    with the model's own mix of types (its tensor plan, token_embd left out: a row lookup)."""
    return _rate_for_plan(device, placement.model, placement.scheme, n_threads)


def _weights_by_type(tensors, keep) -> dict[str, float]:
    """Bytes (or FLOPs, by ``keep``) of the matrices a matmul reads, by type. F32 matrices count
    only in a file whose weights are all F32: in a quantized file they are the MoE router and
    such, a few MB that the per-layer overhead was fitted with (the fit leaves F32 out too); 1-D
    norms and biases never count."""
    out: dict[str, float] = {}
    for t in tensors:
        if len(t.shape) > 1 and (w := keep(t)):
            out[t.ggml_type] = out.get(t.ggml_type, 0.0) + w
    if set(out) - {"F32"}:
        out.pop("F32", None)
    return out


def decode_matrices(tensors) -> list[tuple[str, int, int]]:
    """(ggml type, bytes, rows) of every matrix one decode step multiplies, from a tensor table
    (a GGUF's or a plan's): token_embd only when it is the output head too (else a row lookup);
    F32 matrices only in a file whose weights are all F32 (as _weights_by_type); a stacked expert
    tensor counts as one matrix of all its rows (its mul_mat_id splits per expert)."""
    tensors = list(tensors)
    tied = not any(t.name == "output.weight" for t in tensors)
    mats = [(t.ggml_type, t.n_bytes, t.shape[1] if len(t.shape) == 2 else 0) for t in tensors
            if len(t.shape) > 1 and (t.name != "token_embd.weight" or tied)]
    if {ty for ty, _, _ in mats} - {"F32"}:
        mats = [m for m in mats if m[0] != "F32"]
    return mats


def cpu_decode_compute_s(device: Device, matrices: list[tuple[str, int, int]], n_threads: int | None = None,
                         n_layer: int | None = None) -> float:
    """Seconds the CPU's dequantize+dot kernels take for one decode step over ``matrices`` (see
    decode_matrices) of a model of ``n_layer`` layers, the memory limit aside: each type's bytes,
    weighted by how unevenly their rows split over the threads, at its kernel's rate; plus the DRAM
    stall of the bytes past the cache and of the chunks the threads start in DRAM (where the rates
    measured them; n_layer places the step on the cache ramp, ramp_bytes_for)."""
    split = split_bytes_by_type(device, matrices, n_threads)  # bytes x busiest-thread share
    kernels_s = sum(b / cpu_decode_rate_bytes_per_s(device, ty, n_threads) for ty, b in split.items() if b)
    return (kernels_s + dram_stall_s(device, sum(b for _, b, _ in matrices), n_threads, stalled_by_type=stalled_bytes_by_type(matrices),
                                     n_layer=n_layer)
            + dram_chunk_s(device, matrices, n_threads, n_layer))


@lru_cache(maxsize=4096)
def _rate_for_plan(device: Device, model, scheme, n_threads: int | None) -> float:
    from ..quant.plan import tensor_plan

    mats = decode_matrices(tensor_plan(model, scheme))
    total = sum(b for _, b, _ in mats)
    if total <= 0:
        raise InvalidValueError(f"{model.name!r} has no weight matrices to time")
    return total / cpu_decode_compute_s(device, mats, n_threads, model.n_layers)  # bytes over the kernels' seconds


def cpu_prefill_flops_per_s_for_placement(device: Device, placement, n_threads: int | None = None) -> float:
    """``SpeedModel.cpu_prefill_rate``'s signature: FLOP/s of the CPU's prompt matmuls for the
    model's own mix of block weight types (the output head runs for one token only)."""
    return _prefill_rate_for_plan(device, placement.model, placement.scheme, n_threads)


@lru_cache(maxsize=4096)
def _prefill_rate_for_plan(device: Device, model, scheme, n_threads: int | None) -> float:
    from ..quant.plan import tensor_plan

    flops = _weights_by_type(tensor_plan(model, scheme), lambda t: 2.0 * t.n_elements if t.layer is not None else 0)
    if not flops:
        raise InvalidValueError(f"{model.name!r} has no block weights to time")
    return sum(flops.values()) / cpu_prefill_s(device, flops, n_threads, layer_tokens=model.n_layers, n_embd=model.d_model)  # one prompt token

"""Check speed predictions against the real llama.cpp on this machine.

1. Write small llama-architecture GGUF files with the ``gguf`` package (random weights, F16),
   then quantize them with llama.cpp's own quantizer (``llama_model_quantize`` through
   llama-cpp-python) to the presets asked for (Q4_K_M, Q8_0...). They are cached in the user's
   cache directory ($XDG_CACHE_HOME/inferlab/validate or ~/.cache/inferlab/validate).
2. Run them the way ``llama-bench`` does (its defaults: flash attention on, as -fa auto turns it
   on for the CPU): one warm-up run, then ``repetitions`` runs of pp512 (one 512-token batch into
   an empty cache) and tg128 (128 single-token decode steps from an empty cache), the same thread
   count for both; each repetition between two runs of the level probe.
3. Predict the same figures with inferlab's speed model (``perf_model.llama_bench`` when the
   calibrated model is there) and name what limits decode here: memory bandwidth (bytes over
   η x measured bandwidth) or per-core compute (bytes over the dequantize+dot rate of
   cpu_model.py).

Random weights decode as fast as trained ones: llama.cpp's kernels do not look at the values.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import statistics
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import InferlabError, InvalidValueError, MissingDependencyError, NotSupportedError, UnknownNameError
from ..models.spec import ModelSpec, TensorInfo


@dataclass(frozen=True)
class ToyConfig:
    """A llama-architecture model with random weights, big enough to stream from DRAM."""

    name: str
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int = 32000
    n_ctx_train: int = 2048

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(self.name, "llama", self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.head_dim,
                         self.n_ff, self.n_vocab, self.n_ctx_train, source="inferlab validate (random weights)")

    @property
    def n_params(self) -> int:
        return self.spec.total_params()  # untied embeddings + output, as the writer writes them

    def decode_matrix_rows(self) -> tuple[int, ...]:
        """Rows of each matrix a decode step multiplies, as the writer lays the toy out: per layer
        attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down; then the (untied) output head."""
        kv = self.n_head_kv * self.head_dim
        return (self.n_embd, kv, kv, self.n_embd, self.n_ff, self.n_ff, self.n_embd) * self.n_layer + (self.n_vocab,)

    @property
    def key(self) -> str:
        return hashlib.sha1(repr(self).encode()).hexdigest()[:10]


# Sizes of the models validate writes. Row lengths (n_embd, n_ff) are multiples of 256 so every
# K-quant applies without fallbacks; head_dim 64; 4 KV heads (GQA), as small Llama-family models.
TOY_MODELS: dict[str, ToyConfig] = {
    "toy-125m": ToyConfig("toy-125m", n_embd=768, n_layer=12, n_ff=2048, n_head=12, n_head_kv=4),
    "toy-200m": ToyConfig("toy-200m", n_embd=1024, n_layer=12, n_ff=2816, n_head=16, n_head_kv=4),
    "toy-290m": ToyConfig("toy-290m", n_embd=1024, n_layer=20, n_ff=2816, n_head=16, n_head_kv=4),
    # SmolLM2-135M's shape (thin and deep, a large vocabulary): its rows of 576 take only the
    # 32-weight block types (Q4_0, Q4_1, Q8_0, F16); K-quants would fall back per tensor
    "toy-smol": ToyConfig("toy-smol", n_embd=576, n_layer=30, n_ff=1536, n_head=9, n_head_kv=3, n_vocab=49152),
    # `calibrate --engine llama.cpp` fits on these two: thin and deep (d 512, 24 layers) and wide
    # and shallow (d 1024, 6 layers), rows every K-quant takes, so the per-layer cost is told apart
    # from the bytes, and prefill's kernels are seen at both ends of the widths of small models
    "toy-thin": ToyConfig("toy-thin", n_embd=512, n_layer=24, n_ff=1536, n_head=8, n_head_kv=4),
    "toy-wide": ToyConfig("toy-wide", n_embd=1024, n_layer=6, n_ff=4096, n_head=16, n_head_kv=4),
    # wide and ~30x the L3 cache of a desktop or server CPU as F32 (1.04 GB a step): calibrate's
    # memory-bound decode runs, for the bandwidth llama.cpp's decode reaches
    "toy-stream": ToyConfig("toy-stream", n_embd=1024, n_layer=15, n_ff=4096, n_head=16, n_head_kv=4),
    # small enough for any last-level cache of note as F16 (34 MB; 18 MB as Q8_0, 9 MB as Q4_0; 4 layers
    # of toy-thin's width, a vocabulary of 8192): calibrate's run of each type with all its bytes in the
    # cache, beside its toy-stream run past it, so the type's own DRAM stall is told from its kernel's
    # rate (calibrate.fit_decode). toy-thin is 98 MB as Q8_0, already 0.74 past the cache of an Intel
    # Xeon guest at 2 threads (2026-12-06), where Q8_0's stall could not be told apart
    "toy-mini": ToyConfig("toy-mini", n_embd=512, n_layer=4, n_ff=1536, n_head=8, n_head_kv=4, n_vocab=8192),
    # toy-wide at other depths: calibrate's cache ladder (KNEE_MODELS)
    **{f"toy-wide-{n}": ToyConfig(f"toy-wide-{n}", n_embd=1024, n_layer=n, n_ff=4096, n_head=16, n_head_kv=4) for n in (2, 4, 8, 10, 12, 18, 24)},
}
# F32: the fewest instructions per byte of any type (one FMA per 4 bytes), so the step waits on
# memory, not on the dequantize+dot kernel. Q8_0 was used before and is compute-bound on a fast
# core: on this Zen 5 VM (2 threads) toy-stream Q8_0 streamed 32 GB/s while toy-wide F32 streamed
# 59 GB/s (2026-12-01), so the bandwidth limit came out 1.8x too low and small models that
# llama.cpp runs at its kernels' rate were predicted bandwidth-bound and too slow (toy-125m
# Q4_K_M -21 %)
STREAM_MODEL, STREAM_TYPES = "toy-stream", ("F32",)
CACHE_MODEL = "toy-mini"  # calibrate's in-cache run of the types it also times on toy-stream (calibrate.STALL_TYPES)
# `inferlab calibrate --engine llama.cpp` fits this machine's rates on these two shapes (and its
# decode bandwidth share on toy-stream) only; toy-125m, toy-smol, toy-200m, toy-290m and the real
# SmolLM2-135M file are held out for validation.
FIT_MODELS = ("toy-thin", "toy-wide")
# the cache ladder: decode of one type (KNEE_TYPE) on toy-wide's width at 2 ... 24 layers, 35 ... 224 MB as
# Q4_K (with toy-wide and toy-stream, nine sizes): where its seconds per byte step up is the size past
# which a decode step's weights come from DRAM on this machine, measured with llama.cpp itself. The
# cache lscpu names is not that size in a VM: an Intel Xeon guest (2 vCPUs, 2026-12-05) reads the
# host socket's 480 MiB L3, yet Q4_0 decode at 2 threads streams 23.0 GB/s at 70 MB (toy-wide) and
# 10.8 GB/s at 147 MB (toy-stream); numpy's read sweep steps down near 200 MiB, llama.cpp's earlier
KNEE_MODELS = tuple(sorted(("toy-wide", "toy-stream", *(k for k in TOY_MODELS if k.startswith("toy-wide-"))), key=lambda k: TOY_MODELS[k].n_layer))
KNEE_TYPE = "Q4_K"

# llama_ftype values (llama.h) of the presets validate can make; "pure" variants put every
# tensor in one type (llama-quantize --pure), which the CPU rate measurements use.
FTYPES = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12,
          "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ3_S": 26, "IQ4_XS": 30,
          "BF16": 32, "TQ1_0": 36, "TQ2_0": 37, "MXFP4_MOE": 38}


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "inferlab", "validate")


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependencyError("llama-cpp-python", "validating against llama.cpp", extra="engine") from None
    return llama_cpp


def write_f16_gguf(cfg: ToyConfig, path: str, seed: int = 0) -> str:
    """Write ``cfg`` as a llama GGUF with N(0, 0.02) F16 weights and F32 norms, with the tokenizer
    llama.cpp needs to load it (models.gguf_writer)."""
    from ..models.gguf_writer import write_gguf

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return str(write_gguf(cfg.spec, path, "F16", seed))


@contextlib.contextmanager
def _quiet_fds():
    """Send the C library's stdout/stderr to a temporary file; yields a list that holds its text afterwards."""
    import sys
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    said: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            said.append(sink.read().decode(errors="replace"))


def quantize(src: str, dst: str, preset: str, *, pure: bool = False, n_threads: int | None = None) -> str:
    """Quantize with llama.cpp's own llama_model_quantize (what llama-quantize runs)."""
    if preset not in FTYPES:
        raise UnknownNameError("quantization preset", preset, FTYPES)
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[preset]
    params.nthread = n_threads or (os.cpu_count() or 1)
    params.pure = pure
    tmp = dst + ".part"
    from ..fileio import interruptible

    try:
        with _quiet_fds() as said:  # llama.cpp logs every tensor to stderr
            rc = interruptible(llama_cpp.llama_model_quantize, src.encode(), tmp.encode(), ctypes.byref(params))  # Ctrl-C stays live
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if rc != 0:
        last = [ln for ln in "".join(said).splitlines() if ln.strip()][-3:]
        raise NotSupportedError(f"llama_model_quantize({preset}) failed with code {rc} on {src}: {' | '.join(last)}")
    os.replace(tmp, dst)
    return dst


# ggml types llama.cpp's quantizer makes only with an importance matrix (which llama-cpp-python
# cannot pass): the toy gets random blocks of the type written directly ("raw:" presets).
RAW_TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS")


def write_random_blocks(src: str, dst: str, ggml_type: str, seed: int = 0) -> str:
    """A copy of the F16 GGUF ``src`` (metadata, norms) whose 2-D weights are random blocks of
    ``ggml_type`` (one of RAW_TYPES): random codebook indices and signs, and a block scale of
    2^-7 so the activations stay finite. llama.cpp's dequantize+dot kernels do the same work
    whatever the indices, so the file times like a quantized one (it computes nothing useful)."""
    if ggml_type not in RAW_TYPES:
        raise UnknownNameError("ggml type written as random blocks", ggml_type, RAW_TYPES)
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        writer.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    qtype = gguf.GGMLQuantizationType[ggml_type]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    scale = np.frombuffer(np.float16(2**-7).tobytes(), dtype=np.uint8)
    for t in reader.tensors:
        if len(t.shape) >= 2 and t.tensor_type == gguf.GGMLQuantizationType.F16:
            rows = int(np.prod([int(x) for x in t.shape[1:]]))
            data = rng.integers(0, 256, size=(rows, int(t.shape[0]) // block, size), dtype=np.uint8)
            if ggml_type == "IQ1_M":  # no d: the fp16 block scale is the top nibbles of its 4 u16 scales (ggml-common.h)
                words = data[:, :, size - 8:].view(np.uint16)
                words &= 0x0FFF
                words[:, :, 3] |= 0x2000  # 0x2000 = 2^-7
            else:  # block_iq2_xxs/xs/s, iq3_xxs, iq1_s: ggml_half d first
                data[:, :, 0:2] = scale
            writer.add_tensor(t.name, data.reshape(rows, -1), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def toy_model(name: str, preset: str, *, pure: bool = False, directory: str | None = None) -> str:
    """Path of the toy model ``name`` quantized to ``preset`` (written and cached on first use)."""
    if name not in TOY_MODELS:
        raise UnknownNameError("toy model", name, TOY_MODELS)
    if preset not in FTYPES and preset.removeprefix("raw:") not in RAW_TYPES:
        raise UnknownNameError("quantization preset", preset, list(FTYPES) + [f"raw:{t}" for t in RAW_TYPES])
    cfg = TOY_MODELS[name]
    directory = directory or cache_dir()
    f16 = os.path.join(directory, f"{cfg.name}-{cfg.key}-F16.gguf")
    out = f16 if preset == "F16" else os.path.join(directory, f"{cfg.name}-{cfg.key}-{preset}{'-pure' if pure else ''}.gguf")
    try:
        if not os.path.exists(f16):
            try:
                write_f16_gguf(cfg, f16 + ".part")
                os.replace(f16 + ".part", f16)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(f16 + ".part")  # nothing half-written stays behind
        if not os.path.exists(out):
            try:
                if preset.startswith("raw:"):
                    write_random_blocks(f16, out + ".part", preset[4:])
                    os.replace(out + ".part", out)
                else:
                    quantize(f16, out, preset, pure=pure)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(out + ".part")
    except OSError as exc:
        from ..errors import ConfigError

        raise ConfigError(f"cannot write the toy models in {directory} ({exc.strerror or exc}); "
                          "set XDG_CACHE_HOME to a writable folder with a few GB free") from None
    return out


# ---------------------------------------------------------------- the llama-bench method

@dataclass(frozen=True)
class BenchResult:
    model_path: str
    n_threads: int
    n_prompt: int
    n_gen: int
    pp_tok_s: tuple[float, ...]  # one per repetition, wall clock
    tg_tok_s: tuple[float, ...]
    # tokens per CPU-second of the calling thread: with n_threads = 1 llama.cpp computes on
    # that thread, so this is the rate a core reaches undisturbed by other processes
    tg_cpu_tok_s: tuple[float, ...] = ()
    # the level probe (a model the rates were fitted on) timed around each repetition, the mean of
    # its run before and its run after, on the same clock as the repetition (llama_bench's probe)
    pp_probe_tok_s: tuple[float, ...] = ()
    tg_probe_tok_s: tuple[float, ...] = ()
    probe_path: str = ""
    # the state probes (STATE_PROBES) timed around each decode repetition as the level probe
    # is, one tuple of speeds per probe (its mean before and after each repetition), same clock
    tg_state_probe_tok_s: tuple[tuple[float, ...], ...] = ()
    state_probe_paths: tuple[str, ...] = ()

    @property
    def pp(self) -> float:
        return statistics.median(self.pp_tok_s) if self.pp_tok_s else float("nan")

    @property
    def tg(self) -> float:
        return statistics.median(self.tg_tok_s) if self.tg_tok_s else float("nan")

    @property
    def tg_cpu(self) -> float | None:
        """Median tokens per CPU-second (1 thread only): tg as an otherwise idle core would run it."""
        return statistics.median(self.tg_cpu_tok_s) if self.tg_cpu_tok_s else None

    def best(self, metric: str) -> float:
        """The fastest repetition of "tg" or "pp" (tg at 1 thread: per CPU-second of the computing
        thread): what the machine does undisturbed; other work only slows repetitions down."""
        s = self.samples(metric)
        return max(s) if s else float("nan")

    def samples(self, metric: str) -> tuple[float, ...]:
        if metric == "pp":
            return self.pp_tok_s
        return self.tg_cpu_tok_s or self.tg_tok_s

    def probe_samples(self, metric: str) -> tuple[float, ...]:
        return self.pp_probe_tok_s if metric == "pp" else self.tg_probe_tok_s

    def _pairs(self, metric: str) -> list[tuple[float, float]]:
        s, p = self.samples(metric), self.probe_samples(metric)
        return list(zip(s, p)) if p and len(p) == len(s) else []

    def at_level(self, metric: str, probe_floor: float) -> int:
        """How many repetitions ran while the probe around them reached ``probe_floor`` tok/s."""
        return sum(b >= probe_floor for _, b in self._pairs(metric))

    def relative(self, metric: str) -> float | None:
        """Median over the repetitions of this model's speed / the probe's around it (None without a
        probe): what a row is scored on (ValidationRow.matched_error)."""
        pairs = self._pairs(metric)
        return statistics.median(a / b for a, b in pairs) if pairs else None

    def disagreement(self, metric: str) -> float:
        """(fastest - second fastest) / fastest repetition: how far apart the repetitions are."""
        top = sorted(self.samples(metric), reverse=True)
        return (top[0] - top[1]) / top[0] if len(top) > 1 and top[0] else 0.0

    def state_probe_samples(self) -> list[tuple[float, ...]]:
        """Per decode repetition: the level probe's speed and each state probe's around it (empty
        unless every probe ran around every repetition)."""
        s, p, st = self.samples("tg"), self.tg_probe_tok_s, self.tg_state_probe_tok_s
        if not st or len(p) != len(s) or any(len(x) != len(s) for x in st):
            return []
        return [(p[i], *(x[i] for x in st)) for i in range(len(s))]

    def merged(self, other: "BenchResult") -> "BenchResult":
        """The repetitions of both runs of the same test (another round, minutes later) as one."""
        if (self.model_path, self.n_threads, self.n_prompt, self.n_gen, self.probe_path, self.state_probe_paths) != \
                (other.model_path, other.n_threads, other.n_prompt, other.n_gen, other.probe_path, other.state_probe_paths):
            raise InvalidValueError(f"cannot merge runs of different tests: {self.model_path} and {other.model_path}")
        state = tuple(a + b for a, b in zip(self.tg_state_probe_tok_s, other.tg_state_probe_tok_s)) \
            if len(self.tg_state_probe_tok_s) == len(other.tg_state_probe_tok_s) else ()
        return BenchResult(self.model_path, self.n_threads, self.n_prompt, self.n_gen, self.pp_tok_s + other.pp_tok_s,
                           self.tg_tok_s + other.tg_tok_s, self.tg_cpu_tok_s + other.tg_cpu_tok_s,
                           self.pp_probe_tok_s + other.pp_probe_tok_s, self.tg_probe_tok_s + other.tg_probe_tok_s, self.probe_path,
                           state, self.state_probe_paths)


def _clear_memory(llama_cpp, ctx) -> None:
    """Empty the KV cache (the name changed across llama.cpp versions)."""
    if hasattr(llama_cpp, "llama_memory_clear") and hasattr(llama_cpp, "llama_get_memory"):
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    elif hasattr(llama_cpp, "llama_kv_self_clear"):
        llama_cpp.llama_kv_self_clear(ctx)
    else:
        llama_cpp.llama_kv_cache_clear(ctx)


# the shortest repetition llama_bench times: shorter tests (a model in the cache, a short prompt) run
# again within one repetition. toy-mini's tg64 (9 MB as Q4_0) lasts ~20 ms at 2 threads on a Zen 5
# guest, and in a calibration there (2026-12-07 05:15 UTC) its repetitions' ratios to the probe
# scattered 11 % (coefficient of variation, median over its 8 types) where toy-thin's and toy-wide's,
# 100-400 ms a run, scattered 5 %
MIN_REPETITION_S = 0.05


def llama_bench(model_path: str, n_threads: int, n_prompt: int = 512, n_gen: int = 128, repetitions: int = 5,
                seed: int = 0, probe: str | None = None, flash_attn: bool = True, state_probes: tuple[str, ...] = (),
                min_repetition_s: float = MIN_REPETITION_S) -> BenchResult:
    """pp``n_prompt`` and tg``n_gen`` as llama-bench measures them, through llama-cpp-python.

    pp: one batch of n_prompt random tokens into an empty cache; tg: n_gen decode steps of one
    token each, from an empty cache; each in its own context of n_prompt (n_gen) cells, as
    llama-bench makes them. One warm-up of each first.

    ``probe``: a second GGUF (level_probe(): a model the rates were fitted on), loaded beside and
    run once before the first repetition and after every one, the same test on the same clock;
    each repetition keeps the mean of the probe's runs around it. A shared VM changes speed by a
    fifth within seconds (toy-wide Q4_K decode 469-596 tok/s in one minute, 2026-12-01), and a
    model and its probe timed a second apart usually see the same level.
    ``flash_attn``: on, as llama-bench's default (-fa auto) runs the CPU; off, as the stored
    reference CPUs of data/cpu_limits.json were measured ("flash_attention": false).
    ``state_probes``: more GGUFs timed around every decode repetition as the probe is (decode only;
    validate's STATE_PROBES: where the cache this moment ends, ValidationRow.machine_states).
    ``min_repetition_s``: a repetition (of the model or of a probe) runs its test again, each time
    from an empty cache, until it has lasted this long, and its speed is all its tokens over all its
    seconds (MIN_REPETITION_S; 0: one run each, as llama-bench).
    """
    for name, v in (("n_threads", n_threads), ("repetitions", repetitions)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidValueError(f"{name} must be an integer >= 1, got {v!r}")
    if n_prompt < 0 or n_gen < 0 or n_prompt + n_gen == 0:
        raise InvalidValueError(f"n_prompt and n_gen must be >= 0 and not both 0, got {n_prompt}, {n_gen}")
    if isinstance(min_repetition_s, bool) or not isinstance(min_repetition_s, (int, float)) or not 0 <= min_repetition_s <= 60:
        raise InvalidValueError(f"min_repetition_s must be a number of seconds from 0 to 60, got {min_repetition_s!r}")
    llama_cpp = _llama_cpp()
    import random

    rnd = random.Random(seed)
    use_cpu_clock = n_threads == 1  # then llama.cpp computes on this thread: its CPU time is the step's

    def context(path: str, n_ctx: int):
        # llama-bench makes one context per test, n_ctx = n_prompt + n_gen of that test, and a
        # 512-token micro-batch: a decode step then attends over a cache of n_gen cells, as here.
        # Flash attention: llama-bench's default is -fa auto (llama-bench.cpp cmd_params_defaults),
        # which the CPU backend turns on; llama-cpp-python's Llama defaults to off, and off, thin
        # models decode 14-19 % slower here (toy-smol Q4_0 204 vs 232 tok/s, 1 thread, 2026-12-01)
        return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=min(n_ctx, 512), n_ubatch=min(n_ctx, 512),
                               n_threads=n_threads, n_threads_batch=n_threads, n_gpu_layers=0, verbose=False, use_mmap=True,
                               flash_attn=flash_attn)

    def runner(llm, path: str, what: str):
        ctx = llm._ctx.ctx
        n_vocab = llm.n_vocab()

        def decode(tokens: list[int]) -> None:
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(tokens)))
            if rc != 0:
                raise NotSupportedError(f"llama_decode returned {rc} on {path}")

        def pp_once() -> tuple[int, float, float]:  # the whole prompt as one batch into an empty cache
            _clear_memory(llama_cpp, ctx)
            toks = [rnd.randrange(n_vocab) for _ in range(n_prompt)]
            t0 = time.perf_counter()
            decode(toks)
            llama_cpp.llama_synchronize(ctx)
            wall = time.perf_counter() - t0
            return n_prompt, wall, wall

        def tg_once(n: int) -> tuple[int, float, float]:  # n single-token steps from an empty cache
            _clear_memory(llama_cpp, ctx)
            tok = rnd.randrange(n_vocab)
            c0, t0 = time.thread_time(), time.perf_counter()
            for _ in range(n):
                decode([tok])
                tok = rnd.randrange(n_vocab)
            llama_cpp.llama_synchronize(ctx)
            t1, c1 = time.perf_counter(), time.thread_time()
            return n, t1 - t0, c1 - c0

        def repetition(once) -> tuple[float, float]:
            # (tokens per wall second, per CPU-second of this thread) over runs until min_repetition_s has
            # passed: toy-mini's tg64 lasts 21 ms at 2 threads on the Zen 5 guest (2026-12-07), a
            # spell of a few ms moves one such run by a tenth, and calibrate fits each type's in-cache
            # rate on it
            n = wall = cpu = 0.0
            while True:
                k, w, c = once()
                n, wall, cpu = n + k, wall + w, cpu + c
                if wall >= min_repetition_s:
                    return n / wall, n / max(cpu, 1e-9)

        def pp_run() -> tuple[float, float]:
            return repetition(pp_once)

        def tg_run(n: int = n_gen) -> tuple[float, float]:
            return repetition(lambda: tg_once(n))

        return pp_run if what == "pp" else tg_run

    def measure(what: str, n_ctx: int) -> tuple[list[tuple[float, float]], list[float], list[list[float]]]:
        llms = []
        try:
            llms.append(context(model_path, n_ctx))
            run = runner(llms[0], model_path, what)
            p_run = None
            if probe:
                llms.append(context(probe, n_ctx))
                p_run = runner(llms[1], probe, what)
            s_runs = []
            for sp in (state_probes if what == "tg" and probe else ()):
                llms.append(context(sp, n_ctx))
                s_runs.append(runner(llms[-1], sp, what))
            warm = (lambda f: f(min(n_gen, 16))) if what == "tg" else (lambda f: f())
            for f in (run, *((p_run,) if p_run else ()), *s_runs):
                warm(f)  # warm-up
            clock = 1 if (what == "tg" and use_cpu_clock) else 0
            got, around = [], []
            s_around: list[list[float]] = [[] for _ in s_runs]
            before = p_run()[clock] if p_run else 0.0
            s_before = [f()[clock] for f in s_runs]
            for _ in range(repetitions):
                got.append(run())
                if p_run:
                    after = p_run()[clock]
                    around.append((before + after) / 2)  # the probe's level around this repetition
                    before = after
                for j, f in enumerate(s_runs):
                    after = f()[clock]
                    s_around[j].append((s_before[j] + after) / 2)
                    s_before[j] = after
            return got, around, s_around
        finally:
            for llm in llms:
                llm.close() if hasattr(llm, "close") else None

    pp: list[tuple[float, float]] = []
    tg: list[tuple[float, float]] = []
    pp_probe: list[float] = []
    tg_probe: list[float] = []
    tg_state: list[list[float]] = []
    if n_prompt:
        pp, pp_probe, _ = measure("pp", n_prompt)
    if n_gen:
        tg, tg_probe, tg_state = measure("tg", n_gen)
    return BenchResult(model_path, n_threads, n_prompt, n_gen, tuple(w for w, _ in pp), tuple(w for w, _ in tg),
                       tuple(c for _, c in tg) if use_cpu_clock else (), tuple(pp_probe), tuple(tg_probe), probe or "",
                       tuple(tuple(x) for x in tg_state), tuple(state_probes) if probe and n_gen else ())


def physical_cores() -> int:
    from .probes.cpu import probe_cpu, usable_cpus

    cpu, _ = probe_cpu()
    return (cpu.physical_cores if cpu and cpu.physical_cores else None) or usable_cpus() or 1


def _tensors(spec: ModelSpec) -> tuple[TensorInfo, ...]:
    """The spec's tensor table (a GGUF's); a catalog spec has none to count."""
    if spec.tensors is None:
        raise InvalidValueError(f"{spec.name}: no tensor table (a catalog spec, not a GGUF file's); pass a model read from a GGUF")
    return spec.tensors


def decode_bytes_by_type(model_path: str) -> dict[str, int]:
    """Weight bytes one decode step reads, by ggml type, from the GGUF's tensor table: every
    tensor once, except token_embd (a row lookup: one row) unless the output head is tied to it."""
    from ..models.gguf_reader import model_from_gguf

    tensors = _tensors(model_from_gguf(model_path))
    tied = not any(t.name == "output.weight" for t in tensors)
    out: dict[str, int] = {}
    for t in tensors:
        n = t.n_bytes
        if t.name == "token_embd.weight" and not tied:
            n = t.n_bytes // t.shape[-1] if len(t.shape) > 1 else n  # one row of n_vocab
        out[t.ggml_type] = out.get(t.ggml_type, 0) + n
    return out


# ---------------------------------------------------------------- measured vs predicted

DISAGREE_TOL = 0.10  # a row whose two fastest repetitions differ by more is flagged, not scored
FAST_LEVEL = 0.9  # a repetition ran at the calibrated level when the probe around it reached 90 % of its reference speed
AT_LEVEL_MIN = 3  # validate repeats a row (2 repetitions at a time) until this many ran at level

@dataclass(frozen=True)
class DecodeLimits:
    """inferlab's own decode breakdown for one model on one CPU (seconds per token)."""

    memory_s: float  # weight bytes / (η x measured read bandwidth)
    compute_s: float  # sum over types of bytes_t / (dequantize+dot rate_t x threads)
    overhead_s: float  # n_layer x fixed seconds per block
    eta: float
    bandwidth_gbs: float

    @property
    def tok_s(self) -> float:
        return 1.0 / (max(self.memory_s, self.compute_s) + self.overhead_s)

    @property
    def dominant(self) -> str:
        return "bandwidth" if self.memory_s >= self.compute_s else "per-core compute"


@dataclass(frozen=True)
class DecodeParts:
    """A decode step's time cut into what a machine's state moves apart (seconds per token at the
    calibrated level): the kernels and the per-layer overhead, which a slower share of the core
    stretches alike; the DRAM stall, which depends on where the cache this moment ends (the ramp's
    sizes scaled) and on the DRAM's own speed; the bandwidth floor."""

    kernels_s: float  # dequantize+dot of every matrix at its kernel's rate (decode_limits' compute_s less the stall)
    overhead_s: float  # n_layer x the per-layer seconds
    memory_s: float  # bytes / (η x bandwidth)
    stall_s_per_byte: float  # the rates' DRAM stall per byte past the cache
    stalled_bytes: float  # the bytes that stall once past the cache (F32 left out)
    total_bytes: float  # the step's weight bytes, which place it on the ramp
    ramp_bytes: tuple[float, float]  # calibrate's cache ramp, as this step's depth meets it (cpu_model.ramp_bytes_for)

    def seconds(self, slowdown: Any = 1.0, cache_scale: Any = 1.0, stall_scale: Any = 1.0, floor: bool = True) -> Any:
        """Seconds per token with the kernels and overhead ``slowdown`` x slower, the cache ramp at
        ``cache_scale`` x its calibrated sizes and the stall per byte ``stall_scale`` x; numpy arrays
        broadcast (machine_state's grid). ``floor``: the bandwidth limit bounds the step, as the
        model predicts it (machine_state fits without it, see there)."""
        import numpy as np

        lo, hi = self.ramp_bytes
        share = np.clip((self.total_bytes - lo * cache_scale) / ((hi - lo) * cache_scale), 0.0, 1.0)  # cpu_model.dram_share, scaled
        stall = share * self.stalled_bytes * self.stall_s_per_byte * stall_scale  # DRAM bytes x stall per byte
        work = self.kernels_s * slowdown + stall
        return (np.maximum(self.memory_s, work) if floor else work) + self.overhead_s * slowdown


def decode_parts(path: str, machine, n_threads: int) -> DecodeParts | None:
    """DecodeParts of one GGUF with ``machine``'s rates; None where the rates hold no cache ramp."""
    from ..models.gguf_reader import model_from_gguf
    from ..perf.cpu_model import (decode_matrices, dram_chunk_s_per_byte, dram_stall_s, dram_stall_s_per_byte, ramp_bytes_for, reference_for,
                                  stalled_bytes_by_type)

    spec = model_from_gguf(path)
    mats = decode_matrices(_tensors(spec))
    total = float(sum(b for _, b, _ in mats))
    ramp = ramp_bytes_for(reference_for(machine.ram), total, spec.n_layers)  # the ramp this step's depth meets
    by_type = stalled_bytes_by_type(mats)
    per_byte = dram_stall_s_per_byte(machine.ram, n_threads, by_type)  # each type's own stall, by its bytes
    if not ramp or not per_byte:
        return None
    _, _, limits, _ = _predict(path, machine, n_threads, 0)
    stall_s = dram_stall_s(machine.ram, total, n_threads, stalled_by_type=by_type, n_layer=spec.n_layers)
    # the chunks started in DRAM (cpu_model.dram_chunk_s) go with the DRAM bytes' share too: a stall per stalled byte
    chunk_per_byte = dram_chunk_s_per_byte(machine.ram, mats, n_threads)
    chunk_s = stall_s / per_byte * chunk_per_byte  # the step's DRAM bytes x that per byte
    return DecodeParts(limits.compute_s - stall_s - chunk_s, limits.overhead_s, limits.memory_s, per_byte + chunk_per_byte,
                       float(sum(by_type.values())), total, ramp)


# The machine's state as validate runs, beside the level probe (toy-wide, 6 layers, 70 MB as Q4_K):
# toy-wide's width at 2 layers (35 MB: in the cache down to 0.46x the ramp), 10 (104 MB, on the Xeon
# guest's ramp) and 24 (224 MB, past the cache at any scale up to ~1.5), pure Q4_K as calibrate's
# ladder ran them, so their calibrate speeds are in the profile. Four speeds, three unknowns: how much
# slower the kernels and the per-layer overhead run (toy-wide-2, and the level probe while the cache
# holds it), where the cache ends (toy-wide-10 against the others) and the DRAM stall (toy-wide-24).
# A guest's share of a host's L3 moves with its neighbours (2026-12-05, 2 threads: toy-wide-10 decoded
# 180-186 tok/s at 20:20 UTC against 207 at calibrate while toy-wide-8, 87 MB, kept 281): the level
# probe alone cannot tell a slower core from less cache. With two probes a slower core and a smaller cache fit
# the same two speeds (level 1, cache 0.6 and level 0.64, cache 1.07); with toy-wide-10 and -24 both
# past a shrunken cache, their kernels and their stall both grow with their bytes, so the slowdown and
# the stall trade off along a line (1.11x kernels and 0.86x stall fit a cache at 0.6x within 0.1 %):
# toy-wide-2, in the cache at any such scale, pins the slowdown. It is not at every scale: on the
# same guest a day later (2026-12-06 noon) calibrate's ramp began at 48 MB and validate found it at
# 0.56-0.62x (27-30 MB), toy-wide-2 on it, and the fit slid to the grid's edge again (kernels 0.5x,
# stall 1.64x) on 7 of 18 repetitions of two rows, where toy-wide-2 itself ran at 0.85-1.02 of its
# calibrate speed; toy-mini Q4_0 (9.4 MB, calibrate's in-cache run of Q4_0, 4 layers: a third of its
# step is per-layer overhead) stays in the cache down to 0.2x and pins it there.
# (model, ggml type) of each, pure as calibrate ran them
STATE_PROBES = (("toy-mini", "Q4_0"), ("toy-wide-2", "Q4_K"), ("toy-wide-10", "Q4_K"), ("toy-wide-24", "Q4_K"))
_PURE_PRESETS = {"Q4_0": "Q4_0", "Q4_K": "Q4_K_S"}  # the presets that write a toy's every matrix in the type (--pure), as calibrate
STATE_SLOWDOWNS = (0.5, 3.0)  # the grid machine_state searches: kernels x slower (a level of 2 ... 0.33)
STATE_CACHE_SCALES = (0.3, 2.0)  # the ramp's sizes x
STATE_STALL_SCALES = (0.25, 4.0)  # the stall per byte x
STATE_PRIOR = 1e-4  # weight of (log θ)² per unknown: ties (a cache past every probe) go to calibrate's state


@lru_cache(maxsize=1024)  # a row asks for its states several times (the JSON, the table, the score)
def machine_state(parts: tuple[DecodeParts, ...], reference_tok_s: tuple[float, ...], measured_tok_s: tuple[float, ...]
                  ) -> tuple[float, float, float, float]:
    """(slowdown, cache scale, stall scale, rms log residual) that carry the probes' ``parts`` from
    their speeds at calibrate (``reference_tok_s``) to ``measured_tok_s``: each probe's predicted
    seconds at the state over those at calibrate's state = its seconds here over its seconds at
    calibrate (the fit's residual on a probe cancels), least squares in log seconds over a grid.
    Without the bandwidth floor: a probe the model puts at its floor would fit any faster kernels
    alike, and the slowdown would slide along the line it trades with the stall (the Xeon guest,
    2026-12-06: toy-wide-2's kernels at 1.21 ms a token under its 1.29 ms floor, and the fit put
    every repetition at the grid's edge, 0.5x kernels and 1.6x stall; without it, 0.93-1.05x and
    1.0-1.16x)."""
    import numpy as np

    x = np.geomspace(*STATE_SLOWDOWNS, 73)[:, None, None]
    k = np.geomspace(*STATE_CACHE_SCALES, 71)[None, :, None]
    g = np.geomspace(*STATE_STALL_SCALES, 57)[None, None, :]
    loss = STATE_PRIOR * (np.log(x) ** 2 + np.log(k) ** 2 + np.log(g) ** 2)
    for p, ref, got in zip(parts, reference_tok_s, measured_tok_s):
        target = float(p.seconds(floor=False)) * ref / got  # seconds the model must give this probe here
        loss = loss + (np.log(p.seconds(x, k, g, floor=False)) - np.log(target)) ** 2
    i, j, m = np.unravel_index(int(np.argmin(loss)), loss.shape)
    resid = float(np.sqrt(max(0.0, float(loss[i, j, m]) - STATE_PRIOR * float(np.log(x[i, 0, 0]) ** 2 + np.log(k[0, j, 0]) ** 2
                                                                                     + np.log(g[0, 0, m]) ** 2)) / max(len(parts), 1)))
    return float(x[i, 0, 0]), float(k[0, j, 0]), float(g[0, 0, m]), resid


@dataclass(frozen=True)
class ValidationRow:
    model: str
    preset: str
    n_params: int
    decode_bytes: int  # weight bytes read per decoded token
    n_threads: int
    measured: BenchResult
    limits: DecodeLimits  # inferlab's CPU decode model: η·β against the measured per-core rates
    predicted_pp: float | None  # prefill: 2 FLOP per weight at the CPU's prefill efficiency
    perf_model_pp: float | None = None  # perf_model.llama_bench (the calibrated speed model), when it answers
    perf_model_tg: float | None = None
    perf_model_note: str = ""  # why perf_model gave no figures
    rates: str = ""  # which CPU rates the prediction used (the machine profile's id and date, or a reference)
    disagree_tol: float = DISAGREE_TOL
    # the level probe's (measured.probe_path) speed at the calibrated level, same lengths and threads:
    # what it ran at calibrate (probe_reference), or its prediction when the rates have no such figure
    probe_reference_pp: float | None = None
    probe_reference_tg: float | None = None
    # where calibrate's cache ladder saw decode's weights leave the cache (the rates' dram_ramp_bytes, as
    # this model's depth meets it: cpu_model.ramp_bytes_for)
    cache_ramp_bytes: tuple[float, float] | None = None
    # the machine's state (machine_state): this row's decode parts, the probes' (the level probe's
    # first, then STATE_PROBES') and their decode speeds at calibrate, same threads
    decode_parts: DecodeParts | None = None
    state_probe_parts: tuple[DecodeParts, ...] = ()
    state_probe_reference_tg: tuple[float, ...] = ()

    @property
    def predicted_tg(self) -> float:
        return self.limits.tok_s

    def predicted(self, metric: str) -> float | None:
        return self.predicted_tg if metric == "tg" else self.predicted_pp

    def probe_reference(self, metric: str) -> float | None:
        return self.probe_reference_tg if metric == "tg" else self.probe_reference_pp

    def level_floor(self, metric: str) -> float | None:
        """The probe speed a repetition's probe must reach to count as at the calibrated level."""
        ref = self.probe_reference(metric)
        return FAST_LEVEL * ref if ref else None

    def level(self, metric: str) -> float | None:
        """How fast the machine ran this row against calibrate: the probe's measured speed around the
        repetitions (median) over its speed at the calibrated level; None without a probe."""
        probe = self.measured.probe_samples(metric)
        ref = self.probe_reference(metric)
        return statistics.median(probe) / ref if probe and ref else None

    def matched_error(self, metric: str) -> float | None:
        """The prediction against this row's speed relative to the level probe timed around each of its
        repetitions: predicted / (the probe's speed at the calibrated level x the median over the
        repetitions of this model's speed / the probe's around it) - 1. Calibrate's figures stand at
        the probe's level_tok_s (calibrate.llama_cpp_reference), so a spell that slows the whole machine
        here, or a calibration that ran slow throughout (its probe too), cancels out. Chosen over
        keeping only the repetitions whose probe reached FAST_LEVEL (session 8's rule: 25, 22, 22 of 26
        within 15 % on its three full runs, where this ratio gives 26, 25, 25; median 3.8-5.2 %) and over
        the fastest repetition (7, 23, 23 of 26): a short CI run whose calibrate caught a slow spell
        scored -53 % at level against the median."""
        pred, rel, ref = self.predicted(metric), self.measured.relative(metric), self.probe_reference(metric)
        return None if pred is None or rel is None or not ref else pred / (ref * rel) - 1.0

    def machine_states(self) -> list[tuple[float, float, float, float]]:
        """machine_state around each decode repetition (empty without the state probes)."""
        if not self.decode_parts or not self.state_probe_parts:
            return []
        samples = self.measured.state_probe_samples()
        if not samples or len(samples[0]) != len(self.state_probe_parts):
            return []
        return [machine_state(self.state_probe_parts, self.state_probe_reference_tg, v) for v in samples]

    def cache_scale(self) -> float | None:
        """The median cache scale over the repetitions (1: the ramp where calibrate's ladder saw it)."""
        st = self.machine_states()
        return statistics.median(k for _, k, _, _ in st) if st else None

    def state_error(self) -> float | None:
        """Decode predicted at the machine's state around each repetition (the probes' fit:
        the kernels' slowdown, the cache's scale, the stall's) over that repetition's speed, the
        median over the repetitions, - 1; None without the state probes."""
        st = self.machine_states()
        if not st or self.decode_parts is None:
            return None
        s = self.measured.samples("tg")
        return statistics.median(1.0 / float(self.decode_parts.seconds(x, k, g)) / v for (x, k, g, _), v in zip(st, s)) - 1.0

    def scored_error(self, metric: str) -> float | None:
        """The error this row is scored on: decode at the machine's state (state_error) where the
        state probes ran around its repetitions; else matched_error when a level probe ran beside
        it; else against the fastest repetition (tg_error / pp_error). The state first: one probe's
        ratio cannot tell a slower core from a smaller cache, and on the Xeon guest (2026-12-06, run
        B) it scored the K-quant rows past the cache -16 ... -19 % (toy-200m Q6_K, toy-125m Q2_K)
        where the probe's own slowdown came from the cache (the state probes: kernels 0.93-1.05x,
        cache 0.77-0.94x) and at state all 20 K-quant rows were within 14 %. That needs each type's
        own DRAM stall (calibrate's toy-mini and toy-stream runs): with the ladder's Q4_K stall alone
        the legacy and IQ4 rows past the cache came out up to +31 % fast at state. With it, at noon
        (four runs, the level probe at 0.58-1.11 of its level): 61 of 66 decode rows within 15 % at
        state, 40 against the level probe."""
        if metric == "tg":
            s = self.state_error()
            if s is not None:
                return s
        m = self.matched_error(metric)
        if m is not None:
            return m
        return self.tg_error if metric == "tg" else self.pp_error

    @property
    def tg_error(self) -> float:
        """predicted / the best measured repetition - 1 (positive: the prediction is too fast)."""
        return self.predicted_tg / self.measured.best("tg") - 1.0

    @property
    def pp_error(self) -> float | None:
        return None if self.predicted_pp is None or not self.measured.pp_tok_s else self.predicted_pp / self.measured.best("pp") - 1.0

    @property
    def perf_model_tg_error(self) -> float | None:
        return None if self.perf_model_tg is None else self.perf_model_tg / self.measured.best("tg") - 1.0

    def unstable(self, metric: str) -> bool:
        """The repetitions disagree (their two fastest differ by more than disagree_tol): the error
        against them says more about the machine's other work than about the prediction."""
        return bool(self.measured.samples(metric)) and self.measured.disagreement(metric) > self.disagree_tol

    @property
    def flags(self) -> tuple[str, ...]:
        out = [f"{m} repetitions disagree by {self.measured.disagreement(m):.0%}" for m in ("pp", "tg") if self.unstable(m)]
        for m in ("pp", "tg"):
            floor = self.level_floor(m)
            if floor and self.measured._pairs(m) and not self.measured.at_level(m, floor):
                out.append(f"{m}: the probe never reached {FAST_LEVEL:.0%} of its reference speed (its speed at calibrate, or "
                           "its prediction without one): the machine ran slower throughout")
        lo, hi = self.cache_ramp_bytes or (0.0, 0.0)
        if lo < self.decode_bytes < hi:  # the probe (toy-wide Q4_K, 70 MB) tracks the kernels, not the cache a neighbour takes
            out.append(f"tg: its {self.decode_bytes / 1e6:.0f} MB of weights lie on this machine's cache ramp ({lo / 1e6:.0f}-"
                       f"{hi / 1e6:.0f} MB, calibrate's ladder): its decode speed moves with the cache the machine gets")
        return tuple(out)


def _ramp_of(machine, spec) -> tuple[float, float] | None:
    """The cache ramp of the rates that stand for ``machine``'s CPU (a calibrated profile's ladder), as
    a decode step of ``spec`` meets it (cpu_model.ramp_bytes_for: its bytes and layers), or None."""
    from ..perf.cpu_model import decode_matrices, ramp_bytes_for, reference_for

    return ramp_bytes_for(reference_for(machine.ram), float(sum(b for _, b, _ in decode_matrices(_tensors(spec)))), spec.n_layers)


def _n_elements(t) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n


def decode_limits(bytes_by_type: dict[str, int], n_layer: int, ram, n_threads: int, eta: float | None = None,
                  matrices: list[tuple[str, int, int]] | None = None) -> DecodeLimits:
    """Memory and compute time of one CPU decode step (see cpu_model for the rates). ``matrices``
    ((type, bytes, rows) of each matrix, cpu_model.decode_matrices of the file's tensors) let the
    compute time weigh each matrix by how its rows split over the threads and add the DRAM stall
    of the bytes past the L3; without them every type's bytes split evenly."""
    from ..perf.cpu_model import cpu_decode_compute_s, cpu_decode_rate_bytes_per_s, decode_overhead_s_per_layer, dram_stall_s, reference_for

    ref = reference_for(ram)
    eta = ref["decode_bw_eff"] if eta is None else eta
    total = sum(bytes_by_type.values())
    memory_s = total / (eta * ram.bandwidth_bytes_per_s)  # bytes over the bandwidth decode kernels reach
    only_f32 = set(bytes_by_type) <= {"F32"}  # an F32 file: its matrices are F32 (else F32 is norms, a few KB)
    if matrices is not None:
        compute_s = cpu_decode_compute_s(ram, matrices, n_threads, n_layer)  # each matrix at its kernel's rate, split as llama.cpp splits it
    else:
        compute_s = sum(b / cpu_decode_rate_bytes_per_s(ram, ty, n_threads)  # each type at its kernel's rate
                        for ty, b in bytes_by_type.items() if (ty != "F32" or only_f32) and b)
        compute_s += dram_stall_s(ram, total, n_threads, stalled_by_type={k: b for k, b in bytes_by_type.items() if k != "F32"}, n_layer=n_layer)
    if not only_f32:
        compute_s += bytes_by_type.get("F32", 0) / ram.bandwidth_bytes_per_s  # norms: a few KB, streamed
    by_threads = ref.get("overhead_s_per_layer_by_threads") or {}
    used = min(n_threads, ram.n_cores or n_threads)
    per_layer = by_threads.get(str(used), decode_overhead_s_per_layer(ram))  # measured at this thread count when calibrated
    overhead_s = n_layer * per_layer
    return DecodeLimits(memory_s, compute_s, overhead_s, eta, ram.bandwidth_gbs)


def prefill_flops_by_type(spec: ModelSpec, n_prompt: int) -> dict[str, float]:
    """Weight-matmul FLOPs of one n_prompt-token batch, by the weights' ggml type: 2 per block
    weight per token; the output head (output.weight, or token_embd when tied) for the last
    token only (llama-bench, like a server, asks for the last token's logits); token_embd
    otherwise a row lookup. Attention (a few % at these lengths) is left out."""
    tensors = _tensors(spec)
    tied = not any(t.name == "output.weight" for t in tensors)
    head = "token_embd.weight" if tied else "output.weight"
    out: dict[str, float] = {}
    for t in tensors:
        if len(t.shape) < 2 or t.ggml_type == "F32" or (t.name == "token_embd.weight" and not tied):
            continue
        tokens = 1 if t.name == head else n_prompt
        out[t.ggml_type] = out.get(t.ggml_type, 0.0) + 2.0 * _n_elements(t) * tokens
    return out


def _predict_with_perf_model(model_path: str, machine, n_prompt: int, n_gen: int) -> tuple[float | None, float | None, str]:
    """(pp, tg, why-not) from the calibrated speed model, when it is importable and answers: on the
    file's own tensors (quant None), not on a plan of its preset (a bare "Q4_0" is the pure type
    there, with a Q4_0 output head where llama-quantize's Q4_0 writes Q6_K: toy-125m decode
    +15 % over the file's prediction, 2026-12-01)."""
    try:
        from ..models.gguf_reader import model_from_gguf
        from ..perf.calibration import llama_bench as predicted_bench

        got = predicted_bench(model_from_gguf(model_path), None, machine, n_prompt=n_prompt, n_gen=n_gen)
        return got["pp"], got["tg"], ""
    except (ImportError, NotImplementedError, TypeError, KeyError, AttributeError, InferlabError) as exc:
        return None, None, f"perf_model.llama_bench failed here ({type(exc).__name__}: {exc})"


# The level probe: toy-wide as pure Q4_K, a model `calibrate --engine llama.cpp` fits on (every
# machine's profile has its figures), timed around every repetition of calibrate's and validate's
# runs (llama_bench's probe): wide and shallow, so one run is short
PROBE_MODEL, PROBE_TYPE = "toy-wide", "Q4_K"
CALIBRATE_N_PROMPT = 128  # calibrate --engine llama.cpp's prompt (llama_cpp_plan's n_prompt), for profiles that do not say


def level_probe(directory: str | None = None) -> str:
    """Path of the level probe's GGUF (written and quantized on first use)."""
    return toy_model(PROBE_MODEL, "Q4_K_S", pure=True, directory=directory)  # --pure Q4_K_S: every matrix Q4_K


def probe_reference(probe_path: str, machine, n_threads: int, n_prompt: int) -> tuple[float, float | None]:
    """(tg, pp tok/s) the level probe runs at when the machine is at its calibrated level, with
    ``n_threads`` and a prompt of ``n_prompt``: the machine profile's level_probe (the median of the
    probe's runs during calibrate within FAST_LEVEL of its fastest), pp carried to ``n_prompt`` by
    the model's ratio between the two lengths; where the rates hold no such figure (a stored
    reference, an older profile, another thread count), the probe's prediction.

    Not the prediction first: the fit misses the probe itself by its residual (2 threads, this VM,
    2026-12-01: 469 predicted against 530 tok/s at calibrate), and a floor that low counted
    repetitions at 0.8 of the calibrated speed as at level, every error then too fast."""
    from ..perf.cpu_model import attached_rates

    _, _, limits, pp = _predict(probe_path, machine, n_threads, n_prompt)
    tg_ref, pp_ref = limits.tok_s, pp
    lp = (attached_rates(machine.ram) or {}).get("level_probe") or {}
    if (lp.get("model"), lp.get("type")) == (PROBE_MODEL, PROBE_TYPE):
        level = lp.get("level_tok_s") or {}
        if level.get(f"{n_threads}.tg"):
            tg_ref = level[f"{n_threads}.tg"]  # decode: the prediction has no length in it
        if pp is not None and level.get(f"{n_threads}.pp"):
            at_cal = _predict(probe_path, machine, n_threads, lp.get("n_prompt") or CALIBRATE_N_PROMPT)[3]
            pp_ref = level[f"{n_threads}.pp"] * (pp / at_cal if at_cal else 1.0)  # its speed at calibrate's length x the length's effect
    return tg_ref, pp_ref


def state_probes(probe_path: str, machine, n_threads: int, probe_tg_reference: float
                 ) -> tuple[tuple[str, ...], tuple[DecodeParts, ...], tuple[float, ...]] | None:
    """(the STATE_PROBES' paths, the parts of the level probe and of each, their decode speeds at
    calibrate) where ``machine``'s rates are a calibrated profile with a cache ramp and calibrate
    timed each at ``n_threads`` (the ladder, toy-mini); else None (validate then scores on the
    level probe alone)."""
    from ..perf.cpu_model import attached_rates

    measured = {(m.get("model"), m.get("type"), m.get("threads")): m.get("tg_tok_s")
                for m in (attached_rates(machine.ram) or {}).get("measurements") or []}
    refs = [measured.get((name, ty, n_threads)) for name, ty in STATE_PROBES]
    level_parts = decode_parts(probe_path, machine, n_threads)
    if level_parts is None or not all(refs):
        return None  # a profile calibrated before toy-mini (2026-12-06) has no calibrate speed for it
    paths = tuple(toy_model(name, _PURE_PRESETS[ty], pure=True) for name, ty in STATE_PROBES)
    parts = [decode_parts(p, machine, n_threads) for p in paths]
    if any(p is None for p in parts):
        return None
    return paths, (level_parts, *(p for p in parts if p is not None)), (probe_tg_reference, *(float(r or 0.0) for r in refs))


def _predict(path: str, machine, n_threads: int, n_prompt: int):
    """(the file's spec, bytes by type, decode limits, predicted pp tok/s or None) with ``machine``'s rates."""
    from ..models.gguf_reader import model_from_gguf
    from ..perf.cpu_model import cpu_prefill_s, decode_matrices

    spec = model_from_gguf(path)
    by_type = decode_bytes_by_type(path)
    limits = decode_limits(by_type, spec.n_layers, machine.ram, n_threads, matrices=decode_matrices(_tensors(spec)))
    pp = None
    if n_prompt:
        pp = n_prompt / cpu_prefill_s(machine.ram, prefill_flops_by_type(spec, n_prompt), n_threads,
                                      layer_tokens=spec.n_layers * n_prompt, n_embd=spec.d_model)
    return spec, by_type, limits, pp


def validate_llama_cpp(models: tuple[str, ...] = tuple(TOY_MODELS), presets: tuple[str, ...] = ("Q4_K_M", "Q8_0"),
                       n_threads: int | None = None, repetitions: int = 3, n_prompt: int = 512, n_gen: int = 128,
                       gguf_paths: tuple[str, ...] = (), machine=None, on_row=None, rt: bool = False,
                       profile: bool | dict = True, rounds: int = 1, probe: bool = True,
                       flash_attn: bool = True, state: bool = False) -> list[ValidationRow]:
    """Run each toy model (and any given GGUF) through llama.cpp and the speed model; one row each.
    ``rt``: time at real-time priority (measure.realtime); ``profile``: as detect_machine's.
    ``probe``: time the level probe (level_probe()) around every repetition and score each row on
    the repetitions that ran while the probe ran at the calibrated level (ValidationRow.matched_error;
    a row is repeated until AT_LEVEL_MIN did, up to 3x), and also against its fastest repetition.
    ``rounds``: the whole list is run that many times, one model after the other each round, and
    each row keeps the repetitions of every round. ``flash_attn``: as llama_bench's. ``state``: with
    the probe, where the profile holds a cache ramp, also time STATE_PROBES around every decode
    repetition and score decode at the machine's state (ValidationRow.state_error, scored_error)."""
    from ..perf.cpu_model import rates_label
    from .detect import detect_machine
    from .measure import realtime

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InvalidValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    machine = machine or detect_machine(profile=profile)
    n_threads = n_threads or physical_cores()
    jobs = [(m, p, toy_model(m, p)) for m in models for p in presets] + [(os.path.basename(g), None, g) for g in gguf_paths]
    probe_path = level_probe() if probe else None
    probe_ref = probe_reference(probe_path, machine, n_threads, n_prompt) if probe_path else None
    st = state_probes(probe_path, machine, n_threads, probe_ref[0]) if probe_path and probe_ref and state else None
    st_paths = st[0] if st else ()

    runs: dict[int, BenchResult] = {}
    for _ in range(rounds - 1):  # the earlier rounds; the last one below, row by row
        for i, (_, _, path) in enumerate(jobs):
            with realtime(rt):
                got = llama_bench(path, n_threads, n_prompt, n_gen, repetitions, probe=probe_path, flash_attn=flash_attn,
                                  state_probes=st_paths)
            runs[i] = runs[i].merged(got) if i in runs else got
    rows = []
    for i, (name, preset, path) in enumerate(jobs):
        spec, by_type, limits, pp = _predict(path, machine, n_threads, n_prompt)
        preset = preset or spec.file_type or "?"
        with realtime(rt):
            got = llama_bench(path, n_threads, n_prompt, n_gen, repetitions, probe=probe_path, flash_attn=flash_attn,
                              state_probes=st_paths)
        measured = runs[i].merged(got) if i in runs else got
        if probe_ref:  # a slow spell: repeat (2 at a time, up to 3x the repetitions) until enough ran at level
            floors = {"tg": FAST_LEVEL * probe_ref[0], "pp": FAST_LEVEL * probe_ref[1] if probe_ref[1] else None}
            need = min(AT_LEVEL_MIN, repetitions)
            for _ in range(repetitions):
                if all(measured.at_level(m, f) >= need for m, f in floors.items() if f and measured.samples(m)):
                    break
                with realtime(rt):
                    measured = measured.merged(llama_bench(path, n_threads, n_prompt, n_gen, 2, probe=probe_path, flash_attn=flash_attn,
                                                           state_probes=st_paths))
        pm_pp, pm_tg, why = _predict_with_perf_model(path, machine, n_prompt, n_gen)
        row = ValidationRow(name, preset, sum(_n_elements(t) for t in _tensors(spec)), sum(by_type.values()), n_threads,
                            measured, limits, pp, pm_pp, pm_tg, why, rates_label(machine.ram),
                            probe_reference_pp=probe_ref[1] if probe_ref else None,
                            probe_reference_tg=probe_ref[0] if probe_ref else None,
                            cache_ramp_bytes=_ramp_of(machine, spec),
                            decode_parts=decode_parts(path, machine, n_threads) if st else None,
                            state_probe_parts=st[1] if st else (), state_probe_reference_tg=st[2] if st else ())
        rows.append(row)
        if on_row:
            on_row(row)
    return rows

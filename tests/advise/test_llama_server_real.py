"""The llama-server commands inferlab emits, started for real on a tiny GGUF (CPU): the server accepts
every flag, and its own startup log gives the n_ctx, per-slot context, unified flag and KV-cache size
that ``advise.capacity.llamacpp_pool`` predicts. Needs the binary scripts/build_llama_server.sh builds."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab.advise.capacity import llamacpp_pool
from inferlab.advise.commands import llama_server
from inferlab.hardware.catalog import MACHINES
from inferlab.models.spec import ModelSpec
from inferlab.perf.placement import MiB

sys.path.insert(0, str(Path(__file__).parent))
from _llama_help import llama_server_help  # noqa: E402

TINY = ModelSpec(name="cap-tiny", arch="llama", n_layers=4, d_model=256, n_heads=4, n_kv_heads=4, head_dim=64, d_ff=512,
                 vocab_size=512, n_ctx_train=32768)


def _binary() -> str | None:
    import glob
    import os

    found = glob.glob(os.path.expanduser("~/.cache/inferlab/llama-server-*/llama-server"))
    return found[0] if found and llama_server_help() is not None else None


def _startup_log(argv: list[str]) -> str:
    proc = subprocess.Popen(argv + ["--port", "0", "-lv", "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "load_model: initializing" in line or "error" in line.lower() and "exiting" in line.lower():
                break
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return "".join(lines)


@pytest.mark.parametrize("kv,unified", [("f16", True), ("f16", False), ("q8_0", True), ("q4_0", False)])
def test_emitted_command_runs_and_llama_cpp_allocates_what_we_predict(tmp_path, kv, unified):
    binary = _binary()
    if binary is None:
        pytest.skip("no llama-server built (scripts/build_llama_server.sh)")
    from inferlab.models.gguf_writer import write_gguf

    path = write_gguf(TINY, tmp_path / "tiny.gguf", dtype="F16", seed=7)
    spec = TINY
    n_parallel, context = 4, 2000
    pool = llamacpp_pool(spec, MACHINES["cpu-ddr5"], "type:F16", kv, context, n_parallel, unified=unified)
    cmd = llama_server(spec, "F16", ctx=pool.n_ctx, kv_type=kv, n_parallel=n_parallel, kv_unified=unified, threads=1)
    argv = [binary if w == "llama-server" else w for w in cmd.argv]
    argv[argv.index("-m") + 1] = str(path)
    log = _startup_log(argv)
    assert "load_model: initializing" in log, log[-2000:]
    get = lambda key: re.search(rf"llama_context: {key}\s*=\s*(\S+)", log).group(1)  # noqa: E731
    assert int(get("n_ctx")) == pool.n_ctx == 8192  # 4 x 2000 = 8000, padded to 256 cells
    assert int(get("n_ctx_seq")) == pool.per_slot_ctx == (8192 if unified else 2048)
    assert get("kv_unified") == ("true" if unified else "false")
    size = float(re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB", log).group(1))
    assert size == pytest.approx(pool.kv_bytes / MiB, abs=0.01)
    # by hand: 8192 cells x 4 layers x 2 (K, V) x 256 values x bytes per value (f16 2, q8_0 34/32, q4_0 18/32)
    assert pool.kv_bytes == 8192 * 4 * 2 * 256 * {"f16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}[kv]


MOE = ModelSpec("cap-moe", "qwen3moe", n_layers=4, d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=0, vocab_size=512,
                n_ctx_train=4096, qk_norm=True, n_experts=8, n_experts_used=2, d_ff_expert=128)


@pytest.mark.parametrize("how", ["n_cpu_moe", "ot", "cpu_moe"])
def test_emitted_moe_commands_start_the_real_server(tmp_path, how):
    from inferlab.advise.commands import experts_ot_pattern
    from inferlab.models.gguf_writer import write_gguf

    binary = _binary()
    if binary is None:
        pytest.skip("no llama-server built (scripts/build_llama_server.sh)")
    path = write_gguf(MOE, tmp_path / "moe.gguf", dtype="F16", seed=7)
    kw = {"n_cpu_moe": dict(n_cpu_moe=2), "ot": dict(override_tensor=experts_ot_pattern(2)), "cpu_moe": dict(cpu_moe=True)}[how]
    cmd = llama_server(MOE, "F16", n_gpu_layers=5, ctx=1024, kv_type="q8_0", threads=1, **kw)
    argv = [binary if w == "llama-server" else w for w in cmd.argv]
    argv[argv.index("-m") + 1] = str(path)
    log = _startup_log(argv)
    assert "load_model: initializing" in log, log[-2000:]
    assert "tensor overrides to CPU" in log  # llama.cpp read our override (it warns that mmap is on)

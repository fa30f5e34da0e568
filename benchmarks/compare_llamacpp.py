"""llama.cpp (through llama-cpp-python), inferlab's torch runtime and Hugging Face transformers,
side by side, on the same GGUF: prefill and decode tokens/s, bytes streamed per decode step and
the bandwidth that makes, each engine's speed as a ratio of llama.cpp's, perf_model's prediction,
and whether the greedy tokens agree. transformers dequantizes the GGUF to fp32 (the weights
inferlab's float32 runtime holds) and generates with its dynamic KV cache; it is skipped when
transformers or accelerate is missing (pip install 'inferlab[reference]') or with --no-transformers.

    python benchmarks/compare_llamacpp.py [--model PATH] [--prompt-tokens 256] [--decode-tokens 64] [--dtypes float32,int4] [--rounds 3]

Prints a table and writes benchmarks/results/compare_llamacpp.json. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_runtime import RESULTS, measure_runtime, prompt_of, read_bandwidth_gbps, smollm_path, span  # noqa: E402


def gguf_decode_bytes(path: str) -> tuple[int, int]:
    """(bytes of every tensor in the file, bytes one decode step reads: all but the embedding table,
    plus the output head — the tied embedding when there is no output.weight)."""
    from gguf import GGUFReader

    r = GGUFReader(path, "r")
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(sizes.values())
    tied = "output.weight" not in sizes  # then the whole embedding table is read as the LM head
    return total, total if tied else total - sizes["token_embd.weight"]


def _last_logits(llm):
    """The last evaluated token's logits. llama-cpp-python 0.3 fills llm.scores only with
    logits_all=True (else it stays zeros, and an argmax of it is token 0), so read the context's."""
    import numpy as np

    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def _top2_gap(logits) -> float:
    """How far llama.cpp's chosen token leads the runner-up (a near-tie may flip between engines)."""
    import numpy as np

    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def measure_llama_cpp(path: str, prompt_ids: list[int], n_decode: int, n_ctx: int, repeats: int = 2) -> dict:
    import llama_cpp

    threads = os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    llm.reset()
    llm.eval(prompt_ids[:16])  # warm up
    best_prefill, best_step, tokens = float("inf"), float("inf"), []
    for _ in range(repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt_ids)  # prefill
        prefill = time.perf_counter() - t0
        logits = _last_logits(llm)
        nxt = int(logits.argmax())
        run, steps, gaps = [nxt], [], [_top2_gap(logits)]
        for _ in range(n_decode - 1):
            t0 = time.perf_counter()
            llm.eval([nxt])  # one decode step
            steps.append(time.perf_counter() - t0)
            logits = _last_logits(llm)
            nxt = int(logits.argmax())
            run.append(nxt)
            gaps.append(_top2_gap(logits))
        best_prefill = min(best_prefill, prefill)
        best_step = min(best_step, statistics.median(steps))
        tokens = run
    return {"prefill_s": best_prefill, "prefill_tok_per_s": len(prompt_ids) / best_prefill,
            "decode_step_s": best_step, "decode_tok_per_s": 1.0 / best_step, "tokens": tokens, "top2_gaps": gaps,
            "version": getattr(llama_cpp, "__version__", "?"), "threads": threads}


def load_transformers(path: str):
    """transformers' LlamaForCausalLM (or its kin) from the GGUF, fp32; None when not installed."""
    try:
        import accelerate  # noqa: F401  (transformers needs it to read a GGUF)
        import transformers
    except ImportError:
        return None
    import torch

    folder, name = os.path.split(os.path.abspath(path))
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def measure_transformers(model, prompt_ids: list[int], n_decode: int, repeats: int = 2) -> dict:
    """Prefill (one forward of the prompt) and greedy decode steps (one forward of the last token
    with the past keys and values), timed as the other engines are: best prefill, median step."""
    import torch

    import inspect

    # the past keys and values: `cache=` from transformers 5.24 on (`past_key_values=` is deprecated there)
    past_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    best_prefill, best_step, tokens = float("inf"), float("inf"), []
    with torch.inference_mode():
        model(torch.tensor([prompt_ids[:16]]), use_cache=True)  # warm up
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model(torch.tensor([prompt_ids]), use_cache=True)
            prefill = time.perf_counter() - t0
            nxt = int(out.logits[0, -1].argmax())
            run, steps, past = [nxt], [], out.past_key_values
            for _ in range(n_decode - 1):
                t0 = time.perf_counter()
                out = model(torch.tensor([[nxt]]), use_cache=True, **{past_kw: past})
                nxt = int(out.logits[0, -1].argmax())
                steps.append(time.perf_counter() - t0)
                run.append(nxt)
                past = out.past_key_values
            best_prefill = min(best_prefill, prefill)
            best_step = min(best_step, statistics.median(steps))
            tokens = run
    import transformers

    return {"prefill_s": best_prefill, "prefill_tok_per_s": len(prompt_ids) / best_prefill,
            "decode_step_s": best_step, "decode_tok_per_s": 1.0 / best_step, "tokens": tokens,
            "version": transformers.__version__}


def predictions(path: str, context: int, n_prompt: int) -> dict:
    try:
        from inferlab import perf_model
        from inferlab.hardware.detect import detect_machine
        from inferlab.models.gguf_reader import model_from_gguf

        spec, machine = model_from_gguf(path), detect_machine()
        out = {}
        # llama.cpp: the calibrated model (its CPU kernels' measured rates and per-layer cost);
        # inferlab's fp32 runtime: the lesson's bandwidth model (eta x measured read bandwidth)
        for label, quant, kv, speed in (("llama.cpp", None, "f16", perf_model.CALIBRATED()),
                                        ("inferlab", "F32", "f32", perf_model.LESSON)):
            pl = perf_model.place(spec, machine, quant, n_ctx=context + 1, kv_type=kv, n_gpu_layers=0)
            out[label] = {"speed_model": speed.name,
                          "decode_tok_per_s": perf_model.decode_step_time(pl, machine, context, 1, speed)["tok_per_s"],
                          "prefill_tok_per_s": perf_model.prefill_time(pl, machine, n_prompt, speed)["tok_per_s"]}
        out["machine"] = f"{machine.ram.name}, {machine.ram.bandwidth_gbs:.1f} GB/s assumed"
        return out
    except Exception as exc:  # a missing part of inferlab must not stop the measurement
        return {"note": f"no perf_model prediction ({type(exc).__name__}: {exc})"}


def _tie_note(per: list[dict]) -> str:
    """Where the greedy tokens part, how close llama.cpp's own top two were there."""
    gaps = [p.get("gap_at_first_disagreement") for p in per if p.get("gap_at_first_disagreement") is not None]
    return f"  (then llama.cpp's top two {min(gaps):.2f} apart)" if gaps else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,int4", help="inferlab weight dtypes to run (float32, bfloat16, int8, int4).")
    ap.add_argument("--int8", action="store_true", help="Also run inferlab with weight-only int8 weights.")
    ap.add_argument("--rounds", type=int, default=3,
                    help="Interleaved rounds (llama.cpp, each inferlab dtype, transformers); ranges over them.")
    ap.add_argument("--no-transformers", action="store_true", help="Leave Hugging Face transformers out.")
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("llama-cpp-python is not installed: pip install 'inferlab[engine]'")
    import torch

    from inferlab.runtime.gguf_weights import load_state, open_gguf, read_config
    from inferlab.runtime.llama import LlamaModel, load_gguf

    path = args.model or smollm_path()
    n_ctx = args.prompt_tokens + args.decode_tokens + 16
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] + (["int8"] if args.int8 else [])
    model, tok = load_gguf(path, n_ctx=n_ctx)
    reader = open_gguf(path)
    config = read_config(reader, path)
    state = load_state(reader, config, torch.float32)
    models = {d: model if d == "float32" else LlamaModel(config, state, dtype=d, n_ctx=n_ctx, path=path) for d in dtypes}
    del state
    hf = None if args.no_transformers else load_transformers(path)
    if hf is None and not args.no_transformers:
        print("transformers or accelerate is not installed: its row is left out (pip install 'inferlab[reference]')")
    ids = prompt_of(tok, args.prompt_tokens)
    mid_ctx = len(ids) + args.decode_tokens // 2
    file_bytes, lc_weight_step = gguf_decode_bytes(path)

    rounds = []
    for r in range(args.rounds):
        bw = read_bandwidth_gbps()
        lc = measure_llama_cpp(path, ids, args.decode_tokens, n_ctx, repeats=1 if args.rounds > 1 else 2)
        lc["decode_bytes_per_step"] = lc_weight_step + model.config.kv_bytes_per_token(2) * mid_ctx  # f16 KV
        lc["decode_gbps"] = lc["decode_bytes_per_step"] / lc["decode_step_s"] / 1e9
        engines = {"llama.cpp": lc}
        for d, m in models.items():
            engines[f"inferlab {d}"] = measure_runtime(m, ids, args.decode_tokens, repeats=1 if args.rounds > 1 else 2)
        if hf is not None:  # the fp32 weights and fp32 KV cache of inferlab's float32 model: the same bytes a step
            hm = measure_transformers(hf, ids, args.decode_tokens, repeats=1 if args.rounds > 1 else 2)
            hm["decode_bytes_per_step"] = model.decode_weight_bytes + model.config.kv_bytes_per_token(4) * mid_ctx
            hm["decode_gbps"] = hm["decode_bytes_per_step"] / hm["decode_step_s"] / 1e9
            engines["transformers fp32"] = hm
        for m in engines.values():
            m["share_of_read_bw"] = m["decode_gbps"] / bw["read_gbps"]
            m["share_of_calibrate_bw"] = m["decode_gbps"] / bw["calibrate_gbps"]
            m["decode_ratio_to_llama_cpp"] = m["decode_tok_per_s"] / lc["decode_tok_per_s"]
            m["prefill_ratio_to_llama_cpp"] = m["prefill_tok_per_s"] / lc["prefill_tok_per_s"]
            m["greedy_tokens_agreeing"] = next((i for i, (a, b) in enumerate(zip(m["tokens"], lc["tokens"])) if a != b),
                                               len(m["tokens"]))
            # llama.cpp's top-two gap where the first disagreement happens (None: none happened)
            m["gap_at_first_disagreement"] = (lc["top2_gaps"][m["greedy_tokens_agreeing"]]
                                              if m["greedy_tokens_agreeing"] < len(m["tokens"]) else None)
        rounds.append({"bandwidth": bw, "engines": engines})
        print(f"round {r + 1}: read bandwidth {bw['read_gbps']:.1f} GB/s; decode tok/s "
              + ", ".join(f"{k} {m['decode_tok_per_s']:.1f}" for k, m in engines.items()), flush=True)
    pred = predictions(path, mid_ctx, len(ids))

    print(f"\n{os.path.basename(path)}: {len(ids)} prompt tokens, {args.decode_tokens} decoded, batch 1, "
          f"{torch.get_num_threads()} threads; read bandwidth {span([r['bandwidth']['read_gbps'] for r in rounds], '.1f')} GB/s; "
          f"ranges over {len(rounds)} round(s)")
    print(f"{'engine':<19}{'prefill tok/s':>14}{'decode tok/s':>14}{'MB/step':>9}{'GB/s':>12}{'% bw':>9}{'% calib':>9}"
          f"{'decode vs llama.cpp':>21}{'greedy =':>10}")
    summary = {}
    for name in rounds[0]["engines"]:
        per = [r["engines"][name] for r in rounds]
        col = {k: [p[k] for p in per] for k in ("prefill_tok_per_s", "decode_tok_per_s", "decode_gbps", "share_of_read_bw",
                                               "share_of_calibrate_bw", "decode_ratio_to_llama_cpp", "prefill_ratio_to_llama_cpp", "greedy_tokens_agreeing")}
        col["decode_bytes_per_step"] = per[0]["decode_bytes_per_step"]
        summary[name] = col
        print(f"{name:<19}{span(col['prefill_tok_per_s'], '.0f'):>14}{span(col['decode_tok_per_s'], '.1f'):>14}"
              f"{col['decode_bytes_per_step'] / 1e6:>9.1f}{span(col['decode_gbps'], '.2f'):>12}"
              f"{span([100 * x for x in col['share_of_read_bw']], '.0f') + '%':>9}"
              f"{span([100 * x for x in col['share_of_calibrate_bw']], '.0f') + '%':>9}"
              f"{span(col['decode_ratio_to_llama_cpp'], '.2f') + 'x':>21}{min(col['greedy_tokens_agreeing']):>7}/{args.decode_tokens}"
              + _tie_note(per))
    if "transformers fp32" in rounds[0]["engines"] and "inferlab float32" in rounds[0]["engines"]:
        same = [sum(a == b for a, b in zip(r["engines"]["inferlab float32"]["tokens"], r["engines"]["transformers fp32"]["tokens"]))
                for r in rounds]
        summary["greedy_tokens_equal_inferlab_float32_vs_transformers"] = same
        print(f"greedy tokens, inferlab float32 vs transformers fp32 (the same fp32 weights): {min(same)}/{args.decode_tokens} equal")
    for r in rounds:
        for m in r["engines"].values():
            m.pop("tokens")
            m.pop("top2_gaps", None)
    if "note" in pred:
        print(pred["note"])
    else:
        print(f"perf_model ({pred['machine']}):")
        for k in ("llama.cpp", "inferlab"):
            print(f"  {k}: predicted decode {pred[k]['decode_tok_per_s']:.1f} tok/s, prefill {pred[k]['prefill_tok_per_s']:.0f} tok/s"
                  f" ({pred[k]['speed_model']} speed model)")
    os.makedirs(RESULTS, exist_ok=True)
    out = os.path.join(RESULTS, "compare_llamacpp.json")
    with open(out, "w") as f:
        json.dump({"model": path, "file_bytes": file_bytes, "rounds": rounds, "summary": summary, "predictions": pred,
                   "prompt_tokens": len(ids), "decode_tokens": args.decode_tokens}, f, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

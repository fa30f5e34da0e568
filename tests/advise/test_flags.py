"""The engines' argument tables (data/engines/*.json) and the parser built from them.

Independent truth: the lesson's Configuration Reference tables (the flags and defaults it names),
and, when scripts/build_llama_server.sh has built one, the real llama-server's --help."""

import json
import re
from importlib import resources

import pytest

from inferlab.advise.flags import engine_source, flag_table, parse_command
from inferlab.errors import InvalidValueError, UnknownNameError

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _llama_help import help_flags, llama_server_help  # noqa: E402

# the flags the lesson's "Configuration Reference" tables list, per engine
LESSON_FLAGS = {
    "llamacpp": ["-ngl", "--n-gpu-layers", "--fit", "--fit-target", "--fit-ctx", "-c", "--ctx-size", "-b", "--batch-size", "-ub",
                 "--ubatch-size", "-t", "-tb", "-fa", "--flash-attn", "-ctk", "-ctv", "--load-mode", "-np", "--parallel", "-kvu",
                 "--kv-unified", "--cache-prompt", "--cache-reuse", "--cache-ram", "-ot", "--override-tensor", "--cpu-moe",
                 "--n-cpu-moe", "-sm", "-ts", "--op-offload", "--no-op-offload", "-nkvo", "--no-kv-offload", "--spec-draft-model",
                 "-md", "--spec-draft-n-max", "--lora", "--lora-scaled"],
    "vllm": ["--gpu-memory-utilization", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype",
             "--block-size", "--enable-prefix-caching", "--enforce-eager", "--cpu-offload-gb", "--quantization", "-q",
             "--tensor-parallel-size", "-tp", "--enable-lora", "--max-loras", "--max-lora-rank", "--speculative-config"],
    "sglang": ["--mem-fraction-static", "--context-length", "--max-running-requests", "--chunked-prefill-size", "--schedule-policy",
               "--disable-radix-cache", "--radix-eviction-policy", "--kv-cache-dtype", "--cuda-graph-max-bs-decode", "--quantization",
               "--lora-paths", "--max-loras-per-batch", "--speculative-algorithm", "--disable-overlap-schedule", "--cpu-offload-gb",
               "--offload-group-size"],
}


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sglang"])
def test_tables_record_version_and_source_files(engine):
    raw = json.loads(resources.files("inferlab.data").joinpath("engines", f"{engine}.json").read_text())
    assert raw["version"] and raw["source"]["files"] and raw["source"]["repository"].startswith("https://github.com/")
    assert raw["source"]["package"]
    if engine == "llamacpp":
        assert re.fullmatch(r"[0-9a-f]{40}", raw["commit"]) and "common/arg.cpp" in raw["source"]["files"][0]
        assert re.fullmatch(r"[0-9a-f]{64}", raw["source"]["arg_cpp_sha256"])
    elif engine == "vllm":
        assert raw["version"] == "0.33.0" and any("arg_utils.py" in f for f in raw["source"]["files"])
    else:
        assert raw["version"] == "0.5.23" and any("server_args.py" in f for f in raw["source"]["files"])
    assert engine_source(engine).startswith(raw["program"])
    # one option per spelling
    names = [n for o in flag_table(engine).options for n in o.names]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sglang"])
def test_every_flag_the_lesson_names_is_in_the_table(engine):
    t = flag_table(engine)
    missing = [f for f in LESSON_FLAGS[engine] if f not in t.by_name]
    assert not missing, f"{engine} {t.version} lacks {missing}"


def test_defaults_the_lesson_states():
    v, s = flag_table("vllm"), flag_table("sglang")
    assert v.option("--gpu-memory-utilization").default == 0.92
    assert v.option("--max-lora-rank").default == 16 and v.option("--max-loras").default == 1
    assert s.option("--schedule-policy").default == "fcfs" and "lpm" in s.option("--schedule-policy").choices
    assert s.option("--max-loras-per-batch").default == 8
    # llama.cpp's cache types, exactly the lesson's list (plus f32)
    assert set(flag_table("llamacpp").option("-ctk").choices) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}


def test_fp8_is_a_serving_engine_cache_type_not_llama_cpps():
    with pytest.raises(InvalidValueError, match="fp8"):
        parse_command("llamacpp", "llama-server -ctk fp8")
    assert parse_command("vllm", "vllm serve m --kv-cache-dtype fp8")["--kv-cache-dtype"] == "fp8"
    with pytest.raises(InvalidValueError):
        parse_command("sglang", "python -m sglang.launch_server --kv-cache-dtype fp8")  # SGLang spells it fp8_e4m3
    parse_command("sglang", "python -m sglang.launch_server --kv-cache-dtype fp8_e4m3")


def test_parser_refuses_what_the_engine_would():
    with pytest.raises(InvalidValueError, match="no option '--frobnicate'"):
        parse_command("llamacpp", "llama-server --frobnicate 1")
    with pytest.raises(InvalidValueError, match="needs 1 value"):
        parse_command("llamacpp", "llama-server -m x.gguf -ngl")
    with pytest.raises(InvalidValueError, match="takes no value"):
        parse_command("vllm", "vllm serve m --enforce-eager=1")
    with pytest.raises(InvalidValueError, match="starts with"):
        parse_command("vllm", "llama-server -ngl 3")
    with pytest.raises(UnknownNameError):
        flag_table("ollama")
    out = parse_command("llamacpp", ["llama-server", "-m", "a.gguf", "--n-gpu-layers", "7", "-kvu", "--no-kv-unified"])
    assert out["-ngl"] == "7" and out["-kvu"] is True and out["-m"] == "a.gguf"


def test_llama_table_matches_the_real_binary_help():
    text = llama_server_help()
    if text is None:
        pytest.skip("no llama-server built (scripts/build_llama_server.sh); the table is checked against arg.cpp only")
    table = {n for o in flag_table("llamacpp").options for n in o.names}
    shown = help_flags(text)
    # help lines wrap a few long names; every other spelling of the table is in the binary's --help
    missing = {n for n in table - shown if not any(n.startswith(s) and len(s) > 6 for s in shown)}
    assert len(missing) <= 2, missing
    assert len(table & shown) > 0.95 * len(table)

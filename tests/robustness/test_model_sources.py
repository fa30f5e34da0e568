"""Hostile model sources through `inferlab fit` in a subprocess: each case ends within seconds with
exit 2 and one line on stderr naming what is wrong; nothing hangs, nothing is left behind.

Cases are generated per class: files that are not regular (FIFOs, devices) where a config, a GGUF
or a checkpoint is expected; JSON nested thousands deep; sizes beyond any published model; wrong
JSON types ("false" as a string, numbers as strings); a GGUF whose block count disagrees with its
tensors; a Hugging Face cache whose refs/main points outside snapshots/.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 1000,
         "max_position_embeddings": 2048}


def _limit_memory():  # 4 GiB of address space: a runaway allocation fails instead of swapping the machine
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def fit(source, *extra, env=None):
    r = subprocess.run([sys.executable, "-m", "inferlab", "fit", str(source), "--on", "rtx4090", *extra],
                       capture_output=True, text=True, timeout=30, preexec_fn=_limit_memory, env=env)
    return r


def assert_one_line_error(r, needle):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-500:]
    assert needle in lines[0], lines[0]


def _config_cases():
    for key in ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "intermediate_size"):
        yield f"huge-{key}", {**LLAMA, key: 10**9}, "beyond any published model"
        yield f"string-{key}", {**LLAMA, key: str(LLAMA[key])}, key
        yield f"negative-{key}", {**LLAMA, key: -LLAMA[key]}, key
        yield f"float-{key}", {**LLAMA, key: LLAMA[key] + 0.5}, key
    yield "false-as-string", {**LLAMA, "tie_word_embeddings": "false"}, "true or false"
    yield "not-an-object", [1, 2, 3], "JSON object"


@pytest.mark.parametrize("name,config,needle", list(_config_cases()), ids=[c[0] for c in _config_cases()])
def test_bad_configs(tmp_path, name, config, needle):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert_one_line_error(fit(tmp_path), needle)


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_json_nested_thousands_deep(tmp_path, depth):
    (tmp_path / "config.json").write_text("[" * depth + "]" * depth)
    assert_one_line_error(fit(tmp_path), "nested too deeply")
    st = tmp_path / "st"
    st.mkdir()
    (st / "config.json").write_text(json.dumps(LLAMA))
    header = ("{\"a\":" * depth + "1" + "}" * depth).encode()
    (st / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    assert_one_line_error(fit(st), "nested too deeply")


@pytest.mark.parametrize("where", ["config.json", "model.gguf", "sub/model.gguf"])
def test_fifos_never_block(tmp_path, where):
    target = tmp_path / where
    target.parent.mkdir(exist_ok=True)
    os.mkfifo(target)
    r = fit(tmp_path)  # a read of a FIFO would wait forever for a writer; the timeout above would fire
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "regular file" in r.stderr or "no config.json" in r.stderr
    assert_one_line_error(fit(target), "not a regular file")


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero", "/dev/urandom"])
def test_device_files(device):
    assert_one_line_error(fit(device), "not a regular file")


def test_a_gguf_whose_block_count_disagrees_with_its_tensors(tmp_path):
    pytest.importorskip("gguf")
    from inferlab.models.gguf_writer import write_gguf
    from inferlab.models.hf_config import model_from_hf_config

    spec = model_from_hf_config(LLAMA, name="tiny")
    good = tmp_path / "good.gguf"
    write_gguf(spec, good, dtype="F32")
    assert fit(good).returncode == 0
    import gguf

    reader = gguf.GGUFReader(str(good))
    field = reader.fields["llama.block_count"]
    raw = bytearray(good.read_bytes())
    value_part = field.parts[field.data[0]]  # the gguf package's view of the value: a numpy array into the mapped file
    start = value_part.ctypes.data - reader.data.ctypes.data  # byte offset of the uint32 value in the file
    for declared in (3, 1_000_000):
        raw[start:start + 4] = declared.to_bytes(4, "little")
        bad = tmp_path / f"bad{declared}.gguf"
        bad.write_bytes(bytes(raw))
        assert_one_line_error(fit(bad), "block_count says")


def test_a_hf_cache_ref_outside_snapshots_is_refused(tmp_path):
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "snapshots" / "abc" / "config.json").write_text(json.dumps(LLAMA))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(LLAMA))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("../../../elsewhere")
    env = {**os.environ, "HF_HUB_CACHE": str(cache)}
    assert_one_line_error(fit("org/tiny", env=env), "outside the cache's snapshots/")
    (repo / "refs" / "main").write_text("abc")
    assert fit("org/tiny", env=env).returncode == 0

"""load_model: every kind of source gives the same ModelSpec; a cached Hugging Face id is found
offline in a cache laid out as huggingface_hub lays it out (blobs, snapshots, refs)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from inferlab.errors import InvalidValueError, UnknownNameError
from inferlab.models.catalog import MODELS
from inferlab.models.resolve import hf_hub_cache, load_model


def _same_model(a, b) -> bool:
    strip = dict(name="x", source="", hf_id="", file_type=None)
    return dataclasses.replace(a, **strip) == dataclasses.replace(b, **strip)


def _cache_file(repo_dir: Path, rev: str, rel: str, content: bytes) -> Path:
    """Put a file in the hub cache: the content in blobs/<sha256>, a symlink in snapshots/<rev>/."""
    blob = repo_dir / "blobs" / hashlib.sha256(content).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    link = repo_dir / "snapshots" / rev / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("../" * (rel.count("/") + 2)) / "blobs" / blob.name)
    return link


def test_catalog_id():
    assert load_model("llama-3.1-8b") is MODELS["llama-3.1-8b"]
    assert load_model("LLAMA-3.1-8B") is MODELS["llama-3.1-8b"]
    with pytest.raises(UnknownNameError, match="did you mean 'llama-3.1-8b'"):
        load_model("llama-3.1-8")


def test_gguf_folder_and_config_paths(kit, tmp_path):
    spec = kit.spec_for("qwen3")
    g = kit.write_spec_gguf(spec, tmp_path / "q.gguf")
    assert _same_model(load_model(str(g)), spec)
    # the file's own tensor table comes with it: every tensor the writer put there, by name and shape
    from inferlab.models.inventory import tensor_inventory

    assert {(t.name, tuple(t.shape)) for t in load_model(g).tensors} == {(t.name, tuple(t.shape)) for t in tensor_inventory(spec)}
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(kit.HF_CONFIGS["qwen3"]))
    assert _same_model(load_model(str(folder)), spec)
    assert _same_model(load_model(str(folder / "config.json")), spec)
    # a folder of GGUFs: one is taken, several need a choice
    assert _same_model(load_model(str(tmp_path)), spec)  # holds q.gguf (and hf/, which has no GGUF)
    kit.write_spec_gguf(spec, tmp_path / "q-Q8_0.gguf")
    with pytest.raises(InvalidValueError, match=r"holds 2 GGUF models \(q-Q8_0.gguf, q.gguf\)"):
        load_model(str(tmp_path))
    with pytest.raises(InvalidValueError, match="no such file"):
        load_model(str(tmp_path / "absent.gguf"))
    with pytest.raises(InvalidValueError, match="non-empty"):
        load_model("")


def test_hf_cache_config_repo(kit, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert hf_hub_cache() == tmp_path / "hf-home" / "hub"
    repo = hf_hub_cache() / "models--acme--tiny-llama"
    cfg = kit.HF_CONFIGS["llama"]
    _cache_file(repo, "0123abcd", "config.json", json.dumps(cfg).encode())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    got = load_model("acme/tiny-llama")
    assert got.hf_id == "acme/tiny-llama" and got.name == "acme/tiny-llama"
    assert _same_model(got, kit.spec_for("llama"))


def test_hf_cache_gguf_repo_with_tag(kit, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--acme--tiny-GGUF"
    spec = kit.spec_for("gemma2")
    for quant, dtype in (("F16", "F16"), ("F32", "F32")):
        src = kit.write_spec_gguf(spec, tmp_path / f"tiny-{quant}.gguf", dtype=dtype)
        _cache_file(repo, "feed", f"tiny-{quant}.gguf", src.read_bytes())
    assert load_model("acme/tiny-GGUF:F32").file_type == "F32"
    assert load_model("acme/tiny-GGUF:f16").file_type == "F16"
    with pytest.raises(InvalidValueError, match="holds 2 GGUF models"):
        load_model("acme/tiny-GGUF")  # no refs/main: the snapshot is found anyway
    with pytest.raises(InvalidValueError, match="no GGUF matching 'Q4_K_M'"):
        load_model("acme/tiny-GGUF:Q4_K_M")
    # a split quant in its own subfolder, as large GGUF repos lay them out
    kit.write_spec_gguf(spec, tmp_path / "tiny-BIG.gguf", split_max_tensors=15)
    parts = sorted(tmp_path.glob("tiny-BIG-*-of-*.gguf"))
    for part in parts:
        _cache_file(repo, "feed", f"BIG/{part.name}", part.read_bytes())
    got = load_model("acme/tiny-GGUF:BIG")
    assert len(got.extra["split_files"]) == len(parts) > 1
    assert got.extra["tensor_bytes"] == load_model("acme/tiny-GGUF:F16").extra["tensor_bytes"]


def test_uncached_id_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(InvalidValueError) as exc:
        load_model("acme/not-here")
    msg = str(exc.value)
    assert str(tmp_path / "empty-hub" / "models--acme--not-here") in msg
    assert "never downloads" in msg and "hf download acme/not-here" in msg and ".gguf" in msg
    with pytest.raises(InvalidValueError, match="the catalog has this model as 'llama-3.1-8b'"):
        load_model(MODELS["llama-3.1-8b"].hf_id)

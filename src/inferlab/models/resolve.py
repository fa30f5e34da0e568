"""One entry point for every kind of model source: ``load_model(source) -> ModelSpec``.

A source is, in this order: an existing path (a ``.gguf`` file, a folder with ``config.json``
and optionally ``*.safetensors``, a ``config.json``, a folder of GGUF files), a catalog id, or a
Hugging Face id ``org/name`` (``org/name:Q4_K_M`` picks one GGUF of a GGUF repository) found in
the local Hugging Face cache. Nothing is ever downloaded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import InvalidValueError, UnknownNameError
from .spec import ModelSpec

_HF_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+)(?::(?P<tag>[\w.\-]+))?$")
_SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub finds it (HF_HUB_CACHE, HF_HOME/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def load_model(source: str | os.PathLike) -> ModelSpec:
    """The ModelSpec of a catalog id, a .gguf file, an HF folder or config.json, or a cached HF id."""
    text = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text.strip():
        raise InvalidValueError(f"a model source must be a non-empty string, got {source!r}")
    path = Path(text).expanduser()
    if path.exists():
        return _from_path(path)
    from .catalog import MODELS

    try:
        return MODELS[text]
    except UnknownNameError as not_in_catalog:
        m = _HF_ID.match(text)
        if m and not text.endswith((".gguf", ".json")):
            return _from_hf_cache(m["repo"], m["tag"], text)
        if text.endswith((".gguf", ".json", ".safetensors")) or os.sep in text:
            raise InvalidValueError(f"no such file or folder: {text!r}") from None
        raise not_in_catalog from None


def _from_path(path: Path, *, hf_id: str = "", tag: str | None = None) -> ModelSpec:
    from .gguf_reader import model_from_gguf
    from .safetensors_reader import model_from_hf_folder

    if not path.is_file() and not path.is_dir():
        raise InvalidValueError(f"{path}: exists but is not a regular file or a folder (a FIFO, socket or device?); pass a "
                                ".gguf file, a config.json, or a folder with config.json")
    if path.is_file():
        if path.suffix == ".gguf":
            return model_from_gguf(path)
        if path.name.endswith(".json"):
            return model_from_hf_folder(path, hf_id=hf_id)
        raise InvalidValueError(f"{path}: not a model file; pass a .gguf file, a config.json, or a folder with config.json")
    cfg = path / "config.json"
    if cfg.exists() and not cfg.is_file():
        raise InvalidValueError(f"{cfg}: exists but is not a regular file")
    if cfg.is_file() and tag is None:
        return model_from_hf_folder(path, hf_id=hf_id)
    ggufs = _model_ggufs(path)
    if tag is not None:
        ggufs = [g for g in ggufs if tag.lower() in g.name.lower()]
    if len(ggufs) == 1:
        return model_from_gguf(ggufs[0])
    if not ggufs:
        what = f"no GGUF matching {tag!r}" if tag else "no config.json and no .gguf file"
        raise InvalidValueError(f"{path}: {what}; pass a .gguf file, a config.json, or a folder with config.json")
    names = ", ".join(g.name for g in ggufs[:12])
    raise InvalidValueError(f"{path} holds {len(ggufs)} GGUF models ({names}); pass one file, or name it as org/name:QUANT")


def _model_ggufs(folder: Path) -> list[Path]:
    """The GGUF models in a folder and its direct subfolders (GGUF repos nest split quants one level
    down), one per split set, no projectors."""
    out = []
    for g in sorted([*folder.glob("*.gguf"), *folder.glob("*/*.gguf")]):
        if "mmproj" in g.name.lower() or not g.is_file():  # regular files only: a FIFO named .gguf would block
            continue
        m = _SPLIT_PART.search(g.name)
        if m and m.group(1) != "00001":
            continue  # a later part of a split model: its first part stands for it
        out.append(g)
    return out


def _from_hf_cache(repo: str, tag: str | None, text: str) -> ModelSpec:
    cache = hf_hub_cache()
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = _snapshot(repo_dir)
    if snapshot is None:
        from .catalog import MODELS

        known = [k for k, m in MODELS.items() if m.hf_id.lower() == repo.lower()]
        hint = f" (the catalog has this model as {known[0]!r})" if known else ""
        raise InvalidValueError(
            f"model {repo!r} is not in the local Hugging Face cache (looked in {repo_dir}; set HF_HOME or "
            f"HF_HUB_CACHE to use another cache). inferlab never downloads: fetch its config with "
            f"`hf download {repo} config.json` (or a GGUF file), or pass a path to a .gguf file, a folder "
            f"with config.json, or a catalog id{hint}"
        )
    return _from_path(snapshot, hf_id=repo, tag=tag)


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot refs/main points to, else the newest one holding a config.json or a GGUF."""
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(errors="replace").strip()[:256]
        target = snapshots / rev
        if rev and target.is_dir() and not target.resolve().is_relative_to(snapshots.resolve()):
            raise InvalidValueError(f"{ref}: points to {rev!r}, outside the cache's snapshots/ folder; refusing to follow it")
        if rev and target.is_dir() and _usable(target):
            return target
    candidates = [s for s in snapshots.iterdir() if s.is_dir() and _usable(s)]
    return max(candidates, key=lambda s: s.stat().st_mtime) if candidates else None


def _usable(snapshot: Path) -> bool:
    return (snapshot / "config.json").is_file() or bool(_model_ggufs(snapshot))


def resolve_model(model: ModelSpec | str | os.PathLike) -> ModelSpec:
    """The project's one model resolver: a ModelSpec as given, or a source for ``load_model``
    (catalog id, case-insensitive; .gguf file; HF folder or config.json; cached HF id)."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, (str, os.PathLike)):
        return load_model(model)
    raise InvalidValueError(
        f"model must be a ModelSpec or a model source (a catalog id such as 'llama-3.1-8b', a .gguf path, "
        f"a Hugging Face folder or config.json, or a cached org/name), got {type(model).__name__} {model!r:.80}")

"""The built-in model catalog: published Hugging Face configs (data/models.json), one ModelSpec each."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Generic, TypeVar

from ..errors import UnknownNameError
from .hf_config import model_from_hf_config
from .spec import ModelSpec


T = TypeVar("T")


class Catalog(Mapping[str, T], Generic[T]):
    """A read-only mapping id -> entry (ModelSpec, Machine...) whose unknown keys raise UnknownNameError with suggestions."""

    def __init__(self, kind: str, items: dict[str, T]):
        self._kind, self._items = kind, items

    def __getitem__(self, key: str) -> T:
        try:
            return self._items[key]
        except KeyError:
            lowered = {k.lower(): k for k in self._items}
            if isinstance(key, str) and key.lower() in lowered:
                return self._items[lowered[key.lower()]]
            raise UnknownNameError(self._kind, key, self._items) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@cache
def load_models() -> Catalog[ModelSpec]:
    data = json.loads(resources.files("inferlab.data").joinpath("models.json").read_text())
    items = {
        e["id"]: model_from_hf_config({**e["config"], "_name_or_path": e["hf_id"]}, name=e["name"], source=e["source"])
        for e in data["models"]
    }
    return Catalog("model", items)


MODELS = load_models()

"""What a client of this server may name: the catalog's models and machines, the files the user
named on the command line (read once, at start, offered by id: a client never sends a path), and
"local" when the user asked for this machine."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..errors import UnknownNameError


class Offer:
    """What this server lets a client name: catalog models + the command line's files, machines."""

    def __init__(self, files: Sequence[str] = (), local: bool = False):
        from ..hardware.catalog import MACHINES
        from ..models.catalog import MODELS
        from ..models.resolve import resolve_model

        self.models: dict[str, Any] = {k: k for k in MODELS}
        self.model_origin: dict[str, str] = {k: "catalog" for k in MODELS}
        self.file_specs: dict[str, Any] = {}
        for path in files:
            spec = resolve_model(path)  # read once, at start; a client can only name it by its id
            base = "file:" + os.path.basename(os.path.normpath(path))
            key, n = base, 2
            while key in self.models:
                key, n = f"{base}#{n}", n + 1
            self.models[key] = spec
            self.model_origin[key] = "file"
            self.file_specs[key] = (path, spec)
        self.machines: list[str] = list(MACHINES) + (["local"] if local else [])
        self.default_machine = "local" if local else "rtx4060ti"

    def model(self, key: str) -> Any:
        if key not in self.models:
            raise UnknownNameError("model", key, self.models)
        return self.models[key]

    def machine(self, key: str) -> str:
        if key not in self.machines:
            raise UnknownNameError("machine", key, self.machines)
        return key

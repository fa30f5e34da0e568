"""Typed exceptions. Library code raises these and never prints; the CLI turns them into
one-line messages with exit code 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InferlabError(Exception):
    """Base class of every error inferlab raises on bad input."""


class UnknownNameError(InferlabError, KeyError):
    """A name (model, machine, preset, KV type, engine...) that is not in a catalog."""

    def __init__(self, kind: str, value: object, choices: Iterable[str]):
        self.kind, self.value, self.choices = kind, value, sorted(choices)
        close = difflib.get_close_matches(str(value).lower(), [c.lower() for c in self.choices], n=3, cutoff=0.5)
        lower = {c.lower(): c for c in self.choices}
        hint = f"did you mean {', '.join(repr(lower[c]) for c in close)}?" if close else ""
        listing = ", ".join(self.choices[:40]) + (", ..." if len(self.choices) > 40 else "")
        msg = f"unknown {kind} {value!r}; {hint + ' ' if hint else ''}valid: {listing}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class InvalidValueError(InferlabError, ValueError):
    """A value out of its valid range (a negative context, a zero batch...)."""


class ConfigError(InferlabError, ValueError):
    """A model config (Hugging Face config.json or GGUF metadata) that is missing a field or malformed."""


class FileFormatError(InferlabError, ValueError):
    """A model file (GGUF, safetensors) that cannot be read: truncated, corrupt or unsupported."""


class NotSupportedError(InferlabError):
    """A valid request that inferlab does not handle (an architecture, a tensor type...)."""


class DoesNotFitError(InferlabError):
    """Raised only where a caller asks for a placement that must fit (place() reports, never raises)."""


class MissingDependencyError(InferlabError, ImportError):
    """An optional package (gguf, torch, llama-cpp-python...) that a feature needs is not installed."""

    def __init__(self, package: str, feature: str, extra: str | None = None):
        how = f"pip install 'inferlab[{extra}]'" if extra else f"pip install {package}"
        super().__init__(f"{feature} needs the package {package!r}, which is not installed; install it with: {how}")
        self.package = package


def check_positive(name: str, value: object, *, allow_zero: bool = False) -> None:
    """Raise InvalidValueError unless value is a finite positive (or non-negative) number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidValueError(f"{name} must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):  # NaN passes every comparison below
        raise InvalidValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidValueError(f"{name} must be {bound}, got {value!r}")

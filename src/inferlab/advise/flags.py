"""Each engine's command-line arguments, as data (data/engines/<engine>.json), and a parser built from them.

The tables were written from the engines' own definitions at a recorded version (see
``scripts/extract_engine_flags.py``): llama.cpp's ``common/arg.cpp``, vLLM's ``make_arg_parser`` and SGLang's
``ServerArgs.add_cli_args``. ``parse_command`` reads a command line the way the engine would accept
it (names, arity, choices) and raises ``InvalidValueError`` naming the flag otherwise, so every
command inferlab emits is checked against the engine's real argument list.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from ..errors import InvalidValueError, UnknownNameError

ENGINES = ("llamacpp", "vllm", "sglang")
# the words that start each engine's server command (what precedes the flags)
PROGRAMS = {"llamacpp": ("llama-server",), "vllm": ("vllm", "serve"), "sglang": ("python", "-m", "sglang.launch_server")}


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]  # every spelling, negative forms included
    takes_value: bool
    choices: tuple[str, ...] | None
    n_values: int  # values it consumes (0 for a flag)
    default: object = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class FlagTable:
    engine: str
    program: str
    version: str
    source: dict = field(compare=False, hash=False)
    options: tuple[Option, ...] = ()

    @property
    def by_name(self) -> dict[str, Option]:
        return _index(self)

    def option(self, name: str) -> Option:
        o = self.by_name.get(name)
        if o is None:
            raise UnknownNameError(f"{self.program} ({self.version}) option", name, self.by_name)
        return o


@lru_cache(maxsize=None)
def _index(t: FlagTable) -> dict[str, Option]:
    return {n: o for o in t.options for n in o.names}


@lru_cache(maxsize=None)
def flag_table(engine: str) -> FlagTable:
    """The argument table of ``engine`` (llamacpp | vllm | sglang)."""
    if engine not in ENGINES:
        raise UnknownNameError("engine", engine, ENGINES)
    raw = json.loads(resources.files("inferlab.data").joinpath("engines", f"{engine}.json").read_text())
    opts = []
    for o in raw["options"]:
        names = tuple(o["names"]) + tuple(o.get("negative_names") or ())
        n_values = o.get("n_values", 1 if o["takes_value"] else 0)
        if engine != "llamacpp" and o["takes_value"]:
            n_values = 1
        opts.append(Option(names, bool(o["takes_value"]), tuple(o["choices"]) if o.get("choices") else None, n_values, o.get("default")))
    return FlagTable(engine, raw["program"], raw["version"], raw["source"], tuple(opts))


def parse_command(engine: str, argv: list[str] | str) -> dict[str, object]:
    """Parse a server command line of ``engine`` against its argument table.

    Returns {first spelling of each option: its value (True for a flag, a tuple for several
    values)} plus "_positional": the words that are not options (vLLM's model). Raises
    InvalidValueError for an unknown option, a missing value or a value outside the option's choices.
    """
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    prog = PROGRAMS[engine] if engine in PROGRAMS else None
    if prog is None:
        raise UnknownNameError("engine", engine, ENGINES)
    if tuple(words[:len(prog)]) != prog:
        raise InvalidValueError(f"a {engine} command starts with {' '.join(prog)!r}, got {' '.join(words[:len(prog)])!r}")
    table = flag_table(engine)
    positional: list[str] = []
    out: dict[str, object] = {"_positional": positional}
    i = len(prog)
    while i < len(words):
        w = words[i]
        if not w.startswith("-") or w == "-":
            positional.append(w)
            i += 1
            continue
        name, eq, inline = w.partition("=") if w.startswith("--") else (w, "", "")
        opt = table.by_name.get(name)
        if opt is None:
            raise InvalidValueError(f"{table.program} ({table.version}) has no option {name!r}")
        key = opt.names[0]
        if not opt.takes_value:
            if eq:
                raise InvalidValueError(f"{table.program} option {name} takes no value, got {w!r}")
            out[key] = True  # the flag as spelled (a negative spelling is its own entry in names)
            i += 1
            continue
        if eq:
            values = [inline]
            i += 1
        else:
            values = words[i + 1:i + 1 + opt.n_values]
            if len(values) < opt.n_values or any(v.startswith("--") for v in values):
                raise InvalidValueError(f"{table.program} option {name} needs {opt.n_values} value(s)")
            i += 1 + opt.n_values
        if opt.choices is not None and values[0] not in opt.choices:
            raise InvalidValueError(f"{table.program} option {name}: {values[0]!r} is not one of {', '.join(opt.choices)}")
        out[key] = values[0] if len(values) == 1 else tuple(values)
    return out


def engine_source(engine: str) -> str:
    """One line: which version and files the engine's argument table was read from."""
    t = flag_table(engine)
    return f"{t.program} {t.version}: {'; '.join(t.source['files'])} ({t.source['package']})"

"""Write data/engines/<engine>.json from each engine's own argument definitions (a maintainer's tool).

A maintainer's script, not part of the package. Each table records the engine version, where its sources came from
and which files define the arguments, so a test can check every flag inferlab emits against them.

* vLLM and SGLang: their real argparse parsers are built (``make_arg_parser`` of ``vllm serve``,
  ``ServerArgs.add_cli_args`` of ``sglang.launch_server``) from the PyPI wheels' Python sources and
  every action is written down (names, arity, choices, declared default).
* llama.cpp: ``common/arg.cpp`` (as vendored by llama-cpp-python's sdist, whose
  ``.git/modules/vendor/llama.cpp/HEAD`` names the commit) is read: every ``common_arg`` whose
  examples include the server (or none, i.e. common), its names, negative names, value hint, and
  whether its handler takes a value.

Usage (each engine needs its extracted sources and, for vLLM/SGLang, their import dependencies)::

    python scripts/extract_engine_flags.py llamacpp --src /tmp/llama.cpp --commit 0c1e570... --package llama-cpp-python==0.3.36
    PYTHONPATH=/tmp/vllm-wheel:/tmp/deps VLLM_TARGET_DEVICE=cpu python scripts/extract_engine_flags.py vllm --version 0.33.0
    PYTHONPATH=/tmp/sglang-wheel:/tmp/deps python scripts/extract_engine_flags.py sglang --version 0.5.23
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "inferlab" / "data" / "engines"


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v if not (isinstance(v, float) and v != v) else None
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


def _actions(parser: argparse.ArgumentParser) -> list[dict]:
    out = []
    for a in parser._actions:
        if not a.option_strings:
            continue
        nargs = a.nargs
        takes_value = not (nargs == 0 or isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                                          argparse._StoreConstAction, argparse._HelpAction,
                                                          argparse._CountAction, argparse._VersionAction,
                                                          argparse.BooleanOptionalAction)))
        choices = [str(c) for c in a.choices] if a.choices is not None else None
        help_ = (a.help or "").strip().split("\n")[0][:200] if a.help != argparse.SUPPRESS else ""
        out.append({"names": list(a.option_strings), "takes_value": takes_value,
                    "nargs": nargs if isinstance(nargs, (str, int)) else None, "choices": choices,
                    "default": _plain(a.default) if a.default is not argparse.SUPPRESS else None, "help": help_})
    return out


def extract_vllm(version: str) -> dict:
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm.entrypoints.common.cli_args as m

    p = make_arg_parser(FlexibleArgumentParser())
    options = _actions(p)
    # two values vLLM checks when it builds its config rather than in argparse: take them from the Literals
    import typing

    from vllm.config.cache import CacheDType
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    later = {"--kv-cache-dtype": (list(typing.get_args(CacheDType)), "vllm/config/cache.py CacheDType"),
             "--quantization": (list(QUANTIZATION_METHODS), "vllm/model_executor/layers/quantization/__init__.py QuantizationMethods")}
    for o in options:
        for name, (values, where) in later.items():
            if name in o["names"] and o["choices"] is None:
                o["choices"], o["choices_source"] = values, where
    return {"engine": "vllm", "program": "vllm serve", "version": version,
            "source": {"package": f"vllm=={version} (PyPI wheel vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl)",
                       "repository": "https://github.com/vllm-project/vllm",
                       "files": ["vllm/entrypoints/common/cli_args.py (make_arg_parser)",
                                 "vllm/engine/arg_utils.py (EngineArgs.add_cli_args, AsyncEngineArgs)",
                                 "vllm/config/*.py (field defaults and choices)"],
                       "how": "the real argparse parser of `vllm serve`, built by make_arg_parser and dumped action by action",
                       "module_file": Path(m.__file__).name},
            "options": options}


def extract_sglang(version: str) -> dict:
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return {"engine": "sglang", "program": "python -m sglang.launch_server", "version": version,
            "source": {"package": f"sglang=={version} (PyPI wheel)", "repository": "https://github.com/sgl-project/sglang",
                       "files": ["python/sglang/srt/server_args.py (ServerArgs.add_cli_args)",
                                 "python/sglang/srt/arg_groups/fields/*.py (the fields, their help and choices)",
                                 "python/sglang/srt/arg_groups/arg_utils.py (add_cli_args_from_dataclass)"],
                       "how": "the real argparse parser of sglang.launch_server, built by ServerArgs.add_cli_args and dumped"},
            "options": _actions(p)}


_NAMES = re.compile(r'\{\s*((?:"[^"]*"\s*,?\s*)+)\}')
_STR = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _string_list(s: str) -> list[str]:
    return _STR.findall(s)


def extract_llamacpp(src: Path, commit: str, package: str) -> dict:
    arg_cpp = src / "common" / "arg.cpp"
    text = arg_cpp.read_text()
    kv = re.search(r"kv_cache_types\s*=\s*\{([^}]*)\}", text)
    kv_types = [t.strip().replace("GGML_TYPE_", "").lower() for t in kv.group(1).split(",") if t.strip()]
    starts = [m.end() for m in re.finditer(r"add_opt\(\s*common_arg\(", text)]
    options: dict[tuple, dict] = {}
    for i, s in enumerate(starts):
        seg = text[s: starts[i + 1] if i + 1 < len(starts) else len(text)]
        m = _NAMES.match(seg.lstrip())
        if not m:
            continue
        rest = seg.lstrip()[m.end():]
        names = _string_list(m.group(1))
        neg = []
        m2 = re.match(r'\s*,\s*\{((?:\s*"[^"]*"\s*,?)+)\}', rest)
        if m2:
            neg = _string_list(m2.group(1))
            rest = rest[m2.end():]
        hint = None
        m3 = re.match(r'\s*,\s*"((?:[^"\\]|\\.)*)"\s*,\s*(?:"|string_format|std::string|R"|\n\s*")', rest)
        if m3:
            hint = m3.group(1)
        lam = re.search(r"\[\]\s*\(\s*common_params\s*&\s*\w+\s*(,[^)]*)?\)", seg)
        params_ = lam.group(1) if lam is not None and lam.group(1) else ""
        # (params, bool value): a flag with a negative spelling, not a value
        n_values = 0 if not params_ or re.fullmatch(r",\s*bool\s+\w+\s*", params_) else params_.count(",")
        ex = re.search(r"\.set_examples\(\s*\{([^}]*)\}", seg)
        examples = [e.strip().replace("LLAMA_EXAMPLE_", "").lower() for e in ex.group(1).split(",") if e.strip()] if ex else []
        exc = re.search(r"\.set_excludes\(\s*\{([^}]*)\}", seg)
        excludes = [e.strip().replace("LLAMA_EXAMPLE_", "").lower() for e in exc.group(1).split(",") if e.strip()] if exc else []
        env = re.search(r'\.set_env\("([^"]+)"\)', seg)
        in_server = (not examples or "server" in examples or "common" in examples) and "server" not in excludes
        if not in_server:
            continue
        choices = None
        if hint and re.fullmatch(r"\[?[\w.-]+(\|[\w.-]+)+\]?", hint):
            choices = hint.strip("[]").split("|")
        if set(names) & {"-ctk", "-ctv", "-ctkd", "-ctvd"}:
            choices = kv_types
        key = tuple(names)
        entry = {"names": names, "negative_names": neg, "takes_value": n_values >= 1, "n_values": n_values,
                 "value_hint": hint, "choices": choices, "examples": examples or ["common"], "env": env.group(1) if env else None}
        options.setdefault(key, entry)
    digest = hashlib.sha256(arg_cpp.read_bytes()).hexdigest()
    return {"engine": "llamacpp", "program": "llama-server", "version": f"llama.cpp commit {commit}",
            "commit": commit,
            "source": {"package": f"{package} sdist (PyPI), vendor/llama.cpp", "repository": "https://github.com/ggml-org/llama.cpp",
                       "files": ["common/arg.cpp (common_params_parser_init: every common_arg, with set_examples)"],
                       "arg_cpp_sha256": digest,
                       "how": "common_arg entries of arg.cpp whose examples are common or include LLAMA_EXAMPLE_SERVER; "
                              "a handler with a value parameter takes a value"},
            "kv_cache_types": kv_types, "options": list(options.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("engine", choices=["vllm", "sglang", "llamacpp"])
    ap.add_argument("--version", default="")
    ap.add_argument("--src", type=Path)
    ap.add_argument("--commit", default="")
    ap.add_argument("--package", default="")
    a = ap.parse_args(argv)
    if a.engine == "vllm":
        data = extract_vllm(a.version)
    elif a.engine == "sglang":
        data = extract_sglang(a.version)
    else:
        data = extract_llamacpp(a.src, a.commit, a.package)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{a.engine}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"{path}: {len(data['options'])} options", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

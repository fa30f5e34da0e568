"""The layout's rules, checked on the source: who may import whom (DESIGN.md, "Import direction").

Every import statement in src/inferlab is read with ast, including imports inside functions (a
lazy import is still a dependency). Relative imports are resolved to module names.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "inferlab"
FACADES = {"inferlab.perf_model", "inferlab.inference_trace", "inferlab.kv_managers"}
# the core: the standard library only at module level (optional packages only inside the edge functions that need them)
CORE_PACKAGES = ("inferlab.perf", "inferlab.kv", "inferlab.quant", "inferlab.models", "inferlab.api", "inferlab.hardware")
HEAVY = {"torch", "fastapi", "uvicorn", "matplotlib", "numpy", "gguf", "safetensors", "rich", "click", "pandas", "playwright"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in a file."""
    mod = _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    for n in tree.body:  # module-level try/if blocks count as module level
        if isinstance(n, (ast.If, ast.Try)):
            top |= {id(x) for x in ast.walk(n)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            out.append((target, id(node) in top))
            out += [(n_, id(node) in top) for n_ in names]  # `from . import perf_model` imports a module
    return out


FILES = sorted(SRC.rglob("*.py"))
GRAPH = {_module_name(f): _imports(f) for f in FILES}


def test_nothing_inside_the_package_imports_a_seed_facade():
    bad = [(m, t) for m, imps in GRAPH.items() if m not in FACADES for t, _ in imps if t in FACADES]
    assert not bad, f"facades are leaves for users; import the real module instead: {bad}"


def test_the_core_imports_only_the_standard_library_at_module_level():
    stdlib = set(sys.stdlib_module_names)
    bad = []
    for m, imps in GRAPH.items():
        if not m.startswith(CORE_PACKAGES) and m not in FACADES:
            continue
        for t, top in imps:
            root = t.split(".")[0]
            if top and root not in stdlib and root != "inferlab" and root != "__future__":
                bad.append((m, t))
            if root in ("fastapi", "uvicorn", "matplotlib", "playwright") and m.startswith("inferlab.perf"):
                bad.append((m, t))  # never, not even lazily
    assert not bad, f"core modules must run on the standard library alone: {bad}"


def _package_of(m: str) -> str:
    parts = m.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (SRC / parts[1]).is_dir() else m


def _cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def _module_edges(prefix: str) -> dict[str, set[str]]:
    mods = {m for m in GRAPH if m.startswith(prefix)}
    return {m: {t for t, _ in GRAPH[m] if t in mods and t != m} for m in mods}


@pytest.mark.parametrize("a,b", [("inferlab.models", "inferlab.quant")])
def test_no_circle_between_packages(a, b):
    ab = sorted({(m, t) for m, imps in GRAPH.items() if m.startswith(a + ".") for t, _ in imps if t.startswith(b + ".")})
    ba = sorted({(m, t) for m, imps in GRAPH.items() if m.startswith(b + ".") for t, _ in imps if t.startswith(a + ".")})
    assert not (ab and ba), f"{a} and {b} import each other: {ab[:3]} and {ba[:3]}"


@pytest.mark.parametrize("package", ["inferlab.hardware", "inferlab.perf", "inferlab.kv", "inferlab.api"])
def test_no_import_circle_inside_a_package(package):
    assert not _cycles(set(_module_edges(package)), _module_edges(package))


def test_the_checks_see_a_facade_import_when_there_is_one(tmp_path):
    """The reader itself: a planted lazy facade import is found."""
    f = SRC / "kv" / "pool.py"
    imps = _imports(f)
    assert ("inferlab.perf.placement", True) in imps  # a real module-level import of pool.py, resolved
    planted = tmp_path / "x.py"
    planted.write_text("def f():\n    from .. import perf_model\n")
    tree = ast.parse(planted.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert node.level == 2 and node.names[0].name == "perf_model"

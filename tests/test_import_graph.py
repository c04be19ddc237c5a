"""The import graph of the whole tree, read from the source (every import, the ones inside
functions too): the library and the lab are two layered stacks, imports point down, and there
is no cycle between modules or between sibling folders.

``docs/architecture.md`` draws the same layers; a new top-level module or folder must be placed
in ``LIBRARY_LAYERS`` or ``LAB_LAYERS`` below (the test fails until it is).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = {"relpos": ROOT / "src", "relpos_lab": ROOT / "lab" / "src"}

#: the library's floors, bottom first: a module may import its own floor or a lower one
LIBRARY_LAYERS: list[set[str]] = [
    {
        "validation",
        "config",
        "optional",
        "positions",
        "positions_nd",
        "graphs",
        "cameras",
        "schedules",
        "rope_scaling",
        "functional",
    },
    {"encodings"},
    {"attention"},
    {"nn"},
    {"interop"},
    # the public facade: the package itself, the registry's public path, the deprecated alias
    {"", "registry", "efficient"},
]
#: the lab's floors, bottom first (the lab may import any part of the library)
LAB_LAYERS: list[set[str]] = [
    {"io", "arguments", "intervals", "measure", "terminal"},
    {"training", "report"},
    {"extrapolate", "longctx"},
    {"analysis"},
    {"tasks"},
    {"bench", "auto_bench", "demo", "listing"},
    # the reference site's generated pages and atlas figures (mkdocs.yml's hook)
    {"docsite"},
    {"cli", "", "readme_results"},
]
LAYERS = {"relpos": LIBRARY_LAYERS, "relpos_lab": LAB_LAYERS}


def _modules() -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (path, is_package)}`` of every module of both trees."""
    out = {}
    for top, base in TREES.items():
        for path in (base / top).rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            out[".".join(parts)] = (path, is_package)
    return out


MODULES = _modules()


def _targets(module: str, is_package: bool, node: ast.AST) -> list[str]:
    """The modules of both trees that one import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            parts = module.split(".")
            if not is_package:
                parts = parts[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            for alias in node.names
        ]
    else:
        return []
    return [n for n in names if n.split(".")[0] in TREES]


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, (path, is_package) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(module, is_package, node):
                if target != module:
                    edges[module].add(target)
    return edges


EDGES = _edges()


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def _folder(module: str) -> str:
    """The folder (package) that holds a module: itself for a package's ``__init__``."""
    return module if MODULES[module][1] else module.rsplit(".", 1)[0]


def _floor(module: str) -> tuple[str, int]:
    top, *rest = module.split(".")
    first = rest[0] if rest else ""
    for n, floor in enumerate(LAYERS[top]):
        if first in floor:
            return top, n
    raise AssertionError(
        f"{module}: {top}.{first} is on no floor of tests/test_import_graph.py; place it"
    )


def test_the_trees_were_read():
    assert "relpos.attention.api" in MODULES and "relpos_lab.cli" in MODULES
    assert "relpos.encodings.base" in EDGES["relpos.attention.api"]


def test_no_module_imports_itself_back():
    assert _strongly_connected(EDGES) == []


def test_no_two_folders_import_each_other():
    folders: dict[str, set[str]] = defaultdict(set)
    for a, targets in EDGES.items():
        for b in targets:
            fa, fb = _folder(a), _folder(b)
            # a package's __init__ importing its own subfolders is how a package is assembled
            if fa != fb and not fb.startswith(fa + "."):
                folders[fa].add(fb)
    assert _strongly_connected(folders) == []


def test_the_library_never_imports_the_lab():
    offenders = {
        a: sorted(b for b in targets if b.startswith("relpos_lab"))
        for a, targets in EDGES.items()
        if a.split(".")[0] == "relpos"
    }
    assert {a: b for a, b in offenders.items() if b} == {}


@pytest.mark.parametrize("top", sorted(TREES))
def test_imports_point_down_the_floors(top):
    upward = []
    for a, targets in EDGES.items():
        if a.split(".")[0] != top:
            continue
        tree_a, floor_a = _floor(a)
        for b in targets:
            tree_b, floor_b = _floor(b)
            if tree_b == tree_a and floor_b > floor_a:
                upward.append(f"{a} -> {b}")
    assert upward == []


def test_a_cycle_or_an_upward_import_is_caught():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _strongly_connected(graph) == [["a", "b", "c"]]
    with pytest.raises(AssertionError, match="on no floor"):
        _floor("relpos.not_a_module_on_any_floor")

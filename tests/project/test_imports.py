"""Who may import whom (docs/architecture.md: the floors and the one-way data flow), read from the
source with `ast`: every import of our packages, at module level or inside a function (a deferred import is
still a dependency). No module imports under `if TYPE_CHECKING:` (a type-only import hides a circle, it does not
remove it).

No import circle among our modules; search_spaces imports nothing of orchestrator or trainers (nor torch);
orchestrator never imports torch; trainers never import orchestrator; backends never import the sweep loop
or the study; the study's read side never imports a backend; tracking never imports the report, the study
or Slurm; economics imports nothing of ours.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("search_spaces", "orchestrator", "trainers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(name: str, path: Path) -> set[str]:
    """Every module name `name` imports (ours or not)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return out


@cache
def graph() -> dict[str, frozenset[str]]:
    """Our module -> the modules of ours it imports."""
    ours = modules()
    return {name: frozenset(m for m in _imported(name, path) if m in ours and m != name)
            for name, path in ours.items()}


def _cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
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

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_the_walk_sees_the_imports_it_judges():
    g = graph()
    assert "orchestrator.records" in g["orchestrator.study"]  # module level
    assert "orchestrator.report" in g["orchestrator.sweep.loop"]  # inside a function
    assert "orchestrator.spec" in g["orchestrator.sweep.prior"]  # the spec type, at module level
    assert _cycles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}) == \
        [["a", "b", "c"]]


def test_no_import_circle_among_our_modules():
    assert _cycles(graph()) == []


def test_no_type_only_imports():
    """`if TYPE_CHECKING:` imports are how a circle is hidden from the interpreter; none is needed."""
    hiding = sorted(name for name, path in modules().items()
                    if any(_type_checking_only(node) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))
    assert hiding == []


def _imports_of(prefix: str) -> dict[str, set[str]]:
    """Module -> everything it imports (ours or not), for our modules under `prefix`."""
    return {name: _imported(name, path) for name, path in modules().items()
            if name == prefix or name.startswith(prefix + ".")}


def _offending(prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{name} imports {m}" for name, imported in _imports_of(prefix).items() for m in imported
                  if any(m == f or m.startswith(f + ".") for f in forbidden))


@pytest.mark.parametrize(("part", "forbidden"), [
    ("search_spaces", ("orchestrator", "trainers", "torch", "megatron")),
    ("orchestrator", ("torch", "megatron", "trainers")),
    ("trainers", ("orchestrator",)),
    ("orchestrator.backends", ("orchestrator.sweep", "orchestrator.study", "orchestrator.tracking")),
    ("orchestrator.records", ("orchestrator.backends", "orchestrator.sweep", "orchestrator.study",
                              "orchestrator.tracking", "orchestrator.spec")),
    ("orchestrator.study", ("orchestrator.backends", "orchestrator.sweep", "orchestrator.tracking")),
    ("orchestrator.tracking", ("orchestrator.report", "orchestrator.study", "orchestrator.slurm_job",
                               "orchestrator.sweep")),
    ("orchestrator.economics", PACKAGES),
])
def test_each_part_imports_only_what_it_may(part, forbidden):
    assert _offending(part, forbidden) == []

"""Who may import whom (docs/architecture.md: the floors and the one-way data flow), read from the
source with `ast`: every import of our packages, at module level or inside a function (a deferred import is
still a dependency). No module imports under `if TYPE_CHECKING:` (a type-only import hides a circle, it does not
remove it).

No import circle among our modules; search_spaces imports nothing of orchestrator or trainers (nor torch);
orchestrator never imports torch; trainers never import orchestrator; each room of orchestrator/ imports only the
rooms upstream of it (the table below), the backends never the study's storage; economics imports nothing of ours.
Only orchestrator/storage/ knows what a store's URL means: no other module imports a store backend's library
(sqlite3, psycopg, SQLAlchemy, optuna.storages) or branches on a URL's scheme.
"""

from __future__ import annotations

import ast
import re
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
    assert "orchestrator.records" in g["orchestrator.storage.studies"]  # module level
    assert "orchestrator.outputs.report" in g["orchestrator.sweep.loop"]  # inside a function
    assert "orchestrator.spec.schema" in g["orchestrator.search.prior"]  # the spec type, at module level
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


# the rooms of orchestrator/ (docs/architecture.md): data flows spec -> search -> dispatch -> records/storage ->
# tracking -> outputs; commands (the CLI) may use every room, and no room uses commands
_NOT_COMMANDS = ("orchestrator.commands",)


@pytest.mark.parametrize(("part", "forbidden"), [
    ("search_spaces", ("orchestrator", "trainers", "torch", "megatron")),
    ("orchestrator", ("torch", "megatron", "trainers")),
    ("trainers", ("orchestrator",)),
    ("orchestrator.spec", ("orchestrator.sweep", "orchestrator.storage", "orchestrator.tracking",
    "orchestrator.outputs",
                           "orchestrator.records", *_NOT_COMMANDS)),
    ("orchestrator.search", ("orchestrator.sweep", "orchestrator.storage", "orchestrator.tracking",
                             "orchestrator.outputs", *_NOT_COMMANDS)),
    ("orchestrator.dispatch", ("orchestrator.sweep", "orchestrator.search", "orchestrator.tracking",
                               "orchestrator.outputs", *_NOT_COMMANDS)),
    *((backend, ("orchestrator.storage",)) for backend in ("orchestrator.dispatch.base", "orchestrator.dispatch.local",
                                                           "orchestrator.dispatch.trainer_process",
                                                           "orchestrator.dispatch.ray_cluster",
                                                           "orchestrator.dispatch.analytic",
                                                           "orchestrator.dispatch.replay")),
    ("orchestrator.records", ("orchestrator.dispatch", "orchestrator.sweep", "orchestrator.storage",
                              "orchestrator.tracking", "orchestrator.outputs", "orchestrator.search",
                              "orchestrator.spec.schema", *_NOT_COMMANDS)),
    ("orchestrator.storage", ("orchestrator.sweep", "orchestrator.search", "orchestrator.dispatch",
                              "orchestrator.tracking", "orchestrator.outputs", "orchestrator.spec.schema",
                              *_NOT_COMMANDS)),
    ("orchestrator.tracking", ("orchestrator.outputs", "orchestrator.sweep", "orchestrator.dispatch",
                               "orchestrator.search", "orchestrator.storage.studies", *_NOT_COMMANDS)),
    ("orchestrator.outputs", ("orchestrator.sweep", *_NOT_COMMANDS)),
    ("orchestrator.sweep", _NOT_COMMANDS),
    ("orchestrator.spec.economics", PACKAGES),
])
def test_each_part_imports_only_what_it_may(part, forbidden):
    assert _offending(part, forbidden) == []


# ---- the storage room's boundary (issue 54) ----------------------------------------------------------------
STORE_LIBRARIES = ("sqlite3", "psycopg", "psycopg2", "sqlalchemy", "optuna.storages")
_SCHEME = re.compile(r"^(sqlite|journal|postgres(ql)?|mysql|mariadb|mssql|oracle|file|https?)(\+\w+)?(:|$)", re.I)
_PREFIX_CALLS = ("startswith", "endswith", "removeprefix")


def _names_a_scheme(node: ast.AST) -> bool:
    values = node.elts if isinstance(node, ast.Tuple) else [node]
    return any(isinstance(v, ast.Constant) and isinstance(v.value, str) and _SCHEME.match(v.value) for v in values)


def scheme_branches(source: str) -> list[int]:
    """The lines that read a URL's scheme: `.scheme`, a scheme compared or matched as a prefix, or its length taken
    to cut it off (a default value naming a URL is no branch)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "scheme":
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(_names_a_scheme(n) for n in (node.left, *node.comparators)):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and any(_names_a_scheme(a) for a in node.args) and (
                (isinstance(node.func, ast.Attribute) and node.func.attr in _PREFIX_CALLS)
                or (isinstance(node.func, ast.Name) and node.func.id == "len")):
            lines.append(node.lineno)
    return sorted(lines)


def _outside_storage() -> dict[str, Path]:
    return {name: path for name, path in modules().items() if name.startswith("orchestrator")
            and not (name == "orchestrator.storage" or name.startswith("orchestrator.storage."))}


def test_the_scheme_check_sees_what_it_judges():
    assert scheme_branches('u.startswith("sqlite:///")\nurlsplit(u).scheme\nu[len("journal:///"):]\n'
                           'u.startswith(("http://", "https://"))\nu == "postgresql"\n') == [1, 2, 3, 4, 5]
    assert scheme_branches('def f(uri: str = "sqlite:///mlflow.db"): return uri.lower() != "none"\n') == []


def test_only_the_storage_room_imports_a_store_library_or_reads_a_urls_scheme():
    """No module outside orchestrator/storage/ imports a store backend's library or branches on a URL's scheme:
    each backend's rules live in its own module there (orchestrator/storage/__init__.py maps a URL to it)."""
    libraries = sorted(f"{name} imports {m}" for name, path in _outside_storage().items()
                       for m in _imported(name, path) if any(m == lib or m.startswith(lib + ".")
                                                             for lib in STORE_LIBRARIES))
    branches = sorted(f"{path.relative_to(ROOT)}:{line}" for path in _outside_storage().values()
                      for line in scheme_branches(path.read_text(encoding="utf-8")))
    assert libraries == [] and branches == []

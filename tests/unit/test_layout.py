"""The layout of src/ppmq stays what docs/design.md draws: a handful of modules
at the top, subpackages by layer, imports flowing one way, no import cycle, and
every exception in one module, errors.py, below every layer.

Every import is read from the source with `ast`, those under TYPE_CHECKING and
inside functions included: a cycle hidden from the interpreter is still a cycle
for the reader.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "ppmq"

# What each layer may import, besides itself. The modules directly in ppmq
# (config, errors, sockets, systemd, version) are the ground every layer stands on.
BASE = "base"
MAY_IMPORT = {
    BASE: set(),
    "protocol": {BASE},
    "store": {BASE, "protocol"},
    "core": {BASE, "protocol", "store"},
    "server": {BASE, "protocol", "store", "core"},
    "client": {BASE, "protocol"},
    "bridge": {BASE, "protocol", "client"},
    "pipeline": {BASE, "protocol", "store", "client"},
    "bench": {BASE, "protocol", "client"},
    "cli": {BASE, "protocol", "store", "core", "server", "client", "bridge", "pipeline", "bench"},
}
# The state machine is sans-IO: the server owns the event loop, sockets, threads and the clock.
CORE_MAY_NOT_IMPORT = {"asyncio", "socket", "selectors", "threading", "time", "lmdb", "subprocess"}
MAX_TOP_MODULES = 12


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The modules `path` imports: ppmq's own as module names, others as their top-level name."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            # `from ppmq.store import reader` imports the module ppmq.store.reader
            for alias in node.names:
                if SRC.parent.joinpath(*f"{module}.{alias.name}".split(".")).with_suffix(".py").exists():
                    found.add(f"{module}.{alias.name}")
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules} for name, path in modules.items()}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (SRC / parts[-1]).is_dir() else BASE


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_at_most_a_dozen_modules_stand_directly_in_the_package() -> None:
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_every_subpackage_is_a_known_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert packages <= MAY_IMPORT.keys(), packages - MAY_IMPORT.keys()


def test_no_module_imports_another_that_imports_it_back() -> None:
    assert cycles(graph()) == []


def test_no_package_imports_another_that_imports_it_back() -> None:
    between: dict[str, set[str]] = defaultdict(set)
    for module, imported in graph().items():
        between[layer(module)].update(layer(m) for m in imported if layer(m) != layer(module))
    assert cycles(between) == []


def test_each_layer_imports_only_the_layers_below_it() -> None:
    upward = [
        f"{module} -> {imported}"
        for module, targets in sorted(graph().items())
        for imported in sorted(targets)
        if layer(imported) != layer(module) and layer(imported) not in MAY_IMPORT[layer(module)]
    ]
    assert upward == []


@pytest.mark.parametrize("path", sorted((SRC / "core").glob("*.py")), ids=lambda p: p.name)
def test_the_state_machine_touches_no_io_threads_or_clock(path: Path) -> None:
    assert {m.split(".")[0] for m in imports_of(path)} & CORE_MAY_NOT_IMPORT == set()


def test_the_errors_module_imports_nothing_of_ppmq() -> None:
    # Every layer raises what errors.py defines, so it stands below all of them
    assert graph()["ppmq.errors"] == set()


def exception_classes_outside_errors() -> list[str]:
    """Public classes defined outside errors.py that derive from an exception:
    Exception or BaseException, or a class of errors.py."""
    errors = ast.parse((SRC / "errors.py").read_text())
    exceptions = {"Exception", "BaseException"} | {node.name for node in errors.body if isinstance(node, ast.ClassDef)}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))}
                if bases & exceptions:
                    found.append(f"{module_name(path)}.{node.name}")
    return found


def test_every_exception_class_is_in_the_errors_module() -> None:
    # A private control-flow exception (broker.py's _Replay) may stay where it is used
    assert exception_classes_outside_errors() == []


def test_the_checks_see_a_cycle_and_an_upward_import_when_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("ppmq.store.schema") == "store" and layer("ppmq.config") == BASE
    assert "store" not in MAY_IMPORT["protocol"]


def test_the_command_line_loads_neither_zbus_parsers_nor_difflib_until_they_are_needed() -> None:
    """What `ppmq serve` imports stays in every broker's memory: zbus's HTTP and
    WebSocket parsers come with a zbus listener, difflib with a config mistake."""
    import subprocess
    import sys

    probe = "import sys, ppmq.cli.main; print(' '.join(m for m in ('h11', 'wsproto', 'difflib') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=SRC.parent).stdout.split()
    assert loaded == []

"""The shape of the code, checked with the standard library: which package may import which, no import
cycle in any package, no test scaffolding in what ships, and core files that stay small.

The layering, lowest first: `packing` (the core) <- `kubeio` (Kubernetes I/O the shells share) <- the shells
(`extender`, `nodeagent`, which never import each other) <- `vramfit` (the CLI, which dispatches `serve` and
`node` to them) <- `benchmarks` (source tree only, never shipped). A package imports only layers below its own.

The lists below record what is true today and may only shrink: a change that needs a new entry is a change
that runs against the layering, and should be made another way.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = "packing"
KUBEIO = "kubeio"
SHELLS = ("extender", "nodeagent")
CLI = "vramfit"
BENCH = "benchmarks"
SHIPPED = (CORE, KUBEIO, *SHELLS, CLI)
# Each package's layer: it may import packages of lower layers only (shells share one: neither imports the other).
LAYERS: dict[str, int] = {CORE: 0, KUBEIO: 1, **{shell: 2 for shell in SHELLS}, CLI: 3, BENCH: 4}
SCAFFOLDING = ("tests", "fakes")
MAX_CORE_LINES = 500

# Core files over MAX_CORE_LINES, with the most lines each may have: split them, then delete the entry.
LARGE_CORE_FILES: dict[str, int] = {}

# Imports inside functions in the core, (module, imported module): each hides an edge of the import graph
# from the cycle check, so none may be added.
LOCAL_CORE_IMPORTS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted (a submodule where `from pkg import sub` names one)
    local: bool  # inside a function: runs when called, not when the module is imported
    type_only: bool  # under `if TYPE_CHECKING:`
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path) -> Iterator[Import]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))

    def walk(node: ast.AST, local: bool, type_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, alias.name, local, type_only, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if (ROOT / Path(*sub.split("."))).with_suffix(".py").exists() or (
                        ROOT / Path(*sub.split(".")) / "__init__.py").exists() else base
                    yield Import(module, target, local, type_only, child.lineno)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, True, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), local, True)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), local, type_only)
            else:
                yield from walk(child, local, type_only)

    yield from walk(tree, False, False)


def _top(name: str) -> str:
    return name.split(".")[0]


def _all_imports(packages: tuple[str, ...]) -> list[Import]:
    return [imp for pkg in packages for path in _files(pkg) for imp in _imports(path)]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _edges(package: str) -> dict[str, set[str]]:
    """The package's imports of its own modules that run: function-local ones count too (a cycle they close is
    still a cycle, only deferred), `if TYPE_CHECKING:` ones do not."""
    edges: dict[str, set[str]] = {}
    for imp in _all_imports((package,)):
        if _top(imp.target) == package and not imp.type_only and imp.target != imp.module:
            edges.setdefault(imp.module, set()).add(imp.target)
    return edges


def _against_layers(imports: list[Import]) -> list[str]:
    """Imports of a package of the importer's own layer or above (another shell, the CLI, the bench)."""
    return [f"{imp.module}:{imp.line} imports {imp.target}" for imp in imports
            if _top(imp.target) in LAYERS and _top(imp.target) != _top(imp.module)
            and LAYERS[_top(imp.target)] >= LAYERS[_top(imp.module)]]


def test_core_has_no_import_cycle() -> None:
    assert _cycles(_edges(CORE)) == []


@pytest.mark.parametrize("package", [p for p in LAYERS if p != CORE])
def test_no_import_cycle(package: str) -> None:
    # Across packages the layering rules cycles out; inside each, this does.
    assert _cycles(_edges(package)) == []


def test_every_package_has_a_layer() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == set(LAYERS), f"top-level packages without a layer: {sorted(packages - set(LAYERS))}"


def test_each_package_imports_only_lower_layers() -> None:
    # Type-only and function-local imports count: each still ties the importer to the package it names.
    assert _against_layers(_all_imports(tuple(LAYERS))) == []


def test_no_shell_imports_another_shell() -> None:
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports(SHELLS)
           if _top(imp.target) in SHELLS and _top(imp.target) != _top(imp.module)]
    assert bad == []


def test_the_wheel_ships_the_layers_below_the_bench() -> None:
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert sorted(find["include"]) == sorted(f"{p}*" for p in SHIPPED)


def test_core_local_imports_only_shrink() -> None:
    local = {(imp.module, imp.target) for imp in _all_imports((CORE,))
             if imp.local and _top(imp.target) == CORE}
    assert local <= LOCAL_CORE_IMPORTS, f"new function-local imports in the core: {sorted(local - LOCAL_CORE_IMPORTS)}"


def test_core_imports_no_shell_or_bench() -> None:
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports((CORE,))
           if _top(imp.target) in LAYERS and _top(imp.target) != CORE]
    assert bad == []


def test_nothing_shipped_imports_the_bench() -> None:
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports(SHIPPED)
           if _top(imp.target) == BENCH]
    assert bad == []


def test_shipped_code_imports_no_test_scaffolding() -> None:
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports(SHIPPED)
           if _top(imp.target) in SCAFFOLDING or any(part in SCAFFOLDING for part in imp.target.split("."))]
    assert bad == []


PLANNING = ("packing.planning", "extender.planning")  # the queue planner's wings


def test_no_core_module_imports_the_planning_wing() -> None:
    """The queue planner is a wing: the core does not know it (it only uses the core)."""
    wing = lambda name: any(name == w or name.startswith(w + ".") for w in PLANNING)  # noqa: E731
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports((CORE,))
           if wing(imp.target) and not wing(imp.module)]
    assert bad == []


def test_large_core_files_only_shrink() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _files(CORE)}
    over = {name: n for name, n in sizes.items() if n > MAX_CORE_LINES}
    grown = {name: n for name, n in over.items() if n > LARGE_CORE_FILES.get(name, MAX_CORE_LINES)}
    assert grown == {}, f"core files over {MAX_CORE_LINES} lines, or larger than recorded: {grown}"


def test_the_checks_see_the_imports() -> None:
    # A walker that found nothing would pass every test above: check that it sees known edges.
    imports = _all_imports((CORE,))
    assert any(i.module == "packing.place" and i.target == "packing.fit" and not i.local for i in imports)
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    shells = _all_imports(SHELLS)
    assert any(i.module == "nodeagent.pods" and _top(i.target) == KUBEIO for i in shells)
    assert any(i.module == "extender.binder" and i.target == "extender.admission" and i.type_only for i in shells)
    # A shell importing another (even for types), kubeio importing up (even inside a function): caught; the CLI
    # importing a shell or kubeio: allowed.
    up = [Import("nodeagent.pods", "extender.kube", False, True, 1),
          Import("kubeio.files", "vramfit.cli", True, False, 2),
          Import("vramfit.cli", "nodeagent.cli", True, False, 3),
          Import("vramfit.cli", "kubeio.files", False, False, 4)]
    assert _against_layers(up) == ["nodeagent.pods:1 imports extender.kube", "kubeio.files:2 imports vramfit.cli"]

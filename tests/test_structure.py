"""The shape of the code, checked with the standard library: which package may import which, no import
cycle in the placement core, no test scaffolding in what ships, and core files that stay small.

The lists below record what is true today and may only shrink: a change that needs a new entry is a change
that runs against the layering (core <- shell <- bench), and should be made another way.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = "packing"
SHELLS = ("extender", "nodeagent", "vramfit")
BENCH = "benchmarks"
SHIPPED = (CORE, *SHELLS)
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


def test_core_has_no_import_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for imp in _all_imports((CORE,)):
        # Function-local imports count too: a cycle they close is still a cycle, only deferred.
        if _top(imp.target) == CORE and not imp.type_only and imp.target != imp.module:
            edges.setdefault(imp.module, set()).add(imp.target)
    assert _cycles(edges) == []


def test_core_local_imports_only_shrink() -> None:
    local = {(imp.module, imp.target) for imp in _all_imports((CORE,))
             if imp.local and _top(imp.target) == CORE}
    assert local <= LOCAL_CORE_IMPORTS, f"new function-local imports in the core: {sorted(local - LOCAL_CORE_IMPORTS)}"


def test_core_imports_no_shell_or_bench() -> None:
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports((CORE,))
           if _top(imp.target) in (*SHELLS, BENCH)]
    assert bad == []


def test_shells_import_no_bench() -> None:
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports(("extender", "nodeagent"))
           if _top(imp.target) == BENCH]
    assert bad == []


def test_shipped_code_imports_no_test_scaffolding() -> None:
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports(SHIPPED)
           if _top(imp.target) in SCAFFOLDING or any(part in SCAFFOLDING for part in imp.target.split("."))]
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
PLANNING = ("packing.planning", "extender.planning")  # the queue planner's wings


def test_no_core_module_imports_the_planning_wing() -> None:
    """The queue planner is a wing: the core does not know it (it only uses the core)."""
    wing = lambda name: any(name == w or name.startswith(w + ".") for w in PLANNING)  # noqa: E731
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for imp in _all_imports((CORE,))
           if wing(imp.target) and not wing(imp.module)]
    assert bad == []



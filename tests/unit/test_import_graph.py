"""The import graph of src/hongbao and src/hongbao_bench, read from the source (no import).

Rules: no cycle among imports; imports only go down the layers of the README's design
section; `hongbao` imports `hongbao_bench` only in the CLI's bench command, at call
time; no module imports another's ``_private`` name.
"""

from __future__ import annotations

import ast
import graphlib
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("hongbao", "hongbao_bench")
#: the one import of the benchmark by the service: lazy, inside `hongbao bench`
LAZY_BENCH_IMPORT = ("hongbao.cli.main", "hongbao_bench.command")

#: the layers, bottom first: a module imports only from its own layer or those below.
#: Each is a list of module names or package prefixes (``pkg.``).
LAYERS: list[tuple[str, list[str]]] = [
    ("domain", ["hongbao.domain.", "hongbao.errors"]),
    ("base", ["hongbao", "hongbao.keys", "hongbao.settings"]),
    ("storage and ledger", ["hongbao.storage.", "hongbao.ledger."]),
    (
        "service",
        [
            "hongbao.service",
            "hongbao.history",
            "hongbao.withdrawals",
            "hongbao.coalescer",
            "hongbao.durability",
            "hongbao.persister",
            "hongbao.sweeper",
            "hongbao.ratelimit",
            "hongbao.pace",
            "hongbao.audit",
            "hongbao.dead_letters",
            "hongbao.metrics",
            "hongbao.runtime",
            "hongbao.rules",
            "hongbao.webhooks.",
        ],
    ),
    ("identity", ["hongbao.identity."]),
    ("http", ["hongbao.api.", "hongbao.web."]),
    ("app", ["hongbao.app"]),
    ("serving", ["hongbao.serving."]),
    ("cli", ["hongbao.console", "hongbao.cli."]),
    ("bench", ["hongbao_bench."]),
]
#: (importer, imported) packages of one layer that must not depend that way: the two
#: doors know nothing of each other, and the web page builds on the JSON API, not back
APART = [
    ("hongbao.storage", "hongbao.ledger"),
    ("hongbao.ledger", "hongbao.storage"),
    ("hongbao.api", "hongbao.web"),
]


@dataclass(frozen=True)
class Import:
    importer: str  # module doing the import
    target: str  # project module imported (a submodule when `from pkg import sub`)
    name: str  # dotted name as imported: the module, or module.attribute
    module_level: bool  # runs on import (not inside a function, not TYPE_CHECKING only)


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((SRC / package).rglob("*.py")):
            parts = list(path.relative_to(SRC).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, modules: set[str]) -> list[Import]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def add(name: str, module_level: bool) -> None:
        target = name if name in modules else name.rpartition(".")[0]
        if target in modules:
            found.append(Import(module, target, name, module_level))

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, module_level)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package, up level - 1 packages
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in child.names:
                    add(f"{base}.{alias.name}", module_level)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, False)  # runs when called
            elif isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                visit(ast.Module(child.body, []), False)  # for the type checker only
                visit(ast.Module(child.orelse, []), module_level)
            else:
                visit(child, module_level)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), True)
    return found


def all_imports() -> list[Import]:
    files = module_files()
    return [i for m, p in files.items() for i in imports_of(m, p, set(files))]


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle as [a, b, ..., a], each importing the next, or None."""
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))
    return None


@pytest.mark.parametrize("lazy_too", [False, True], ids=["module-level", "function-level-too"])
def test_imports_have_no_cycle(lazy_too: bool) -> None:
    """Module-level imports; then with the imports inside functions too, since a lazy
    import that only dodges a cycle (a registry importing modules that import it back)
    still leaves the modules depending on each other."""
    edges: dict[str, set[str]] = {}
    for i in all_imports():
        if (i.module_level or lazy_too) and i.target != i.importer:
            edges.setdefault(i.importer, set()).add(i.target)
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_service_imports_the_bench_only_in_the_bench_command() -> None:
    found = [i for i in all_imports() if i.importer.split(".")[0] == "hongbao"]
    bench = [i for i in found if i.target.split(".")[0] == "hongbao_bench"]
    assert [(i.importer, i.target, i.module_level) for i in bench] == [(*LAZY_BENCH_IMPORT, False)]


def test_no_module_imports_another_modules_private_name() -> None:
    private = {
        (i.importer, i.name)
        for i in all_imports()
        if i.target != i.importer
        and any(part.startswith("_") and not part.startswith("__") for part in i.name.split("."))
    }
    assert not private, sorted(private)


def layer_of(module: str) -> int:
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if module == member or (member.endswith(".") and module.startswith(member)):
                return index
            if member.endswith(".") and module == member[:-1]:
                return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def test_every_module_has_a_layer() -> None:
    for module in module_files():
        layer_of(module)


def test_imports_only_go_down_the_layers() -> None:
    """At call time too: a lazy import upwards is still a dependency upwards. The CLI's
    lazy bench import is the one exception (the bench is an optional part on top)."""
    upward = [
        f"{i.importer} ({LAYERS[layer_of(i.importer)][0]}) imports {i.target} "
        f"({LAYERS[layer_of(i.target)][0]})"
        for i in all_imports()
        if layer_of(i.target) > layer_of(i.importer) and (i.importer, i.target) != LAZY_BENCH_IMPORT
    ]
    assert not upward, upward


def test_sibling_packages_stay_apart() -> None:
    crossing = [
        f"{i.importer} imports {i.target}"
        for i in all_imports()
        for here, there in APART
        if _within(i.importer, here) and _within(i.target, there)
    ]
    assert not crossing, crossing


def _within(module: str, package: str) -> bool:
    """`module` is `package` or inside it (hongbao.webhooks is not inside hongbao.web)."""
    return module == package or module.startswith(package + ".")


def test_the_reader_sees_relative_and_submodule_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import x\n\ndef f():\n    from p import b\n")
    (pkg / "b.py").write_text("import p.a\nif TYPE_CHECKING:\n    import p\n")
    modules = {"p", "p.a", "p.b"}
    got = [
        imports_of(m, pkg / f, modules)
        for m, f in (("p", "__init__.py"), ("p.a", "a.py"), ("p.b", "b.py"))
    ]
    assert got == [
        [Import("p", "p.a", "p.a", True)],
        [Import("p.a", "p.b", "p.b.x", True), Import("p.a", "p.b", "p.b", False)],
        [Import("p.b", "p.a", "p.a", True), Import("p.b", "p", "p", False)],
    ]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) in (
        ["a", "b", "c", "a"],
        ["b", "c", "a", "b"],
        ["c", "a", "b", "c"],
    )
    assert find_cycle({"a": {"b"}, "b": set()}) is None

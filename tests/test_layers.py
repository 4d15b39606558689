"""docs/structure.md's arrows: `commands -> ui -> studio -> engine (public API)`, `engine.server -> engine`,
and the engine's own floors (`server > tasks > core > plan > worker | sample > ... > kernels > leaves`).

The import contracts live in pyproject.toml's `[tool.importlinter]`; this runs them so `make test`
does, and checks what import-linter cannot: every engine package has a floor, no module imports
itself back through others, and the engine and the Studio load without Qt.
"""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

import app.engine
import app.studio

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def test_the_import_contracts_hold() -> None:
    # In a child process: import-linter's CLI configures logging with dictConfig, which disables
    # every logger that already exists, so later tests in this process would log nothing.
    report = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--config", str(PYPROJECT), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout + report.stderr  # names each broken contract and import


def test_the_server_contract_covers_every_other_engine_package() -> None:
    """A new engine package must be added to the `engine.server -> engine` contract's sources."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (server_rule,) = (c for c in contracts if c.get("forbidden_modules") == ["app.engine.server"])
    engine_modules = {f"app.engine.{m.name}" for m in pkgutil.iter_modules(app.engine.__path__)}
    assert set(server_rule["source_modules"]) == engine_modules - {"app.engine.server"}


def test_the_floors_contract_places_every_engine_package() -> None:
    """A new engine package or leaf module must be given its floor."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (floors,) = (c for c in contracts if c.get("containers") == ["app.engine"])
    placed = {name for layer in floors["layers"] for name in re.split(r"\s*[|:]\s*", layer)}
    assert placed == {m.name for m in pkgutil.iter_modules(app.engine.__path__)} - {"__init__"}


def import_cycles(package: str) -> list[set[str]]:
    """The groups of modules that import each other round (strongly connected), counting imports made at
    run time, in functions too (imports under TYPE_CHECKING run never)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []
    for root in sorted(graph.modules):  # Tarjan's algorithm, iteratively (the graph is deep)
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(group)
    return cycles


def test_no_import_cycles_in_app() -> None:
    cycles = [sorted(c) for c in import_cycles("app")]
    assert not cycles, f"modules that import each other round: {cycles}"


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch) -> None:
    package = tmp_path / "roundabout"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from roundabout import b\n")
    (package / "b.py").write_text("def f():\n    from roundabout import c\n")
    (package / "c.py").write_text("from roundabout import a\n")
    (package / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from roundabout import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("roundabout") == [{"roundabout.a", "roundabout.b", "roundabout.c"}]


def _studio_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(app.studio.__path__, "app.studio."))


def test_the_engine_server_and_every_studio_module_load_without_pyside6() -> None:
    modules = ["app.engine", "app.engine.server.app", *_studio_modules()]
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "import app.engine\n"
        "for name in app.engine.__all__:\n"  # resolve the lazy public API too
        "    getattr(app.engine, name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'PySide6')\n"
        "print(' '.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"PySide6 was loaded: {done.stdout.strip()}"
    assert len(modules) > 10  # the walk found the Studio's modules, documents/ included

"""docs/structure.md's arrows: `commands -> ui -> studio -> engine (public API)`, `engine.server -> engine`.

The import contracts live in pyproject.toml's `[tool.importlinter]`; this runs them so `make test`
does, and checks what import-linter cannot: the engine and the Studio load without Qt.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

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

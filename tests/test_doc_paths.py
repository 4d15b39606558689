"""Docs stay true: every repository path named in docs/*.md, pyproject.toml and the docstrings of app/,
tests/ and bench/ exists.

A path that starts at a top-level folder (`app/engine/plan/fit.py`, `bench/micro/`) must exist as
written. A path written relative to some package (`core/pipeline.py`, `cuda/dense.py`) or a bare
file name (`structure.md`, `fit.py`) must be the tail of a file in the repository. docs/structure.md
is held tighter: the files a package's paragraph names must be inside that package.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_PARTS = {".git", ".venv", ".venv-ref", "__pycache__", "node_modules"}
CHECKED_SUFFIXES = (".py", ".md", ".cu", ".cuh", ".h", ".sh", ".toml")
# Files of other projects that docstrings cite (their repository is named beside them).
EXTERNAL = {
    "convert_hf_to_gguf.py",  # llama.cpp's converter
    "conversion/qwen.py",  # llama.cpp's converter package (its Qwen models)
    "qwen3_next_mtp.py",  # vLLM
    "modeling_qwen3_5.py",  # transformers
    "PLATFORM.md",  # the shared notes beside the repository (/work/shared), not in it
    "cuda.h",  # the CUDA toolkit's driver API header
}
TOKEN = re.compile(r"(?<![\w./@*-])(\.?[A-Za-z_][\w.-]*(?:/[\w.-]+)*/?)(?=([*<{]?))")


def _repo_paths() -> tuple[set[str], set[str]]:
    files, dirs = set(), set()
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if SKIP_PARTS & set(rel.parts):
            continue
        (files if path.is_file() else dirs).add(rel.as_posix())
    return files, dirs


FILES, DIRS = _repo_paths()
TOP = {p.split("/")[0] for p in FILES | DIRS if "/" in p} | {".ci"}


def _texts() -> Iterator[tuple[str, str]]:
    for doc in sorted((ROOT / "docs").glob("*.md")):
        yield f"docs/{doc.name}", doc.read_text()
    yield "pyproject.toml", (ROOT / "pyproject.toml").read_text()
    for folder in ("app", "tests", "bench"):
        for source in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(source.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    doc = ast.get_docstring(node, clean=False)
                    if doc:
                        yield source.relative_to(ROOT).as_posix(), doc


def _is_tail(name: str, within: str = "") -> bool:
    """`name` is the last segments of some repository file (under `within`, if given)."""
    return any(f.endswith("/" + name) or f == name for f in FILES if f.startswith(within))


def missing_path(token: str) -> bool:
    """Whether `token` reads as a repository path that does not exist."""
    path = token.rstrip(".").rstrip("/")
    if not path or path in EXTERNAL or path.split("/")[-1] in EXTERNAL or re.fullmatch(r"\.\w+", path):
        return False  # a file of another project, or an extension alone (".py")
    if path.split("/")[0] in TOP and "/" in token:
        return path not in FILES and path not in DIRS
    if not path.endswith(CHECKED_SUFFIXES) or "://" in path:
        return False  # prose with slashes (q/k/v, tok/s), module names, runtime file names
    return not _is_tail(path)


def stale_paths(text: str) -> list[str]:
    found = []
    for match in TOKEN.finditer(text):
        token, glob = match.group(1), match.group(2)
        if glob:  # a pattern (`make_*.py`, `sm<arch>.json`): not one path
            continue
        if missing_path(token):
            found.append(token)
    return found


def test_every_path_named_in_docs_pyproject_and_docstrings_exists() -> None:
    stale = sorted({f"{where}: {token}" for where, text in _texts() for token in stale_paths(text)})
    assert not stale, "paths named that do not exist:\n  " + "\n  ".join(stale)


def test_each_structure_paragraph_names_files_of_its_own_package() -> None:
    """`**`app/engine/plan/`**` ... `fit.py`: the file is in that package, not merely somewhere."""
    text = (ROOT / "docs" / "structure.md").read_text()
    wrong = []
    for paragraph in text.split("\n\n"):
        head = re.match(r"\*\*`([\w./]+/)`", paragraph)
        if not head:
            continue
        package = head.group(1)
        for name in re.findall(r"`([\w./-]+\.(?:py|cu|cuh|json|md|sh))`", paragraph):
            if name.split("/")[0] in TOP:
                continue  # a full path, checked by the test above
            # a bare name is the package's own; a relative path may point into a neighbour
            if not _is_tail(name, package) and ("/" not in name or not _is_tail(name, "app/")):
                wrong.append(f"{package}: {name}")
    assert not wrong, "structure.md names files its packages do not hold:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize(
    ("text", "stale"),
    [
        ("see bench/gemv_sweep.py and DESIGN.md", ["bench/gemv_sweep.py", "DESIGN.md"]),
        ("see bench/micro/gemv_sweep.py, core/pipeline.py and q/k/v at 5 tok/s", []),
        ("engine/pipeline.py launches ahead", ["engine/pipeline.py"]),
        ("fixtures from tests/fixtures/make_*.py and kernels/tuning/sm<arch>.json", []),
    ],
)
def test_the_path_reader_tells_stale_paths_from_prose(text: str, stale: list[str]) -> None:
    assert stale_paths(text) == stale

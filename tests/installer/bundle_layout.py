"""installer/layout.json read as the list of paths a one-folder build must hold (shared by the installer tests)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYOUT = json.loads((REPO / "installer" / "layout.json").read_text(encoding="utf-8"))


def expected_paths(platform: str) -> dict[str, Path | None]:
    """Bundle-relative path -> the repository file it copies (None: made by the build or from a package)."""
    paths: dict[str, Path | None] = {program: None for program in LAYOUT["programs"][platform]}
    for bundle_pattern, repo_pattern in LAYOUT["mirrors"].items():
        sources = sorted(REPO.glob(repo_pattern))
        assert sources, f"layout.json mirrors {repo_pattern}, which matches nothing in the repository"
        folder = bundle_pattern.rsplit("/", 1)[0] if "*" in bundle_pattern else None
        for source in sources:
            paths[f"{folder}/{source.name}" if folder else bundle_pattern] = source
    paths.update(dict.fromkeys(LAYOUT["files"]))
    if platform == "windows":
        paths.update(dict.fromkeys(LAYOUT["windows_files"]))
    return paths


def archive_name(kind: str, version: str) -> str:
    return LAYOUT["archive"][kind].format(version=version)

"""Where the Studio keeps its files: settings, history, logs and the models folder.

The defaults follow each platform's conventions through platformdirs. Setting
`PADDOCK_HOME` puts everything under one folder instead, which is how tests (and
portable installs) keep the user's real files out of reach.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

APP_DIR_NAME = "paddock-studio"
HOME_ENV_VAR = "PADDOCK_HOME"


@dataclass(frozen=True)
class StudioPaths:
    config_dir: Path  # settings.json
    data_dir: Path  # history.sqlite3
    cache_dir: Path  # compiled kernels, hub probes: safe to delete
    models_dir: Path  # the default visible models folder (a setting may point elsewhere)

    @property
    def settings_file(self) -> Path:
        return self.config_dir / "settings.json"

    @property
    def history_db(self) -> Path:
        return self.data_dir / "history.sqlite3"

    def ensure(self) -> StudioPaths:
        """Create the folders (idempotent) and return self, for chaining."""
        for folder in (self.config_dir, self.data_dir, self.cache_dir, self.models_dir):
            folder.mkdir(parents=True, exist_ok=True)
        return self


def studio_paths(home: str | os.PathLike[str] | None = None) -> StudioPaths:
    """The Studio's folders: under `home` (or $PADDOCK_HOME) when given, else the platform's."""
    home = home if home is not None else os.environ.get(HOME_ENV_VAR) or None
    if home is not None:
        root = Path(home).expanduser().resolve()
        return StudioPaths(root / "config", root / "data", root / "cache", root / "models")

    import platformdirs

    data = platformdirs.user_data_path(APP_DIR_NAME, appauthor=False)
    return StudioPaths(
        config_dir=platformdirs.user_config_path(APP_DIR_NAME, appauthor=False),
        data_dir=data,
        cache_dir=platformdirs.user_cache_path(APP_DIR_NAME, appauthor=False),
        models_dir=data / "models",
    )

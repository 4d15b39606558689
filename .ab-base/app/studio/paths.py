"""Where the Studio keeps its files: settings, history, logs and the models folder.

The defaults follow each platform's conventions through platformdirs: XDG on Linux
(~/.config, ~/.local/share, ~/.cache), %LOCALAPPDATA% on Windows, ~/Library on macOS. Nothing
is ever written beside the program itself, so an installed bundle's folder can stay read-only.
Setting `PADDOCK_HOME` puts everything under one folder instead, which is how tests (and
portable installs) keep the user's real files out of reach: it also turns off looking for
models in other applications' folders (`other_models`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

APP_DIR_NAME = "paddock-studio"
HOME_ENV_VAR = "PADDOCK_HOME"


@dataclass(frozen=True)
class ModelSource:
    """A folder another application keeps models in, offered in place (never copied)."""

    label: str  # "LM Studio", "Hugging Face cache"
    path: Path
    layout: str  # "tree": model files anywhere below; "hub": the Hugging Face cache's models--org--name


@dataclass(frozen=True)
class StudioPaths:
    config_dir: Path  # settings.json
    data_dir: Path  # history.sqlite3
    cache_dir: Path  # compiled kernels, hub probes: safe to delete
    models_dir: Path  # the default visible models folder (a setting may point elsewhere)
    other_models: tuple[ModelSource, ...] = ()  # other applications' model folders, read only

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
        other_models=other_model_sources(),
    )


def other_model_sources(environ: dict[str, str] | None = None, user_home: Path | None = None) -> tuple[ModelSource, ...]:
    """Where LM Studio and the Hugging Face hub keep models on this machine (existing or not).

    LM Studio 0.3 uses ~/.lmstudio/models, older versions ~/.cache/lm-studio/models (the same
    under the user profile on Windows). The hub cache follows huggingface_hub's own order:
    $HF_HUB_CACHE, then $HF_HOME/hub, then $XDG_CACHE_HOME/huggingface/hub, then ~/.cache/huggingface/hub.
    """
    env = os.environ if environ is None else environ
    home = user_home or Path.home()
    if env.get("HF_HUB_CACHE"):
        hub = Path(env["HF_HUB_CACHE"])
    elif env.get("HF_HOME"):
        hub = Path(env["HF_HOME"]) / "hub"
    else:
        hub = Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "huggingface" / "hub"
    return (
        ModelSource("LM Studio", home / ".lmstudio" / "models", "tree"),
        ModelSource("LM Studio", home / ".cache" / "lm-studio" / "models", "tree"),
        ModelSource("Hugging Face cache", hub.expanduser(), "hub"),
    )

"""The models a user can load, and loading one: shared by the Models pane and the Chat pane's model picker.

Qt-free. `list_models` reads headers only, but the embedded model is assembled from its
package on first use, so call it on a worker. `load_entry` goes through `EngineHost.load`,
the transactional switch (runtime.py): the new model's files are checked before anything
is unloaded, and a failed switch leaves the old model loaded. Both panes ask will-it-fit first
(`fit_of`, on a worker: it reads free GPU memory) and, for a model predicted not to fit, ask the
user `wont_fit_question` before loading it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

from app.engine.loader.embedded import embedded_gguf_path
from app.studio.runtime import engine_config, fit_options, task_models_beside

if TYPE_CHECKING:
    from app.engine.plan.fit import FitReport
    from app.studio.library import ModelEntry, ModelLibrary
    from app.studio.runtime import EngineHost
    from app.studio.settings import Settings

EMBEDDED_NAME = "Gemma 3 270M Q4_K_M (embedded)"
EMBEDDED = "default"  # what EngineConfig calls the embedded model
LOAD_ANYWAY = "Load anyway?"  # the title of the question asked before loading a model that will not fit


def list_models(library: ModelLibrary) -> list[ModelEntry]:
    """The embedded model first (when its package is installed), then the folder's models, then those
    found in other applications' folders (LM Studio, the Hugging Face cache), offered where they are."""
    entries = []
    with contextlib.suppress(ImportError, OSError, ValueError):  # no embedded model here: the folder only
        entries.append(dataclasses.replace(library.describe(embedded_gguf_path()), name=EMBEDDED_NAME))
    return entries + library.list() + library.found_elsewhere()


def load_entry(host: EngineHost, settings: Settings, entry: ModelEntry) -> None:
    """Switch to `entry` (ValueError from the settings, e.g. a bad context length, before anything changes)."""
    model = EMBEDDED if entry.name == EMBEDDED_NAME else str(entry.path)
    host.load(engine_config(settings, model))


def fit_of(entry: ModelEntry, settings: Settings) -> FitReport | None:
    """Will-it-fit for `entry` under the engine settings it would load with (at the context it will get), with
    the task models the Studio loads beside it; None when its shape is unknown."""
    from app.studio.fit_estimate import fit_at_context

    if entry.shape is None:
        return None
    return fit_at_context(entry.shape, fit_options(settings), job=entry.job, beside=task_models_beside(settings))


def wont_fit_question(entry: ModelEntry, report: FitReport | None) -> str | None:
    """What to ask before loading a model predicted not to fit; None when nothing needs asking."""
    from app.engine.plan.fit import WONT_FIT

    if report is None or report.verdict != WONT_FIT:
        return None
    return (f"{entry.name} is predicted not to fit ({report.total / 2**30:.1f} GiB needed). "
            "Load it anyway?")

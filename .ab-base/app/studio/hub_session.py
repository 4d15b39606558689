"""The hub browser's choices without Qt: the repository listed, the files picked to download, and what of
them is already on disk (a paused download's parts count).

The HubBrowser widget asks the hub on its worker and shows what this says; the choosing itself (a GGUF
file with its shards and, when ticked, its vision projector; a safetensors repo's model files; a file
that is no model refused) and the Download button's state live here, testable without a window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.engine.plan.fit import format_bytes
from app.studio.downloads import RemoteFile, RepoListing, bytes_present


@dataclass(frozen=True)
class Choice:
    """What choosing a file picked: `note` describes it (or says why nothing was), `fit_file` is the GGUF
    file a fit check reads (None: the safetensors model), `check_fit` whether one is due at all."""

    note: str
    check_fit: bool
    fit_file: str | None = None
    vision: bool = False


@dataclass(frozen=True)
class DownloadState:
    label: str
    ready: bool  # something chosen and not all of it on disk yet (the button is enabled when idle)


class HubSession:
    def __init__(self, models_dir: Callable[[], Path]) -> None:
        self._models_dir = models_dir
        self.listing: RepoListing | None = None
        self.chosen: list[RemoteFile] = []
        self.gguf_file: str | None = None

    def open(self, listing: RepoListing | None) -> None:
        """A repository listed (None: one is being listed): nothing of it chosen yet."""
        self.listing, self.chosen, self.gguf_file = listing, [], None

    def first_choice(self) -> tuple[bool, str | None]:
        """What a fresh listing picks by itself: (True, its only GGUF model), (True, None) for a safetensors
        model's files, or (False, None) when the user must choose between GGUF files."""
        listing = self.listing
        if listing is None:
            return False, None
        only = listing.only_gguf_model()
        if only is not None:
            return True, only.path
        return (not listing.gguf_files and bool(listing.default_selection())), None

    def companion(self, path: str | None) -> RemoteFile | None:
        """The vision projector offered with the GGUF model `path`, if the repository has one."""
        return self.listing.mmproj_for(path) if self.listing is not None and path is not None else None

    def choose(self, path: str | None, with_vision: bool) -> Choice:
        """Choose the GGUF file `path` (with its shards, and its projector when `with_vision`), or None for a
        safetensors repository's model files."""
        listing = self.listing
        if listing is None:
            raise ValueError("no repository is listed to choose a file from")
        companion = self.companion(path)
        vision = companion is not None and with_vision
        if path is None:
            self.chosen, self.gguf_file = listing.default_selection(), None
        elif path in {f.path for f in listing.gguf_models}:
            self.chosen, self.gguf_file = listing.files_for(path, vision=vision), path
        else:
            self.chosen, self.gguf_file = [], None
            return Choice("That file is not a model: pick a .gguf file.", check_fit=False)
        total = sum(f.size for f in self.chosen)
        names = self.gguf_file or f"{len(self.chosen)} files (weights, config, tokenizer)"
        if companion is not None and vision:
            names += f" + {companion.path} (vision)"
        return Choice(f"Selected: {names} · {format_bytes(total)} to download", True, self.gguf_file, vision)

    def on_disk(self, file: RemoteFile) -> int:
        """How much of `file` is already in the models folder (a paused part's length counts)."""
        return bytes_present(self._models_dir(), self.listing, file) if self.listing is not None else 0

    def kept(self) -> int:
        return sum(self.on_disk(f) for f in self.chosen)

    def download_state(self) -> DownloadState:
        total = sum(f.size for f in self.chosen)
        kept = self.kept() if self.chosen else 0
        if self.chosen and kept >= total:
            label = "Downloaded"
        elif kept:
            label = f"Resume ({format_bytes(kept)} of {format_bytes(total)} here)"
        else:
            label = f"Download {format_bytes(total)}" if self.chosen else "Download"
        return DownloadState(label, bool(self.chosen) and kept < total)

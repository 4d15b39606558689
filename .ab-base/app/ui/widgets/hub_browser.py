"""Search the Hugging Face hub, pick a model's files, see whether it fits, download with progress, cancel, resume.

A GGUF model whose repo has an mmproj file beside it (its vision projector) is offered with it,
ticked by default ("with vision"): downloaded together, the model takes images.

Every hub call (search, listing, the fit probe's range requests, the download) runs on
the worker; replies to a question the user has since replaced (another repo picked)
are dropped by a sequence number. Downloads go through `HubClient.download`, which
keeps a cancelled or broken transfer as a `.part` file: pressing Download again resumes.

A hub that does not answer (no network, no such host, a silent or refused connection) is said
once, beside the search box, within HUB_WAIT_MS, with a Retry that repeats what was asked (the
search, or the listing behind a Get); the hub client tries each call once, so nothing keeps
retrying behind the note.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.engine.plan.fit import format_bytes
from app.studio.downloads import (
    HubClient,
    HubUnreachable,
    RemoteFile,
    RepoListing,
    SearchHit,
    model_folder,
)
from app.studio.fit_estimate import FitEstimate, estimate
from app.studio.hub_session import HubSession
from app.studio.recommendations import Recommendation, RecommendationFit, recommended_fits
from app.studio.runtime import fit_options, task_models_beside
from app.studio.settings import Settings
from app.studio.tasks import CancelToken, Progress, TaskResult
from app.ui.models.hub import remote_files_model, search_results_model
from app.ui.widgets.fit_view import FitView
from app.ui.widgets.recommended_view import RecommendedView
from app.ui.widgets.tables import make_table
from app.ui.workers import Worker

PROGRESS_STEPS = 1000
SEARCH_LIMIT = 30
HUB_WAIT_MS = 4000  # no reply by then: reported as offline (and abandoned); under the 5 s the README promises
# with room for a busy UI thread (the issue measured the note at 5.4 s with a 5 s timer)


class HubBrowser(QWidget):
    searched = Signal(object)  # TaskResult[list[SearchHit]]
    listed = Signal(object)  # TaskResult[RepoListing]
    fit_checked = Signal(object)  # TaskResult[FitEstimate]
    download_finished = Signal(object)  # TaskResult[list[Path]]

    def __init__(self, hub: Callable[[], HubClient], models_dir: Callable[[], Path], settings: Settings,
                 worker: Worker, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._hub, self._models_dir, self.settings, self.worker = hub, models_dir, settings, worker
        self.session = HubSession(models_dir)  # the listing, the files chosen, what of them is on disk
        self._token: CancelToken | None = None
        self._asked = 0  # sequence number of the latest listing/fit question
        self._then_download: str | None = None  # a recommended file: download it once its repo is listed
        self._search_seq = 0  # replies to an abandoned search (timed out, cancelled, replaced) are dropped
        self._search_token: CancelToken | None = None
        self._listing_asked: int | None = None  # the listing on its way (its `_asked` number), if any
        self._retry: Callable[[], None] = self.search  # what the note's Retry repeats
        self._build()
        self._update_download()
        options = fit_options(settings)
        self.worker.submit(lambda ctx: recommended_fits(options), on_done=self.recommended.show_fits, owner=self)

    def _build(self) -> None:
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search the Hugging Face hub, e.g. qwen3 0.6b")
        self.gguf_only = QCheckBox("GGUF only")
        self.gguf_only.setChecked(True)
        self.search_button = QPushButton("Search")
        self.search_note = QLabel()  # offline or unreachable: said here, beside the search box
        self.search_note.setObjectName("errorText")
        self.search_note.setWordWrap(True)
        self.search_note.hide()
        self.retry_button = QPushButton("Retry")
        self.retry_button.hide()
        self.recommended_button = QPushButton("Recommended")
        self.recommended_button.setToolTip("Chat models picked for this engine, with fit verdicts for this machine")
        self.results_model = search_results_model()
        self.results = make_table(self.results_model)
        self.recommended = RecommendedView()
        self.left = QStackedWidget()  # the recommendations until a search is made, then the results
        self.left.addWidget(self.recommended)
        self.left.addWidget(self.results)
        self.repo = QLabel("Pick a repository to see its files.")
        self.repo.setWordWrap(True)
        self.files_model = remote_files_model(self.session.on_disk)
        self.files = make_table(self.files_model)
        self.selection = QLabel()
        self.selection.setWordWrap(True)
        self.with_vision = QCheckBox()  # "Also download the vision projector …": shown when the model has one
        self.with_vision.setChecked(True)
        self.with_vision.hide()
        self.fit = FitView()
        self.progress = QProgressBar()
        self.progress.setRange(0, PROGRESS_STEPS)
        self.progress.hide()
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.download_button = QPushButton("Download")
        self.cancel_button = QPushButton("Cancel")

        search_row = QHBoxLayout()
        search_row.addWidget(self.query, 1)
        search_row.addWidget(self.gguf_only)
        search_row.addWidget(self.search_button)
        search_row.addWidget(self.recommended_button)
        note_row = QHBoxLayout()
        note_row.addWidget(self.search_note, 1)
        note_row.addWidget(self.retry_button)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.download_button)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.repo, self.files, self.selection, self.with_vision, self.fit, self.progress):
            right_layout.addWidget(widget)
        right_layout.addLayout(buttons)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.left)
        splitter.addWidget(right)
        splitter.setSizes([700, 360])  # the recommendations' verdicts, speeds and Get buttons need the room
        layout = QVBoxLayout(self)
        layout.addLayout(search_row)
        layout.addLayout(note_row)
        layout.addWidget(splitter, 1)

        self.search_button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.results.selectionModel().currentRowChanged.connect(lambda index, _: self._on_repo(index.row()))
        self.files.selectionModel().currentRowChanged.connect(lambda index, _: self._on_file(index.row()))
        self.download_button.clicked.connect(self.download)
        self.with_vision.toggled.connect(lambda _: self.session.gguf_file and self.choose(self.session.gguf_file))
        self.cancel_button.clicked.connect(self.cancel)
        self.recommended_button.clicked.connect(self.show_recommended)
        self.retry_button.clicked.connect(lambda: self._retry())
        self.recommended.download_requested.connect(self.get_recommended)
        self.recommended.fit_selected.connect(self.show_recommended_fit)

    @property
    def listing(self) -> RepoListing | None:
        return self.session.listing

    @property
    def chosen(self) -> list[RemoteFile]:
        return self.session.chosen

    def show_recommended(self) -> None:
        self.left.setCurrentWidget(self.recommended)

    def show_recommended_fit(self, fit: RecommendationFit) -> None:
        """A recommended model's row picked: its breakdown and speed in the fit panel, before any download."""
        self._asked += 1  # a fit check still on its way for another model is dropped
        self.repo.setText(f"{fit.recommendation.title}: {fit.recommendation.repo_id} · {fit.recommendation.file}")
        self.fit.show_report(fit.report, fit.speed)

    def get_recommended(self, rec: Recommendation) -> None:
        """One click: list the repository, pick the file, download it."""
        if self.downloading:
            return
        self.status.setText(f"Getting {rec.title} from {rec.repo_id}…")
        self.open_repo(rec.repo_id, then_download=rec.file)

    # -- search and listing ------------------------------------------------------------------
    @property
    def searching(self) -> bool:
        return self._search_token is not None

    def search(self) -> None:
        query, gguf_only = self.query.text().strip(), self.gguf_only.isChecked()
        self._abandon_search()
        self._show_search_note(None)
        self._retry = self.search
        self.left.setCurrentWidget(self.results)
        self.status.setText(f"Searching for “{query}”…" if query else "Listing popular models…")
        self._search_seq += 1
        seq, hub = self._search_seq, self._hub()
        self._search_token = CancelToken()
        self.worker.submit(lambda ctx: hub.search(query, limit=SEARCH_LIMIT, gguf_only=gguf_only),
                           on_done=lambda result: self._on_search(result, seq, hub.endpoint), owner=self,
                           token=self._search_token)
        QTimer.singleShot(HUB_WAIT_MS, self, lambda: self._search_timed_out(seq, hub.endpoint))
        self._update_download()

    def _search_timed_out(self, seq: int, endpoint: str) -> None:
        if seq != self._search_seq or not self.searching:
            return
        self._abandon_search()  # a late reply is dropped; the worker's one request ends on its own timeout
        self._show_offline(endpoint, "", self.search)

    def _show_offline(self, endpoint: str, what: str, retry: Callable[[], None]) -> None:
        """The hub does not answer: said beside the search box, with a Retry that does `retry`."""
        self.status.setText("")
        self._retry = retry
        self._show_search_note(f"{what}The hub at {endpoint} does not answer (offline, or unreachable from here). "
                               "The recommended models are listed without it.")
        self.show_recommended()

    def _abandon_search(self) -> None:
        if self._search_token is not None:
            self._search_token.cancel()
        self._search_token = None
        self._search_seq += 1
        self._update_download()

    def _show_search_note(self, text: str | None) -> None:
        self.search_note.setText(text or "")
        self.search_note.setVisible(bool(text))
        self.retry_button.setVisible(bool(text))

    def _on_search(self, result: TaskResult[list[SearchHit]], seq: int, endpoint: str) -> None:
        if seq != self._search_seq:
            return
        self._search_token = None
        self._update_download()
        if isinstance(result.error, HubUnreachable):
            self._show_offline(endpoint, "", self.search)
        elif result.ok:
            self.results_model.replace(result.value or [])
            self.status.setText(f"{len(result.value or [])} repositories found." if result.value else
                                "Nothing found: try other words, or untick GGUF only.")
        else:
            self.status.setText("")
            self._show_search_note(result.error_message or "The search failed.")
        self.searched.emit(result)

    def open_repo(self, repo_id: str, then_download: str | None = None) -> None:
        """List `repo_id`'s files (also what picking it in the results does); then download `then_download`."""
        self._asked += 1
        asked = self._asked
        self._then_download = then_download
        self.session.open(None)
        self.with_vision.setChecked(True)  # each repo's model comes with its vision unless unticked
        self.with_vision.hide()
        self.files_model.replace([])
        self.repo.setText(f"Listing {repo_id}…")
        self.fit.clear("")
        self._show_search_note(None)
        self._update_download()
        hub, self._listing_asked = self._hub(), asked

        def offline() -> None:  # the note, with a Retry that lists (and gets) the repo again
            self.repo.setText("")
            self._show_offline(hub.endpoint, f"{repo_id} cannot be listed. ",
                               lambda: self.open_repo(repo_id, then_download))

        self.worker.submit(lambda ctx: hub.list_files(repo_id),
                           on_done=lambda result: self._on_listing(result, asked, offline), owner=self)
        QTimer.singleShot(HUB_WAIT_MS, self, lambda: self._listing_timed_out(asked, offline))

    def _listing_timed_out(self, asked: int, offline: Callable[[], None]) -> None:
        if asked != self._asked or self._listing_asked != asked:
            return  # answered, or replaced by another question
        self._asked += 1  # the late reply is dropped
        self._listing_asked = self._then_download = None
        offline()

    def _on_repo(self, row: int) -> None:
        hit = self.results_model.row(row)
        if hit is not None:
            self.open_repo(hit.repo_id)

    def _on_listing(self, result: TaskResult[RepoListing], asked: int, offline: Callable[[], None]) -> None:
        if asked != self._asked:
            return
        self._listing_asked = None
        wanted, self._then_download = self._then_download, None
        if isinstance(result.error, HubUnreachable):
            offline()
            self.listed.emit(result)
            return
        if not result.ok or result.value is None:
            self.repo.setText(result.error_message or "")
            if wanted:
                self.status.setText(f"Could not reach the hub: {result.error_message}")
            self.listed.emit(result)
            return
        listing = result.value
        self.session.open(listing)
        self.files_model.replace(listing.files)
        self.repo.setText(f"{listing.repo_id} · revision {listing.revision[:10]} · {len(listing.files)} files")
        pick, path = self.session.first_choice()
        if pick:
            self.choose(path)
        else:
            self.selection.setText("Pick the GGUF file to download (each is one quantization of the model).")
        if wanted:
            self.choose(wanted)
            self.download()
        self.listed.emit(result)

    # -- choosing what to download ---------------------------------------------------------------
    def choose(self, path: str | None) -> None:
        """Choose the GGUF file `path` (with its shards), or None for a safetensors repo's model files."""
        if self.listing is None:
            return
        companion = self.session.companion(path)
        self.with_vision.setVisible(companion is not None)
        if companion is not None:
            self.with_vision.setText(f"Also download its vision projector, {companion.path} "
                                     f"({format_bytes(companion.size)}): the model then reads images")
        choice = self.session.choose(path, self.with_vision.isChecked())
        self.selection.setText(choice.note)
        if not choice.check_fit:
            self.with_vision.hide()
            self.fit.clear("")
            self._update_download()
            return
        self._update_download()
        self._check_fit(self.listing, choice.fit_file, choice.vision)

    def _on_file(self, row: int) -> None:
        file = self.files_model.row(row)
        if file is not None and self.listing is not None:
            self.choose(file.path if self.listing.gguf_files else None)

    def _check_fit(self, listing: RepoListing, gguf_file: str | None, vision: bool = False) -> None:
        self._asked += 1
        asked = self._asked
        options = fit_options(self.settings)
        self.fit.show_pending("Reading the model's shape from the hub (a few hundred KB)…")

        settings = self.settings

        def probe(ctx: object) -> FitEstimate:
            model = self._hub().probe_model(listing, gguf_file, vision=vision)
            return estimate(model.shape, options, job=model.job, beside=task_models_beside(settings))

        self.worker.submit(probe, on_done=lambda result: self._on_fit(result, asked), owner=self)

    def _on_fit(self, result: TaskResult[FitEstimate], asked: int) -> None:
        if asked != self._asked:
            return
        self.fit.show_result(result)
        self.fit_checked.emit(result)

    # -- downloading ------------------------------------------------------------------------------
    @property
    def downloading(self) -> bool:
        return self._token is not None

    def download(self) -> None:
        if self.downloading or not self.chosen or self.listing is None:
            return
        listing, files, folder = self.listing, list(self.chosen), self._models_dir()
        self._token = CancelToken()
        self.progress.setValue(0)
        self.progress.show()
        self.status.setText("Starting the download…")
        self.worker.submit(
            lambda ctx: self._hub().download(listing, files, folder, progress=ctx.progress_callback(),
                                             token=ctx.token),
            on_progress=self._on_progress, on_done=self._on_download, owner=self, token=self._token)
        self._update_download()

    def cancel(self) -> None:
        """Stop the download, or the search in progress (its reply, when it comes, is dropped)."""
        if self._token is not None:
            self._token.cancel()
        elif self.searching:
            self._abandon_search()
            self.status.setText("Search cancelled.")

    def shutdown(self) -> None:
        self.cancel()

    def _on_progress(self, progress: Progress) -> None:
        if self._token is None:
            return
        self.progress.setValue(int((progress.fraction or 0) * PROGRESS_STEPS))
        total = format_bytes(int(progress.total)) if progress.total else "?"
        self.status.setText(f"{format_bytes(int(progress.done))} of {total} · {progress.message}")

    def _on_download(self, result: TaskResult[list[Path]]) -> None:
        self._token = None
        self.progress.hide()
        if result.ok and self.listing is not None:
            folder = model_folder(self._models_dir(), self.listing.repo_id)
            self.status.setText(f"Downloaded and verified: {folder}")
        elif result.cancelled:
            self.status.setText(f"Paused with {format_bytes(self.session.kept())} kept: Download resumes where it stopped.")
        else:
            self.status.setText(f"Download failed: {result.error_message}")
        self.files_model.replace(self.listing.files if self.listing else [])  # refresh "On disk"
        self._update_download()
        self.download_finished.emit(result)

    def _update_download(self) -> None:
        state = self.session.download_state()
        self.download_button.setText(state.label)
        self.download_button.setEnabled(state.ready and not self.downloading)
        self.cancel_button.setEnabled(self.downloading or self.searching)


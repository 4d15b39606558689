"""The Transcribe pane: drop an audio file, watch it being transcribed, read it word by word, export it.

Transcription runs on a worker (`Worker.submit`) with a progress bar and Cancel; the
model, its device, exports and word lookup are `TranscriptionService`'s
(app/studio/transcription.py). Segments are listed with their times; the transcript's
words light up as the position slider moves, and clicking a segment or a word moves the
slider to it.
"""

from __future__ import annotations

import bisect
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QMouseEvent, QPalette, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSlider,
    QSplitter,
    QTextBrowser,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.studio.settings import SettingsError
from app.studio.tasks import Progress, TaskContext, TaskHandle, TaskResult
from app.studio.transcription import (
    AUDIO_EXTENSIONS,
    TranscriptionService,
    export_transcript,
    is_audio_file,
    word_at,
)
from app.ui.widgets.dialogs import Dialogs
from app.ui.widgets.drop_zone import DropZone, FileChooser, FileDropFilter, choose_files
from app.ui.widgets.feedback import error_label, show_error, show_progress
from app.ui.widgets.feedback import progress_row as progress_row_widgets
from app.ui.workers import Worker

if TYPE_CHECKING:
    from app.studio.settings import Settings
    from app.studio.transcription import Transcript

HAS_PLAYBACK = importlib.util.find_spec("PySide6.QtMultimedia") is not None  # not in PySide6-Essentials
FILE_FILTERS = f"Audio ({' '.join('*' + suffix for suffix in sorted(AUDIO_EXTENSIONS))});;All files (*)"
# (button label, file suffix, export format, file dialog filter)
EXPORTS = (("TXT", ".txt", "text", "Text (*.txt)"), ("SRT", ".srt", "srt", "SubRip subtitles (*.srt)"),
           ("VTT", ".vtt", "vtt", "WebVTT subtitles (*.vtt)"))


def clock(seconds: float) -> str:
    """'01:02.35': minutes, seconds and hundredths (hours only when there are some)."""
    hundredths = round(seconds * 100)
    hours, rest = divmod(hundredths, 360_000)
    minutes, rest = divmod(rest, 6000)
    text = f"{minutes:02d}:{rest // 100:02d}.{rest % 100:02d}"
    return f"{hours}:{text}" if hours else text


@dataclass(frozen=True)
class TranscribedFile:
    path: Path
    transcript: Transcript
    seconds: float  # wall-clock time the transcription took


class TimedTranscriptView(QTextBrowser):
    """The transcript, a paragraph per segment; one word at a time can be highlighted, and words are clickable."""

    word_clicked = Signal(int)  # index into transcript.words

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("The transcript appears here, word by word.")
        self._starts: list[int] = []  # character position where each word begins
        self._ends: list[int] = []
        self.highlighted: int | None = None

    def show_transcript(self, transcript: Transcript | None) -> None:
        self.clear()
        self._starts, self._ends, self.highlighted = [], [], None
        if transcript is None:
            return
        cursor = QTextCursor(self.document())
        spacing = QTextBlockFormat()
        spacing.setBottomMargin(8)
        for number, segment in enumerate(transcript.segments):
            if number:
                cursor.insertBlock(spacing)
            else:
                cursor.setBlockFormat(spacing)
            if not segment.words:  # a model run without word timestamps: the segment's text, unclickable
                cursor.insertText(segment.text.strip())
            for position, word in enumerate(segment.words):
                if position:
                    cursor.insertText(" ")
                self._starts.append(cursor.position())
                cursor.insertText(word.word, QTextCharFormat())
                self._ends.append(cursor.position())

    def highlight(self, index: int | None) -> None:
        self.highlighted = index
        if index is None or not 0 <= index < len(self._starts):
            self.setExtraSelections([])
            return
        selection = QTextEdit.ExtraSelection()
        selection.cursor = QTextCursor(self.document())
        selection.cursor.setPosition(self._starts[index])
        selection.cursor.setPosition(self._ends[index], QTextCursor.MoveMode.KeepAnchor)
        selection.format.setBackground(self.palette().color(QPalette.ColorRole.Highlight))
        selection.format.setForeground(self.palette().color(QPalette.ColorRole.HighlightedText))
        self.setExtraSelections([selection])

    def word_at_position(self, position: int) -> int | None:
        index = bisect.bisect_right(self._starts, position) - 1
        if index >= 0 and position <= self._ends[index]:
            return index
        return None

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        super().mouseReleaseEvent(event)
        if event.button() == Qt.MouseButton.LeftButton and not self.textCursor().hasSelection():
            index = self.word_at_position(self.cursorForPosition(event.position().toPoint()).position())
            if index is not None:
                self.word_clicked.emit(index)


class TranscribePane(QWidget):
    transcription_finished = Signal(object)  # TaskResult[TranscribedFile]

    def __init__(self, service: TranscriptionService, worker: Worker, dialogs: Dialogs,
                 chooser: FileChooser = choose_files, parent: QWidget | None = None,
                 settings: Settings | None = None) -> None:
        """`settings`: where the chosen model is kept (`transcribe.model`: the next start loads it, and
        will-it-fit counts a speech LLM beside the chat model); None keeps the choice for this pane only."""
        super().__init__(parent)
        self.service, self.worker, self.dialogs, self.settings = service, worker, dialogs, settings
        self.result: TranscribedFile | None = None
        self._job: TaskHandle[TranscribedFile] | None = None
        self._build(chooser)
        self._show_model()

    # -- layout ---------------------------------------------------------------------------
    def _build(self, chooser: FileChooser) -> None:
        self.drop_zone = DropZone("Drop an audio file here (WAV, MP3, M4A, OGG, FLAC…) to transcribe it on this "
                                  "computer.", FILE_FILTERS, multiple=False, chooser=chooser)
        self.model_label = QLabel("Model: …")
        self.model_label.setObjectName("mutedText")
        self.model_button = QPushButton("Choose model…")
        self.model_button.setToolTip(
            "A CTranslate2 Whisper folder, or a speech LLM folder: Qwen3-ASR, Granite Speech or Gemma 4 with audio"
        )
        model_row = QHBoxLayout()
        model_row.addWidget(self.model_label, 1)
        model_row.addWidget(self.model_button)
        progress_row, self.progress, self.progress_label, self.cancel_button = progress_row_widgets()
        self.error = error_label(selectable=True)

        self.segments = QListWidget()
        self.segments.setWordWrap(True)
        self.words = TimedTranscriptView()
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(_column(QLabel("<b>Segments</b>"), self.segments))
        splitter.addWidget(_column(QLabel("<b>Transcript</b>"), self.words))
        splitter.setSizes([480, 640])

        self.position = QSlider(Qt.Orientation.Horizontal)
        self.position_label = QLabel("00:00.00")
        self.selection_label = QLabel()
        position_row = QHBoxLayout()
        position_row.addWidget(QLabel("Position"))
        position_row.addWidget(self.position, 1)
        position_row.addWidget(self.position_label)
        self.export_buttons: dict[str, QPushButton] = {}
        export_row = QHBoxLayout()
        export_row.addWidget(self.selection_label, 1)
        export_row.addWidget(QLabel("Export:"))
        for label, suffix, _format, _filters in EXPORTS:
            button = QPushButton(label)
            button.clicked.connect(lambda _=False, s=suffix: self.export(s))
            self.export_buttons[suffix] = button
            export_row.addWidget(button)

        layout = QVBoxLayout(self)
        layout.addWidget(self.drop_zone)
        layout.addLayout(model_row)
        layout.addLayout(progress_row)
        layout.addWidget(self.error)
        layout.addWidget(splitter, 1)
        self.position_row = _row_widget(position_row)
        # No audio playback without QtMultimedia (PySide6-Essentials lacks it): a "Position" slider that plays
        # nothing misleads, so it is hidden; segments and words still select each other.
        self.position_row.setVisible(HAS_PLAYBACK)
        layout.addWidget(self.position_row)
        layout.addLayout(export_row)

        self.drop_zone.files_dropped.connect(self.transcribe_files)
        self.drops = FileDropFilter(self)  # a drop that misses the box still counts
        self.drops.watch(self, self.segments, self.words)
        self.drops.files_dropped.connect(self.transcribe_files)
        self.cancel_button.clicked.connect(self.cancel)
        self.model_button.clicked.connect(self.choose_model)
        self.segments.currentRowChanged.connect(self.select_segment)
        # a click on the segment the position already selected changes no row, and should still jump
        self.segments.itemClicked.connect(lambda item: self.select_segment(self.segments.row(item)))
        self.words.word_clicked.connect(self.select_word)
        self.position.valueChanged.connect(self._on_position)
        self._show_progress(None)
        self._show_error(None)
        self._show_result(None)

    @property
    def busy(self) -> bool:
        return self._job is not None

    # -- transcription --------------------------------------------------------------------------
    def transcribe_files(self, paths: list[Path]) -> None:
        """Transcribe the first dropped file (one file at a time)."""
        if self.busy:
            self._show_error("A file is being transcribed: wait for it, or cancel.")
            return
        if not paths:
            return
        path = paths[0]
        if not is_audio_file(path):
            self._show_error(f"{path.name} is not an audio file Paddock can read "
                             "(try WAV, MP3, M4A, OGG, OPUS, FLAC or WEBM).")
            return
        self._show_error(None)  # the transcript on screen stays until a new one replaces it
        self._show_progress(Progress(0, None, f"Loading the model and reading {path.name}…"))
        service = self.service

        def job(ctx: TaskContext) -> TranscribedFile:
            started = time.monotonic()
            transcript = service.transcribe_file(
                path, progress=lambda fraction: ctx.report(fraction, 1.0, f"Transcribing {path.name}…"),
                cancel=lambda: ctx.token.cancelled)
            return TranscribedFile(path, transcript, time.monotonic() - started)

        self._job = self.worker.submit(job, on_done=self._on_done, on_progress=self._show_progress, owner=self)
        self.drop_zone.setEnabled(False)

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()

    def _on_done(self, result: TaskResult[TranscribedFile]) -> None:
        self._job = None
        self.drop_zone.setEnabled(True)
        self._show_progress(None)
        if result.cancelled:
            self.progress_label.setText("Cancelled.")
            self.progress_label.show()
        elif result.error is not None or result.value is None:
            self._show_error(result.error_message)
        else:
            self._show_result(result.value)
        self._show_model()
        self.transcription_finished.emit(result)

    def _show_result(self, result: TranscribedFile | None) -> None:
        self.result = result
        transcript = result.transcript if result else None
        self.segments.clear()
        self.words.show_transcript(transcript)
        self.selection_label.clear()
        for button in self.export_buttons.values():
            button.setEnabled(transcript is not None)
        self.position.setEnabled(transcript is not None)
        self.position.setRange(0, round(transcript.duration * 1000) if transcript else 0)
        self.position.setValue(0)
        self._on_position(0)
        if result is None or transcript is None:
            return
        for segment in transcript.segments:
            item = QListWidgetItem(f"{clock(segment.start)} → {clock(segment.end)}   {segment.text.strip()}")
            item.setData(Qt.ItemDataRole.UserRole, segment.id)
            self.segments.addItem(item)
        words = len(transcript.words)
        self.progress_label.setText(
            f"{result.path.name}: {transcript.duration:.1f} s of audio in {result.seconds:.1f} s · "
            f"{words} word{'' if words == 1 else 's'} · language {transcript.language}")
        self.progress_label.show()

    # -- reading along --------------------------------------------------------------------------
    def select_segment(self, row: int) -> None:
        """Show the segment's time and move the position to its start."""
        if self.result is None or not 0 <= row < len(self.result.transcript.segments):
            return
        segment = self.result.transcript.segments[row]
        self.selection_label.setText(f"Segment {row + 1}: {clock(segment.start)} → {clock(segment.end)}")
        self.position.setValue(round(segment.start * 1000))

    def select_word(self, index: int) -> None:
        if self.result is None or not 0 <= index < len(self.result.transcript.words):
            return
        word = self.result.transcript.words[index]
        self.selection_label.setText(f"“{word.word}”: {clock(word.start)} → {clock(word.end)}")
        self.position.setValue(round(word.start * 1000))
        self.words.highlight(index)  # the slider may already have been there: highlight anyway

    def _on_position(self, milliseconds: int) -> None:
        seconds = milliseconds / 1000
        transcript = self.result.transcript if self.result else None
        duration = clock(transcript.duration) if transcript else "00:00.00"
        self.position_label.setText(f"{clock(seconds)} / {duration}")
        if transcript is None:
            return
        word = word_at(transcript, seconds)
        self.words.highlight(None if word is None else next(
            i for i, candidate in enumerate(transcript.words) if candidate is word))
        row = next((n for n, s in enumerate(transcript.segments) if s.start <= seconds < s.end), -1)
        if row >= 0 and row != self.segments.currentRow():
            self.segments.blockSignals(True)  # following the position is not the user picking a segment
            self.segments.setCurrentRow(row)
            self.segments.blockSignals(False)

    # -- export ---------------------------------------------------------------------------------
    def export(self, suffix: str) -> Path | None:
        """Ask where to save (".txt", ".srt" or ".vtt"), then write the transcript in that format."""
        if self.result is None:
            return None
        _label, _suffix, response_format, filters = next(e for e in EXPORTS if e[1] == suffix)
        suggested = str(self.result.path.with_suffix(suffix))
        chosen = self.dialogs.save_path(self, f"Export the transcript as {suffix[1:].upper()}", suggested, filters)
        if not chosen:
            return None
        path = Path(chosen)
        if not path.suffix:
            path = path.with_suffix(suffix)
        try:
            written = export_transcript(self.result.transcript, path, response_format)
        except (OSError, ValueError) as exc:
            self._show_error(f"Could not export to {path.name}: {exc}")
            return None
        self._show_error(None)
        self.selection_label.setText(f"Saved {written}")
        return written

    def choose_model(self) -> None:
        """Another model folder for the next transcriptions: Whisper (faster-whisper), Qwen3-ASR, Granite Speech
        or Gemma 4 with an audio tower."""
        chosen = self.dialogs.open_folder(
            self, "Choose a Whisper, Qwen3-ASR, Granite Speech or Gemma 4 (with audio) model folder"
        )
        if chosen is None or self.busy:
            return
        self.service.set_model(chosen)
        self.model_label.setText("Model: loading…")
        self._remember_model(chosen)
        self._show_model()

    def _remember_model(self, chosen: str) -> None:
        if self.settings is None:
            return
        try:
            self.settings.set("transcribe.model", chosen)
            self.settings.save()
        except (SettingsError, OSError) as exc:
            self._show_error(f"The model is in use but was not saved in the settings: {exc}")

    # -- state ----------------------------------------------------------------------------------
    def _show_model(self) -> None:
        """The model and device: known once the service has built its transcriber (cheap; weights load later)."""
        self.worker.submit(lambda ctx: self.service.transcriber(), on_done=self._on_model, owner=self)

    def _on_model(self, result: TaskResult[object]) -> None:
        transcriber = result.value
        if transcriber is None:
            self.model_label.setText(f"Model: not available ({result.error_message})")
            return
        name = getattr(transcriber, "model_name", "whisper")
        device = str(getattr(transcriber, "device", "cpu"))
        compute = getattr(transcriber, "compute_type", "")
        where = "GPU" if device == "cuda" else "CPU"
        state = "loaded" if getattr(transcriber, "loaded", False) else "loads on first use"
        self.model_label.setText(f"Model: {name} · Device: {where}{f' ({compute})' if compute else ''} · {state}")

    def _show_progress(self, progress: Progress | None) -> None:
        show_progress(self.progress, self.progress_label, self.cancel_button, progress)

    def _show_error(self, text: str | None) -> None:
        show_error(self.error, text)

    def shutdown(self) -> None:
        self.cancel()



def _row_widget(row: QHBoxLayout) -> QWidget:
    holder = QWidget()
    holder.setLayout(row)
    row.setContentsMargins(0, 0, 0, 0)
    return holder


def _column(*widgets: QWidget) -> QWidget:
    holder = QWidget()
    layout = QVBoxLayout(holder)
    layout.setContentsMargins(0, 0, 0, 0)
    for widget in widgets:
        layout.addWidget(widget)
    return holder

"""The settings dialog, generated from `app.studio.settings.SETTINGS`: one editor per declared setting.

Nothing here names a particular setting: a new entry in SETTINGS appears in the dialog
with the editor its kind calls for, its label, its help as a tooltip, its limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.studio.secrets import (
    HF_TOKEN,
    OPENROUTER_API_KEY,
    REMOTE_ENGINE_API_KEY,
    SERVER_API_KEY,
    SecretStore,
    generate_api_key,
)
from app.studio.settings import SETTINGS, Setting, Settings, SettingsError
from app.ui.widgets.dialogs import Dialogs
from app.ui.widgets.lan_guard import GENERATE, ask_lan_without_key
from app.ui.widgets.wheel_guard import guard_wheel

INT_LIMIT = 2**31 - 1  # QSpinBox holds a C int


class _Editor:
    """One setting's widget with a uniform get/set."""

    def __init__(self, widget: QWidget, get: Callable[[], Any], put: Callable[[Any], None]) -> None:
        self.widget, self.get, self.put = widget, get, put


def _bool_editor(setting: Setting) -> _Editor:
    box = QCheckBox()
    return _Editor(box, box.isChecked, lambda v: box.setChecked(bool(v)))


def _int_editor(setting: Setting) -> _Editor:
    spin = QSpinBox()
    spin.setRange(int(setting.minimum if setting.minimum is not None else -INT_LIMIT),
                  int(min(setting.maximum if setting.maximum is not None else INT_LIMIT, INT_LIMIT)))
    if setting.minimum == 0:
        spin.setSpecialValueText("auto (0)")  # every 0-minimum int setting means "the model's own / auto"
    return _Editor(spin, spin.value, lambda v: spin.setValue(int(v)))


def _float_editor(setting: Setting) -> _Editor:
    spin = QDoubleSpinBox()
    spin.setDecimals(2)
    spin.setSingleStep(0.05)
    spin.setRange(setting.minimum if setting.minimum is not None else -1e9,
                  setting.maximum if setting.maximum is not None else 1e9)
    return _Editor(spin, spin.value, lambda v: spin.setValue(float(v)))


def _choice_editor(setting: Setting) -> _Editor:
    combo = QComboBox()
    combo.addItems(list(setting.choices))
    return _Editor(combo, combo.currentText, lambda v: combo.setCurrentText(str(v)))


def _text_editor(setting: Setting) -> _Editor:
    line = QLineEdit()
    line.setPlaceholderText(str(setting.default) or "(empty)")
    return _Editor(line, line.text, lambda v: line.setText(str(v)))


def _path_editor(setting: Setting) -> _Editor:
    line = QLineEdit()
    line.setPlaceholderText("(default)")
    browse = QPushButton("Browse…")
    browse.clicked.connect(lambda: line.setText(QFileDialog.getExistingDirectory(line, setting.label) or line.text()))
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(line, 1)
    layout.addWidget(browse)
    return _Editor(row, line.text, lambda v: line.setText(str(v)))


EDITORS: dict[str, Callable[[Setting], _Editor]] = {
    "bool": _bool_editor, "int": _int_editor, "float": _float_editor, "choice": _choice_editor,
    "str": _text_editor, "path": _path_editor,
}


class SettingsForm(QWidget):
    """Every declared setting, grouped by section; `apply()` checks and saves them all or none."""

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.editors: dict[str, _Editor] = {}
        layout = QVBoxLayout(self)
        sections: dict[str, QFormLayout] = {}
        for setting in SETTINGS:
            if setting.section not in sections:
                group = QGroupBox(setting.section)
                sections[setting.section] = QFormLayout(group)
                layout.addWidget(group)
            editor = EDITORS[setting.kind](setting)
            editor.widget.setToolTip(setting.help)
            editor.widget.setObjectName(f"setting:{setting.key}")
            sections[setting.section].addRow(setting.label, editor.widget)
            self.editors[setting.key] = editor
        self.problems = QLabel()
        self.problems.setObjectName("errorText")
        self.problems.setWordWrap(True)
        layout.addWidget(self.problems)
        layout.addStretch(1)
        self.reload()

    def reload(self) -> None:
        for key, editor in self.editors.items():
            editor.put(self.settings.get(key))
        self.problems.setText("\n".join(self.settings.problems))

    def values(self) -> dict[str, Any]:
        return {key: editor.get() for key, editor in self.editors.items()}

    def apply(self) -> bool:
        """Save the edited values; on a bad value nothing changes and the problem is shown. True when saved."""
        changed = {k: v for k, v in self.values().items() if v != self.settings.get(k)}
        try:
            self.settings.update(changed)
            self.settings.save()
        except (SettingsError, OSError) as exc:
            self.problems.setText(str(exc))
            return False
        self.problems.clear()
        return True


SECRETS = ((OPENROUTER_API_KEY, "OpenRouter API key", "For OpenRouter columns in Compare (openrouter.ai/keys)."),
           (HF_TOKEN, "Hugging Face token", "For gated or private models on the hub (huggingface.co/settings/tokens)."),
           (REMOTE_ENGINE_API_KEY, "Remote engine API key", "Sent to the remote engine (Engine → Remote engine)."))


class SecretsForm(QGroupBox):
    """API keys: typed here, kept in the OS keyring (or the settings file, with a warning). Never shown back."""

    def __init__(self, secrets: SecretStore, parent: QWidget | None = None) -> None:
        super().__init__("Keys", parent)
        self.secrets = secrets
        self.fields: dict[str, QLineEdit] = {}
        layout = QFormLayout(self)
        for name, label, help_text in SECRETS:
            field = QLineEdit()
            field.setEchoMode(QLineEdit.EchoMode.Password)
            field.setToolTip(help_text)
            field.setPlaceholderText("stored (type to replace)" if secrets.get(name) else "not set")
            layout.addRow(label, field)
            self.fields[name] = field
        if secrets.warning:
            warning = QLabel(secrets.warning)
            warning.setObjectName("hintText")
            warning.setWordWrap(True)
            layout.addRow(warning)

    def apply(self) -> None:
        """Store the keys that were typed; fields left empty keep what is stored."""
        for name, field in self.fields.items():
            if field.text().strip():
                self.secrets.set(name, field.text())
                field.clear()


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, secrets: SecretStore | None = None, parent: QWidget | None = None,
                 dialogs: Dialogs | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.secrets, self.dialogs = secrets, dialogs or Dialogs()
        self.form = SettingsForm(settings)
        self.keys = SecretsForm(secrets) if secrets is not None else None
        if self.keys is not None:
            self.form.layout().insertWidget(self.form.layout().count() - 2, self.keys)  # before problems, stretch
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._save)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(scroll)
        layout.addWidget(buttons)
        self.resize(560, 640)
        guard_wheel(self)  # scrolling the dialog must not change the field under the pointer

    def _save(self) -> None:
        if not self._lan_confirmed() or not self.form.apply():
            return
        if self.keys is not None:
            try:
                self.keys.apply()
            except Exception as exc:  # a keyring backend's own failure, shown as a sentence
                self.form.problems.setText(f"A key could not be stored: {exc}")
                return
        self.accept()

    def _lan_confirmed(self) -> bool:
        """Opening the API to the network without a key is asked about first; False: do not save."""
        editors, settings = self.form.editors, self.form.settings
        if editors["server.bind"].get() != "lan" or settings.get("server.bind") == "lan":
            return True
        key = self.secrets.get(SERVER_API_KEY) if self.secrets is not None else None
        if editors["server.require_api_key"].get() and key:
            return True
        answer = ask_lan_without_key(self.dialogs, self)
        if answer == GENERATE and self.secrets is not None:
            if not key:
                self.secrets.set(SERVER_API_KEY, generate_api_key())
            editors["server.require_api_key"].put(True)
        return answer is not None

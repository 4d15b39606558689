"""Sampling settings of a conversation (`ChatSettings`), one spin box per field, declared as a table."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QSpinBox, QWidget

from app.studio.chat import ChatSettings


@dataclass(frozen=True)
class Field:
    name: str  # the ChatSettings attribute
    label: str
    minimum: float
    maximum: float
    step: float = 1
    decimals: int = 0  # 0: a whole number
    help: str = ""
    special: str = ""  # shown at the minimum instead of the number ("off", "random")


FIELDS = (
    Field("temperature", "Temperature", 0.0, 2.0, 0.05, 2, "0 always picks the likeliest token."),
    Field("top_p", "Top p", 0.01, 1.0, 0.05, 2, "Sample from the smallest set of tokens holding this probability."),
    Field("top_k", "Top k", 0, 1000, 1, 0, "Sample from the k likeliest tokens only.", "off"),
    Field("max_tokens", "Max answer tokens", 1, 1_000_000, 16, 0, "The longest answer, in tokens."),
    Field("repetition_penalty", "Repetition penalty", 0.5, 2.0, 0.05, 2, "Above 1 discourages repeating tokens."),
    Field("seed", "Seed", -1, 2**31 - 1, 1, 0, "The same seed and settings give the same answer.", "random"),
)
NO_SEED = -1


class SamplingForm(QWidget):
    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QFormLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.boxes: dict[str, QSpinBox | QDoubleSpinBox] = {}
        for field in FIELDS:
            box: QSpinBox | QDoubleSpinBox
            if field.decimals:
                box = QDoubleSpinBox()
                box.setDecimals(field.decimals)
                box.setRange(field.minimum, field.maximum)
                box.setSingleStep(field.step)
            else:
                box = QSpinBox()
                box.setRange(int(field.minimum), int(field.maximum))
                box.setSingleStep(int(field.step))
            if field.special:
                box.setSpecialValueText(field.special)
            box.setToolTip(field.help)
            box.setObjectName(f"sampling:{field.name}")
            box.valueChanged.connect(self.changed)
            layout.addRow(field.label, box)
            self.boxes[field.name] = box
        self.set_settings(ChatSettings())

    def settings(self) -> ChatSettings:
        values = {name: box.value() for name, box in self.boxes.items()}
        seed = int(values.pop("seed"))
        return ChatSettings(**values, seed=None if seed == NO_SEED else seed)  # type: ignore[arg-type]

    def set_settings(self, settings: ChatSettings) -> None:
        for name, box in self.boxes.items():
            value = getattr(settings, name)
            box.blockSignals(True)  # loading a conversation is not an edit
            box.setValue(NO_SEED if value is None else value)
            box.blockSignals(False)

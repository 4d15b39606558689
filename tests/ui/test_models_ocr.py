"""The Models pane and a PaddleOCR-VL model in the models folder (the tiny HF fixture, and its GGUF pair
written at test time): the row and the details say its job is OCR and where to use it, and will-it-fit
counts its tower beside the text model, as the engine's plan does."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from app.engine.plan.fit import FitOptions, check_fit, shape_from_checkpoint
from app.ui.models.library import NOTES_COLUMN

from .test_models_pane import WAIT_MS, _models_window, _row_of

FIXTURES = Path(__file__).parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
import make_paddleocr_vl_gguf  # noqa: E402  (beside the other fixture scripts, not a package)

HF = FIXTURES / "vision" / "paddleocr_vl" / "hf"


def test_a_paddleocr_model_is_listed_as_ocr_with_its_fit(qtbot, make_window, make_context, home):
    shutil.copytree(HF, home / "models" / "acme" / "paddleocr-vl")
    text, mmproj = make_paddleocr_vl_gguf.write_pair(home / "models" / "acme" / "paddleocr-gguf")
    _window, pane = _models_window(qtbot, make_window, make_context)
    for name, path, vision in (("acme/paddleocr-vl", home / "models" / "acme" / "paddleocr-vl", "paddleocr-vl"),
                               (f"acme/paddleocr-gguf/{text.name}", text, mmproj.name)):  # fmt: skip
        row = _row_of(pane, name)
        assert pane.entries.index(row, NOTES_COLUMN).data() == "OCR"
        with qtbot.waitSignal(pane.fit_checked, timeout=WAIT_MS) as checked:
            pane.table.selectRow(row)
        assert "Job: OCR: reads the text of page images. Set it as the OCR model (Settings → Documents)" in (
            pane.details.text()
        )
        report = checked.args[0].value.report
        expected = check_fit(shape_from_checkpoint(path), FitOptions())
        assert vision in report.vision_source and report.breakdown.vision == expected.breakdown.vision > 0
        assert report.breakdown.weights == expected.breakdown.weights

"""Screenshots of issue 21's Studio changes, under Xvfb: rendered Markdown, the base-model note with the
recommended chat models, and a failed model switch that kept the loaded model.

    Xvfb :98 -screen 0 1280x800x24 &
    DISPLAY=:98 /path/to/.venv/bin/python tests/ui/make_ux_screenshots.py docs/screenshots

(or QT_QPA_PLATFORM=offscreen without a display: the same pixels, from QWidget.grab()).

The window is the real Studio. The chat answer is scripted (the test suite's fake engine
answering with fixed Markdown: the embedded base model writes none worth showing); the base-model note is
for the embedded Gemma 3 270M's own file (no chat template in it); the fit verdicts are this machine's;
the failed load is a real truncated copy of that file, refused by the engine's GGUF checks.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

ANSWER = """## Reading a CSV in Python

Use the standard library's `csv` module:

```python
import csv

with open("prices.csv", newline="") as f:
    for row in csv.DictReader(f):
        print(row["fruit"], float(row["price"]))
```

| fruit | price |
|-------|------:|
| pears | 4.00 |
| figs  | 6.50 |

- **DictReader** names each column from the header
- `newline=""` keeps quoted line breaks intact
"""


def main(out: Path) -> None:
    import asyncio

    import qasync
    from PySide6.QtWidgets import QApplication
    from server import fakes
    from server.fakes import FakeEngine

    from app.engine.loader.embedded import embedded_gguf_path
    from app.studio.attachments import read_attachment
    from app.studio.paths import studio_paths
    from app.studio.tasks import SyncExecutor
    from app.ui.main import build_context
    from app.ui.main_window import MainWindow
    from app.ui.theme import apply_theme
    from app.ui.workers import install_asyncgen_hooks

    fakes.scripted_answer = lambda prompt: ANSWER
    app = QApplication(["paddock-studio"])
    apply_theme(app, "light")
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="paddock-shots-"))
    gemma = embedded_gguf_path()

    class Embedded(FakeEngine):  # reports the embedded model's own file, so the base-model mark is real
        @property
        def model(self):
            return dataclasses.replace(super().model, name="Gemma 3 270M (embedded)", path=str(gemma),
                                       architecture="gemma3", quantization="Q4_K_M")

    loop = qasync.QEventLoop(app)  # the chat streams on the qasync loop, as in the Studio
    asyncio.set_event_loop(loop)
    install_asyncgen_hooks(loop)

    def settle(ms: int = 400) -> None:
        loop.run_until_complete(asyncio.sleep(ms / 1000))

    context = build_context(studio_paths(home), executor=SyncExecutor(), host_executor=SyncExecutor(),
                            engine_factory=lambda config: Embedded(), use_keyring=False)
    context.host.adopt(FakeEngine(name="scripted test engine", context_length=8192))  # says what it is
    window = MainWindow(context)
    window.resize(1280, 800)
    window.show()
    settle()

    chat = window.pane("chat")
    prices = home / "prices.csv"
    prices.write_text("fruit,price\npears,4.00\nfigs,6.50\n")
    chat.tray.add([read_attachment(prices)])  # what the Attach button's file dialog would add
    chat.input.setPlainText("How do I read this CSV file in Python? Show a table of the example data.")
    chat.send()
    settle(1500)
    window.grab().save(str(out / "chat-markdown.png"))

    context.host.adopt(Embedded())
    chat.new_chat()
    settle()
    window.grab().save(str(out / "base-model-note.png"))
    from app.studio.recommendations import RECOMMENDED

    window.show_recommended()
    settle(2500)  # the fit verdicts (and the memory bandwidth behind the speeds) are computed on the worker
    view = window.pane("models").hub.recommended
    view.table.selectRow(next(row for row, rec in enumerate(RECOMMENDED) if rec.title == "Llama 3.2 3B Instruct"))
    settle()  # its breakdown and speed in the fit panel
    window.grab().save(str(out / "recommended-models.png"))

    truncated = context.models_dir / "gemma-3-270m-truncated.gguf"
    data = gemma.read_bytes()
    truncated.write_bytes(data[: len(data) // 12])
    models = window.pane("models")
    models.tabs.setCurrentIndex(0)
    models.refresh()
    settle(1500)
    window.load_model(str(truncated))
    models.select(truncated.name)
    settle(1500)
    window.grab().save(str(out / "failed-load-kept-model.png"))
    window.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots"))

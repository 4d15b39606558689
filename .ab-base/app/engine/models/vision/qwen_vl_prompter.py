"""Images into Qwen2.5-VL prompts: what the chat template's image placeholder expands to, and
image bytes into the engine's `ImageInput` (patches + grid).

Qwen's template writes `<|vision_start|><|image_pad|><|vision_end|>` where an image part sits; its
processor repeats `<|image_pad|>` once per merged patch (t*h*w / merge^2: the count depends on the
image's size), and the text is then tokenized whole, specials parsed. `expand` does the same.
`expand` and `views` are prompter.ImagePrompter's (Gemma 3's), which the server and commands use.
"""

from __future__ import annotations

from typing import Any

from app.engine.images import ImageInput
from app.engine.models.vision.image_processing import MAX_IMAGE_PIXELS, decode_image
from app.engine.models.vision.prompter import ImagePrompter, PreparedImage, image_token_ids
from app.engine.models.vision.qwen_vl_config import QwenVisionConfig
from app.engine.models.vision.qwen_vl_processing import preprocess_qwen

START, END, PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"


class QwenImagePrompter(ImagePrompter):
    # the start, end and per-token image tokens; the chat template writes them as one placeholder
    tokens = (START, END, PAD)
    placeholder = f"{START}{PAD}{END}"

    def __init__(self, cfg: QwenVisionConfig, tokenizer, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.config = cfg
        self.image_token_id: int = image_token_ids(tokenizer, self.tokens)[self.tokens[2]]
        self.max_pixels = max_pixels

    def tokens_for(self, image: ImageInput) -> int:
        """How many image tokens one view takes: its merged patches."""
        if image.grid_thw is None:
            raise ValueError("a Qwen2.5-VL image needs its patch grid")
        t, h, w = image.grid_thw
        return t * h * w // self.config.merge_unit

    def prepare(self, data: bytes) -> PreparedImage:
        """Decode and preprocess one image (ImageError naming what is wrong)."""
        patches, grid = self.preprocess(decode_image(data, self.max_pixels), self.config)
        return PreparedImage((ImageInput(patches, grid_thw=grid),))

    @staticmethod
    def preprocess(image: Any, cfg: Any) -> tuple[Any, tuple[int, int, int]]:
        return preprocess_qwen(image, cfg)

    def expansion(self, image: PreparedImage) -> str:
        start, end, pad = self.tokens
        return f"{start}{pad * self.tokens_for(image.views[0])}{end}"

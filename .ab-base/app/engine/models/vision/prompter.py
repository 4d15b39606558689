"""Images into prompts, for the server and the commands: what the chat template's image
placeholder expands to, and image bytes into the engine's `ImageInput` views.

Gemma 3's template writes `<start_of_image>` where an image part sits; its processor replaces
each by "\\n\\n<start_of_image>" + `tokens_per_image` x `<image_soft_token>` + "<end_of_image>\\n\\n",
and, with pan-and-scan crops, by "Here is the original image {that} and here are some crops to
help you see better {that} {that} ..." (transformers' Gemma3Processor), the text then being
tokenized whole, specials parsed. `expand` does the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.images import ImageInput
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.config import VisionConfig
from app.engine.models.vision.image_processing import MAX_IMAGE_PIXELS, decode_image, preprocess

BOI, EOI, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"


@dataclass(frozen=True)
class PreparedImage:
    views: tuple[ImageInput, ...]  # the whole image, then its pan-and-scan crops

    @property
    def num_crops(self) -> int:
        return len(self.views) - 1


def image_token_ids(tokenizer, names: tuple[str, ...]) -> dict[str, int]:
    """The ids of a family's image tokens; CheckpointError naming those the tokenizer lacks."""
    ids = {name: tokenizer.token_to_id(name) for name in names}
    missing = [name for name, i in ids.items() if i is None]
    if missing:
        raise CheckpointError(f"the tokenizer lacks the image tokens {missing}: it cannot take images")
    return ids


class ImagePrompter:
    placeholder = BOI  # what the chat template writes for an image part

    def __init__(self, cfg: VisionConfig, tokenizer, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.config = cfg
        self.image_token_id: int = image_token_ids(tokenizer, (BOI, EOI, SOFT))[SOFT]
        self.tokens_per_image = cfg.tokens_per_image
        self.max_pixels = max_pixels
        self._sequence = f"\n\n{BOI}{SOFT * cfg.tokens_per_image}{EOI}\n\n"

    def tokens_for(self, image: ImageInput) -> int:
        """How many image tokens one view takes (Gemma 3: the same for every image)."""
        return self.tokens_per_image

    def prepare(self, data: bytes) -> PreparedImage:
        """Decode and preprocess one image (ImageError naming what is wrong)."""
        processed = preprocess(decode_image(data, self.max_pixels), self.config)
        return PreparedImage(tuple(ImageInput(view) for view in processed.pixel_values))

    def expansion(self, image: PreparedImage) -> str:
        if not image.num_crops:
            return self._sequence
        crops = " ".join([self._sequence] * image.num_crops)
        return f"Here is the original image {self._sequence} and here are some crops to help you see better {crops}"

    def expand(self, text: str, images: list[PreparedImage], marker: str | None = None) -> str:
        """The rendered prompt with each placeholder (`marker`, else the template's own) replaced
        by its image's tokens, in order. ValueError when placeholders and images do not pair up."""
        marker = marker or self.placeholder
        parts = text.split(marker)
        if len(parts) - 1 != len(images):
            raise ValueError(
                f"the prompt has {len(parts) - 1} image placeholders for {len(images)} images "
                f"(the text may not contain {marker!r} itself)"
            )
        out = [parts[0]]
        for image, after in zip(images, parts[1:], strict=True):
            out += [self.expansion(image), after]
        return "".join(out)

    def views(self, images: list[PreparedImage]) -> list[ImageInput]:
        return [view for image in images for view in image.views]

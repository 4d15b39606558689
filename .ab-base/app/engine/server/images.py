"""Image parts of API requests: collected while messages are converted, loaded and checked
before the prompt is built.

Each protocol's conversion to the neutral template messages (see prompting.py) puts IMAGE_MARK
where an image part sat and records its source here, in order; `load_images` turns the sources
into preprocessed images (400s naming the part: no vision, too many, not a data URL, bad base64,
too large, undecodable) and PromptBuilder.chat expands the marks into the model's image tokens.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from app.engine.server.errors import bad_request

IMAGE_MARK = "\ue000"  # a private-use character: where an image sits in a message's text, until expanded
AUDIO_MARK = "\ue001"  # the same for an audio clip (audio_parts.py)
MARKS = (IMAGE_MARK, AUDIO_MARK)
_FETCH_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class ImageSource:
    param: str  # where in the request, for errors
    url: str | None = None  # a data: or http(s) URL (OpenAI, Responses, Anthropic "url" sources)
    data: str | None = None  # base64 (Anthropic "base64" sources)


@dataclass
class ImageCollector:
    sources: list[ImageSource] = field(default_factory=list)
    audio: list[Any] = field(default_factory=list)  # AudioSources of input_audio parts (audio_parts.py)

    def add(self, source: ImageSource) -> str:
        self.sources.append(source)
        return IMAGE_MARK

    def add_audio(self, source: Any) -> str:
        self.audio.append(source)
        return AUDIO_MARK


def join_text(pieces: list[str]) -> str:
    """Text pieces joined by newlines, image and audio marks written against their neighbours (as
    Gemma's template writes its image and audio tokens between a message's parts)."""
    out: list[str] = []
    for piece in pieces:
        if out and piece not in MARKS and out[-1] not in MARKS:
            out.append("\n")
        out.append(piece)
    return "".join(out)


def openai_image(part: Any, param: str) -> ImageSource:
    """An OpenAI `image_url` part (`{"url": ...}` or a bare string) or a Responses `input_image`."""
    value = getattr(part, "image_url", None)
    if value is None and part.model_extra:
        value = part.model_extra.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise bad_request("An image part needs an image URL (a data: URL with base64 data).", param=param)
    return ImageSource(param, url=url)


def anthropic_image(block: Any, param: str) -> ImageSource:
    source = (block.model_extra or {}).get("source")
    if not isinstance(source, dict):
        raise bad_request("An image block needs a source.", param=f"{param}.source")
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        return ImageSource(f"{param}.source", data=source["data"])
    if kind == "url" and isinstance(source.get("url"), str):
        return ImageSource(f"{param}.source", url=source["url"])
    raise bad_request(
        "An image block's source must be {'type': 'base64', 'media_type': ..., 'data': ...} or "
        "{'type': 'url', 'url': ...}.",
        param=f"{param}.source",
    )


def load_images(sources: list[ImageSource], prompter: Any, settings: Any) -> list[Any]:
    """The sources' PreparedImages, in order; ApiError (400) naming the first bad one."""
    if not sources:
        return []
    if prompter is None:
        raise bad_request(
            "The loaded model has no vision: it reads text only and cannot take images.",
            param=sources[0].param,
            code="model_has_no_vision",
        )
    if len(sources) > settings.max_images:
        raise bad_request(
            f"The request holds {len(sources)} images; at most {settings.max_images} are accepted.",
            param=sources[settings.max_images].param,
        )
    from app.engine.models.vision.image_processing import ImageError

    prepared = []
    for source in sources:
        data = _image_bytes(source, settings)
        try:
            prepared.append(prompter.prepare(data))
        except ImageError as exc:
            message = str(exc)
            raise bad_request(f"{message[:1].upper()}{message[1:]}.", param=source.param) from None
    return prepared


def _image_bytes(source: ImageSource, settings: Any) -> bytes:
    if source.data is not None:
        return decode_base64(source.data, source.param, settings.max_image_bytes)
    url = source.url or ""
    if url.startswith("data:"):
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise bad_request(
                "An image data: URL must be base64 (data:image/png;base64,...).", param=source.param
            )
        return decode_base64(payload, source.param, settings.max_image_bytes)
    if url.startswith(("http://", "https://")):
        if not settings.allow_image_urls:
            raise bad_request(
                "Image URLs are not fetched by this server; send the image inline as a data: URL "
                "(base64), or start the server with --allow-image-urls.",
                param=source.param,
            )
        return _fetch(url, source.param, settings.max_image_bytes)
    raise bad_request("An image URL must be a data: URL (or http/https where allowed).", param=source.param)


def decode_base64(payload: str, param: str, limit: int, what: str = "image") -> bytes:
    """An inline part's bytes (audio_parts.py's too); 400 naming `param` when over `limit` or not base64."""
    if len(payload) * 3 // 4 > limit + 2:
        raise bad_request(
            f"The {what} is about {len(payload) * 3 // 4} bytes; at most {limit} bytes are accepted.",
            param=param,
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"The {what} data is not valid base64.", param=param) from None


def _fetch(url: str, param: str, limit: int) -> bytes:
    import httpx

    try:
        with httpx.stream("GET", url, timeout=_FETCH_TIMEOUT_SECONDS, follow_redirects=True) as response:
            response.raise_for_status()
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > limit:
                    raise bad_request(f"The image at {url} is over {limit} bytes.", param=param)
            return bytes(data)
    except httpx.HTTPError as exc:
        raise bad_request(f"The image at {url} could not be fetched: {exc}", param=param) from None

"""OpenAI-style chat messages -> the neutral template messages (see prompting.py).

Shared by chat completions, the Responses API (its message items) and /tokenize.
"""

from __future__ import annotations

from typing import Any

from app.engine.server.audio_parts import openai_audio
from app.engine.server.errors import bad_request
from app.engine.server.images import ImageCollector, join_text, openai_image
from app.engine.server.prompting import parse_arguments
from app.engine.server.protocol.chat import ChatMessage
from app.engine.server.serving_base import new_id


def chat_messages(messages: list[ChatMessage], images: ImageCollector | None = None) -> list[dict[str, Any]]:
    """OpenAI chat messages -> the neutral template messages (see prompting.py); image parts go
    to `images` (refused without one)."""
    result = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": text_content(message.content, f"messages[{i}].content", images),
        }
        if message.name:
            entry["name"] = message.name
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id or new_id("call_"),
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": parse_arguments(
                            call.function.arguments, f"messages[{i}].tool_calls[{j}].function.arguments"
                        ),
                    },
                }
                for j, call in enumerate(message.tool_calls)
            ]
        if message.role == "tool":
            entry["tool_call_id"] = message.tool_call_id or ""
        result.append(entry)
    return result


IMAGE_PARTS = ("image_url", "input_image")


def text_content(content: str | list[Any] | None, param: str, images: ImageCollector | None = None) -> str:
    """The parts' text, joined by newlines; each image part (with a collector) becomes IMAGE_MARK
    in place, each input_audio part AUDIO_MARK, written next to their neighbours as Gemma's template
    writes its image and audio tokens."""
    if content is None or isinstance(content, str):
        return content or ""
    pieces: list[str] = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if part.type in IMAGE_PARTS and images is not None:
            pieces.append(images.add(openai_image(part, where)))
        elif part.type == "input_audio" and images is not None:
            pieces.append(images.add_audio(openai_audio(part, where)))
        elif part.type not in ("text", "input_text", "output_text") or part.text is None:
            raise bad_request(f"Content of type {part.type!r} is not supported here.", param=where)
        else:
            pieces.append(part.text)
    return join_text(pieces)

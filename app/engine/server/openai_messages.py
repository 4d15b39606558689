"""OpenAI-style chat messages -> the neutral template messages (see prompting.py).

Shared by chat completions, the Responses API (its message items) and /tokenize.
"""

from __future__ import annotations

from typing import Any

from app.engine.server.errors import bad_request
from app.engine.server.prompting import parse_arguments
from app.engine.server.protocol.chat import ChatMessage
from app.engine.server.serving_base import new_id


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI chat messages -> the neutral template messages (see prompting.py)."""
    result = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": text_content(message.content, f"messages[{i}].content"),
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


def text_content(content: str | list[Any] | None, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type not in ("text", "input_text", "output_text") or part.text is None:
            raise bad_request(
                f"Content of type {part.type!r} is not supported: this model reads text only.",
                param=f"{param}[{j}]",
            )
        texts.append(part.text)
    return "\n".join(texts)

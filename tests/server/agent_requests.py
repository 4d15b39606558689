"""The request shapes of IDE agents, as recorded from the real clients (see test_agent_clients.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def claude_code_request(model: str, **changes: Any) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(path with query, headers, body) of the recorded Claude Code request, for `model`."""
    recorded = json.loads((FIXTURES / "claude_code_request.json").read_text())
    body = {**recorded["body"], "model": model, **changes}
    return f"/v1/messages?{recorded['query']}", recorded["headers"], body


OPENCODE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": properties,
                "required": list(properties)[:1],
            },
        },
    }
    for name, description, properties in [
        ("bash", "Executes a given bash command in a persistent shell session.",
         {"command": {"type": "string", "description": "The command to execute"},
          "timeout": {"type": "integer", "exclusiveMinimum": 0, "description": "Optional timeout in milliseconds"},
          "workdir": {"type": "string", "description": "The working directory to run the command in"}}),
        ("read", "Reads a file from the local filesystem.",
         {"filePath": {"type": "string", "description": "The absolute path to the file"},
          "offset": {"type": "integer"}, "limit": {"type": "integer"}}),
        ("edit", "Performs exact string replacements in files.",
         {"filePath": {"type": "string"}, "oldString": {"type": "string"}, "newString": {"type": "string"}}),
        ("glob", "Fast file pattern matching.", {"pattern": {"type": "string"}, "path": {"type": "string"}}),
        ("grep", "Fast content search.", {"pattern": {"type": "string"}, "include": {"type": "string"}}),
        ("todowrite", "Create and manage a structured task list.", {"todos": {"type": "array", "items": {"type": "object"}}}),
    ]
]  # fmt: skip


def opencode_request(model: str) -> dict[str, Any]:
    """opencode 1.18.33's agent turn: @ai-sdk/openai-compatible with the snippet's limit.output as max_tokens."""
    return {
        "model": model,
        "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "You are opencode, an interactive CLI tool that helps users with "
             "software engineering tasks. Use the instructions below and the tools available to you."},
            {"role": "user", "content": '"say hi"'},
        ],
        "tools": OPENCODE_TOOLS,
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip


def aider_request(model: str) -> dict[str, Any]:
    """aider's turn through litellm (`openai/<id>` with --openai-api-base): no tools, no max_tokens."""
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "Act as an expert software developer. Always use best practices when "
             "coding. Respect and use existing conventions, libraries, etc that are already present in the code base."},
            {"role": "user", "content": "I switched to a new code base. Please don't consider the above files."},
            {"role": "assistant", "content": "Ok."},
            {"role": "user", "content": "say hi"},
        ],
        "temperature": 0,
        "stream": True,
    }  # fmt: skip

"""The local API: OpenAI- and Anthropic-compatible HTTP (and MCP) over an `EngineClient`.

Public: `create_app`, `ServerSettings`, `ServerHandle`, `serve_blocking`, `Embedder`.
Imported lazily, so `import app.engine.server` does not pull FastAPI in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.engine.server.app import create_app
    from app.engine.server.embedder import Embedder
    from app.engine.server.launch import ServerHandle, serve_blocking
    from app.engine.server.settings import ServerSettings

_EXPORTS = {
    "create_app": "app.engine.server.app",
    "Embedder": "app.engine.server.embedder",
    "ServerHandle": "app.engine.server.launch",
    "serve_blocking": "app.engine.server.launch",
    "ServerSettings": "app.engine.server.settings",
}
__all__ = ["Embedder", "ServerHandle", "ServerSettings", "create_app", "serve_blocking"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'app.engine.server' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)

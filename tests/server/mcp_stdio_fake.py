"""Run as a script: the MCP stdio server over the fake engine (what `paddock mcp` does over the real one)."""

from __future__ import annotations

import asyncio

from fakes import FakeEmbedder, FakeEngine  # the script's folder is on sys.path

from app.engine.server.mcp import run_stdio

if __name__ == "__main__":
    asyncio.run(run_stdio(FakeEngine(), FakeEmbedder()))

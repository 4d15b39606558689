"""The MCP tools over streamable HTTP at /mcp and over stdio, driven by the mcp package's own client."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

pytestmark = pytest.mark.usefixtures("scripted")  # exact answers come from the fake engine (fakes.py)


async def exercise(client: Client) -> dict:
    tools = {tool.name for tool in (await client.list_tools()).tools}
    chat = await client.call_tool("chat", {"messages": [{"role": "user", "content": "hello"}]})
    generate = await client.call_tool("generate", {"prompt": "abc", "max_tokens": 100})
    count = await client.call_tool("count_tokens", {"text": "abcd"})
    embed = await client.call_tool("embed", {"texts": ["a", "b"]})
    bad = await client.call_tool("count_tokens", {})
    bad_value = await client.call_tool("generate", {"prompt": "abc", "max_tokens": 0, "temperature": -1})
    return {
        "tools": tools, "chat": chat, "generate": generate, "count": count, "embed": embed, "bad": bad,
        "bad_value": bad_value,
    }  # fmt: skip


def check(results: dict, embedder) -> None:
    assert results["tools"] == {"generate", "chat", "embed", "count_tokens"}
    assert results["chat"].structured_content["text"] == "Echo: hello"
    assert results["chat"].structured_content["completion_tokens"] == len("Echo: hello") + 1
    assert results["generate"].structured_content["text"] == "Echo: abc"
    assert results["count"].structured_content == {"tokens": 5}  # BOS + four characters
    embed = results["embed"].structured_content
    assert embed["dimensions"] == embedder.dimensions and len(embed["embeddings"]) == 2
    assert results["bad"].is_error and "exactly one" in results["bad"].content[0].text
    # a value the HTTP API would refuse with a 400 says why here too (issue 40: it gave no reason)
    bad_value = results["bad_value"]
    assert bad_value.is_error and "Invalid value for 'max_tokens'" in bad_value.content[0].text
    assert "(and 1 more problem)" in bad_value.content[0].text


def test_mcp_over_streamable_http(server, embedder):
    async def run() -> dict:
        async with Client(f"{server.base_url}/mcp") as client:
            return await exercise(client)

    check(asyncio.run(run()), embedder)


def test_mcp_over_stdio(embedder):
    script = Path(__file__).with_name("mcp_stdio_fake.py")

    async def run() -> dict:
        # this checkout's app/ first: the virtual environment's own entry may point at another one
        root = str(Path(__file__).resolve().parents[2])
        server = StdioServerParameters(command=sys.executable, args=[str(script)], env={"PYTHONPATH": root})
        async with Client(server) as client:
            return await exercise(client)

    check(asyncio.run(run()), embedder)

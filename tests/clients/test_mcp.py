"""The MCP server, driven by the official mcp SDK's own client, against the live service.

Over stdio it runs as its console script, as an MCP client configuration starts it; over
streamable HTTP likewise, behind its API-key check. The in-process test covers the same tools
in this process, where coverage sees them.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from ferrum_memory_client import AsyncClient, Client
from ferrum_memory_client.mcp_server import build_server, main, require_key
from mcp import Client as MCPClient
from mcp import StdioServerParameters
from mcp_types import TextContent

from .conftest import FAST_RETRY

pytestmark = pytest.mark.live_server

SCRIPT = Path(sys.executable).parent / "ferrum-memory-mcp"
SOURCE = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"
TOOLS = {
    "remember",
    "recall",
    "context",
    "forget",
    "session_start",
    "session_append",
    "session_close",
    "record_experience",
}


def _data(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        content = result.structured_content
        return content.get("result", content) if set(content) == {"result"} else content
    return result.content[0].text


def _text(result: Any) -> str:
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text


async def _exercise(mcp: MCPClient, client: Client, agent_id: str) -> None:
    """List the tools, call each, and check the service's state after each call."""
    tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 30
        assert tool.input_schema["type"] == "object"
    assert "description" in tools["remember"].input_schema["properties"]["content"]

    fact = "The release branch is cut every Tuesday at 10:00 UTC."
    stored = _data(await mcp.call_tool("remember", {"content": fact, "tags": ["release"]}))
    assert client.memory_get(point_id=stored["point_id"]).content == fact
    again = _data(await mcp.call_tool("remember", {"content": fact}))
    assert (again["point_id"], again["duplicate"]) == (stored["point_id"], "exact")

    hits = _data(await mcp.call_tool("recall", {"query": "when is the release branch cut?"}))
    assert hits[0]["point_id"] == stored["point_id"]
    assert hits[0]["content"] == fact
    text = _data(await mcp.call_tool("context", {"query": "release schedule"}))
    assert fact in text

    session = _data(await mcp.call_tool("session_start", {"task": "Cut the release"}))
    sid = session["session_id"]
    assert client.session_get(session_id=sid).task == "Cut the release"
    appended = _data(
        await mcp.call_tool("session_append", {"session_id": sid, "content": "Tagged v1.2."})
    )
    assert appended["messages"] == 1
    state = client.session_get(session_id=sid)
    assert [(msg.role, msg.content) for msg in state.messages] == [("assistant", "Tagged v1.2.")]
    with_turns = _data(
        await mcp.call_tool("context", {"query": "release branch", "session_id": sid})
    )
    assert with_turns.index("Tagged v1.2.") < with_turns.index(fact)  # recent turns come first
    closed = _data(await mcp.call_tool("session_close", {"session_id": sid}))
    assert closed["session_id"] == sid
    assert client.session_close(session_id=sid).session_id == sid  # closed: the same answer

    recorded = _data(
        await mcp.call_tool(
            "record_experience",
            {
                "task": "Cut the release",
                "reward": 1.0,
                "passed": True,
                "tool_calls": ["git_tag", "git_push"],
                "notes": "tagged and pushed",
            },
        )
    )
    experience = client.experience_get(experience_id=recorded["experience_id"])
    assert experience.agent_id == agent_id
    assert [call.name for call in experience.tool_calls] == ["git_tag", "git_push"]
    assert experience.test_result is not None
    assert experience.test_result.passed and experience.test_result.output == "tagged and pushed"

    forgot = _data(await mcp.call_tool("forget", {"point_id": stored["point_id"]}))
    assert stored["point_id"] in forgot
    assert client.memory_search(agent_id=agent_id, query="release branch").results == []
    nothing = _data(await mcp.call_tool("context", {"query": "release schedule"}))
    assert nothing == "No stored memory is relevant."

    # A service error comes back as a tool error with the service's message.
    failed = await mcp.call_tool("forget", {"point_id": stored["point_id"]})
    assert failed.is_error
    assert "404: No memory item" in _text(failed)  # the service's own message
    invalid = await mcp.call_tool("remember", {"content": "x" * 20_001})
    assert invalid.is_error and "400: content: Ensure" in _text(invalid)


def _env(server, agent_id: str) -> dict[str, str]:
    return {
        "FERRUM_URL": server.base_url,
        "FERRUM_API_KEY": server.api_key,
        "FERRUM_AGENT_ID": agent_id,
        "PYTHONPATH": str(SOURCE),  # this checkout's package, wherever the script was installed
    }


def test_the_tools_over_stdio(server, client, agent_id):
    params = StdioServerParameters(command=str(SCRIPT), env=_env(server, agent_id))

    async def scenario() -> None:
        async with MCPClient(params) as mcp:
            await _exercise(mcp, client, agent_id)

    asyncio.run(scenario())


def test_the_tools_in_process(server, client, agent_id):
    async def scenario() -> None:
        async with AsyncClient(server.api_key, server.base_url, retry=FAST_RETRY) as ferrum:
            async with MCPClient(build_server(ferrum, agent_id=agent_id)) as mcp:
                await _exercise(mcp, client, agent_id)

    asyncio.run(scenario())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_tools_over_streamable_http_need_the_key(server, client, agent_id):
    port = _free_port()
    process = subprocess.Popen(
        [str(SCRIPT), "--transport", "streamable-http", "--port", str(port)],
        env={**os.environ, **_env(server, agent_id)},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60  # waiting for a process to come up, not a timed check
        while True:
            try:
                refused = httpx.post(url, json={})
                break
            except httpx.ConnectError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert refused.status_code == 401
        wrong = httpx.post(url, json={}, headers={"Authorization": "Bearer fm_wrong"})
        assert wrong.status_code == 401

        async def scenario() -> None:
            headers = {"Authorization": f"Bearer {server.api_key}"}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
                from mcp.client.streamable_http import streamable_http_client

                async with MCPClient(streamable_http_client(url, http_client=http)) as mcp:
                    await _exercise(mcp, client, agent_id)

        asyncio.run(scenario())
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_command_needs_an_agent_and_a_key(monkeypatch, capsys):
    monkeypatch.delenv("FERRUM_AGENT_ID", raising=False)
    monkeypatch.delenv("FERRUM_API_KEY", raising=False)
    with pytest.raises(SystemExit):
        main([])
    assert "--agent-id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--agent-id", "a"])
    assert "FERRUM_API_KEY" in capsys.readouterr().err


def test_the_readme_mcp_configuration_is_valid_json():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### MCP server", 1)[1]
    block = section.split("```json\n", 1)[1].split("```", 1)[0]
    config = json.loads(block)["mcpServers"]["ferrum-memory"]
    assert config["command"] == "ferrum-memory-mcp"
    assert set(config["env"]) == {"FERRUM_URL", "FERRUM_API_KEY", "FERRUM_AGENT_ID"}


def test_the_http_guard_lets_only_the_key_through():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def scenario() -> list[int]:
        transport = httpx.ASGITransport(app=require_key(app, "fm_secret"))
        async with httpx.AsyncClient(transport=transport, base_url="http://mcp") as http:
            tries = [{}, {"Authorization": "Bearer fm_x"}, {"Authorization": "Bearer fm_secret"}]
            return [(await http.get("/mcp", headers=headers)).status_code for headers in tries]

    assert asyncio.run(scenario()) == [401, 401, 200]

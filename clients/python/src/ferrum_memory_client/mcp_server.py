"""An MCP server that gives any MCP-capable agent ferrum-memory's tools: a thin layer over the SDK.

    ferrum-memory-mcp --agent-id my-agent                       # stdio (the default)
    ferrum-memory-mcp --agent-id my-agent --transport streamable-http --port 8765

FERRUM_URL and FERRUM_API_KEY say where the service is and which key to use (FERRUM_AGENT_ID
may replace --agent-id). Over HTTP every MCP request must carry that same key as
`Authorization: Bearer <key>`: the server acts with the key's rights, so it answers only to
clients that hold it.
"""

from __future__ import annotations

import argparse
import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field

from .client import AsyncClient
from .errors import FerrumError
from .models import MemoryHit

T = TypeVar("T")
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Any]

INSTRUCTIONS = """\
Long-term memory, working memory of a session, and an experience log for this agent.
Before a task, call `context` (or `recall`) with what you are about to do: past facts, decisions
and fixes come back. Call `remember` for anything worth knowing next time (a decision, a user
preference, how a problem was solved), one fact per call. Keep a multi-step task's turns with
`session_start`, `session_append` and `session_close` (closing turns them into memories).
After a task, `record_experience` with its outcome so that learners can train on it."""


def _hit(hit: MemoryHit) -> dict[str, Any]:
    item = hit.item
    return {
        "point_id": item.point_id,
        "content": item.content,
        "score": round(hit.score, 4),
        "kind": item.kind,
        "relevance": round(hit.relevance, 4),
        "tags": item.tags,
        "created_at": item.created_at.isoformat(),
    }


async def _service(call: Awaitable[T]) -> T:
    """The service's answer, or its error as an MCP tool error carrying the service's message."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return await call
    except FerrumError as exc:
        raise ToolError(str(exc)) from exc


def build_server(client: AsyncClient, *, agent_id: str) -> Any:
    """The MCP server's tools, bound to `client` and acting for `agent_id`."""
    from mcp.server.mcpserver import MCPServer

    mcp = MCPServer("ferrum-memory", instructions=INSTRUCTIONS)

    @mcp.tool()
    async def remember(
        content: Annotated[str, Field(description="One self-contained fact, in plain words.")],
        kind: Annotated[
            Literal["episodic", "semantic", "procedural"],
            Field(
                description="semantic: a fact; procedural: how to do something; episodic: an "
                "event that happened."
            ),
        ] = "semantic",
        tags: Annotated[list[str] | None, Field(description="Short labels to filter by.")] = None,
        importance: Annotated[float, Field(ge=0, le=1, description="0 trivial .. 1 vital.")] = 0.5,
    ) -> dict[str, Any]:
        """Store a memory for later. The same or nearly the same content is merged into the
        memory it repeats (`duplicate` says so) instead of being stored twice."""
        stored = await _service(
            client.memory_store(
                agent_id=agent_id, content=content, kind=kind, tags=tags, importance=importance
            )
        )
        return {"point_id": stored.point_id, "duplicate": stored.duplicate or None}

    @mcp.tool()
    async def recall(
        query: Annotated[str, Field(description="What you want to know, as a question or topic.")],
        limit: Annotated[int, Field(ge=1, le=50, description="Most memories to return.")] = 5,
        tags: Annotated[list[str] | None, Field(description="Only with these tags.")] = None,
    ) -> list[dict[str, Any]]:
        """Search the memories stored before, best match first (hybrid: meaning and words)."""
        found = await _service(
            client.memory_search(agent_id=agent_id, query=query, limit=limit, tags=tags or None)
        )
        return [_hit(hit) for hit in found.results]

    @mcp.tool()
    async def context(
        query: Annotated[str, Field(description="The task or question of your next step.")],
        session_id: Annotated[
            str | None, Field(description="From session_start: its recent turns come first.")
        ] = None,
        token_budget: Annotated[
            int, Field(ge=50, le=200_000, description="Most tokens the context may take.")
        ] = 2000,
    ) -> str:
        """Everything to read before the next step, within a token budget: the session's recent
        turns (with a session_id) and the stored memories relevant to the query, most relevant
        first. An off-topic query gets no memories rather than unrelated ones."""
        found = await _service(
            client.memory_context(
                agent_id=agent_id, query=query, token_budget=token_budget, session_id=session_id
            )
        )
        text = found.context or "No stored memory is relevant."
        if found.degraded:
            text += f"\n\n(Partial: {', '.join(found.degraded)} did not answer.)"
        return text

    @mcp.tool()
    async def forget(
        point_id: Annotated[str, Field(description="The point_id that remember or recall gave.")],
    ) -> str:
        """Delete one memory for good: one that is wrong or no longer true."""
        await _service(client.memory_delete(point_id=point_id))
        return f"Forgot {point_id}."

    @mcp.tool()
    async def session_start(
        task: Annotated[str, Field(description="What this session is for.")],
    ) -> dict[str, Any]:
        """Start a working-memory session for a multi-step task; returns its session_id."""
        state = await _service(client.session_start(agent_id=agent_id, task=task))
        return {"session_id": state.session_id, "expires_at": state.expires_at.isoformat()}

    @mcp.tool()
    async def session_append(
        session_id: Annotated[str, Field(description="From session_start.")],
        content: Annotated[str, Field(description="The turn's text.")],
        role: Annotated[
            Literal["user", "assistant", "tool", "system"], Field(description="Who said it.")
        ] = "assistant",
    ) -> dict[str, Any]:
        """Append a turn to a session's working memory (keeps the session alive)."""
        state = await _service(
            client.session_append(
                session_id=session_id, messages=[{"role": role, "content": content}]
            )
        )
        return {"session_id": state.session_id, "messages": len(state.messages)}

    @mcp.tool()
    async def session_close(
        session_id: Annotated[str, Field(description="From session_start.")],
    ) -> dict[str, Any]:
        """Close a session: its turns are consolidated into memories in the background."""
        done = await _service(client.session_close(session_id=session_id))
        return {"session_id": done.session_id, "consolidation": done.status or "queued"}

    @mcp.tool()
    async def record_experience(
        task: Annotated[str, Field(description="The task as it was given.")],
        reward: Annotated[float, Field(description="How well it went, e.g. 1 success, 0 failure.")],
        passed: Annotated[bool, Field(description="Whether the task's check or tests passed.")],
        tool_calls: Annotated[
            list[str] | None, Field(description="Names of the tools called, in order.")
        ] = None,
        notes: Annotated[str, Field(description="What happened, briefly.")] = "",
        session_id: Annotated[str | None, Field(description="The session, if any.")] = None,
    ) -> dict[str, Any]:
        """Log the outcome of a finished task as an experience for replay and learning."""
        stored = await _service(
            client.experience_record(
                agent_id=agent_id,
                task=task,
                reward=reward,
                tool_calls=[{"name": name} for name in tool_calls or ()],
                test_result={"passed": passed, "output": notes},
                session_id=session_id,
            )
        )
        return {"experience_id": stored.id, "priority": stored.priority}

    return mcp


def require_key(app: ASGIApp, key: str) -> ASGIApp:
    """Refuse an HTTP request that does not carry `Authorization: Bearer <key>`."""
    expected = f"Bearer {key}".encode()

    async def guarded(scope: Scope, receive: Any, send: Any) -> Any:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"detail":"API key needed."}'})
                return None
        return await app(scope, receive, send)

    return guarded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ferrum-memory-mcp", description=__doc__.split("\n")[0])
    parser.add_argument("--agent-id", default=os.environ.get("FERRUM_AGENT_ID"))
    parser.add_argument("--url", default=None, help="the service (default: FERRUM_URL)")
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    if not args.agent_id:
        parser.error("--agent-id (or FERRUM_AGENT_ID) is required")
    client = AsyncClient(base_url=args.url)
    if not client.api_key:
        parser.error("FERRUM_API_KEY is required")
    serve(build_server(client, agent_id=args.agent_id), args, key=client.api_key)


def serve(server: Any, args: argparse.Namespace, *, key: str) -> None:  # pragma: no cover
    """Run until stopped. Covered by the tests that start the command as a subprocess (stdio
    and streamable HTTP), where this process's coverage cannot see it."""
    if args.transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = require_key(server.streamable_http_app(host=args.host), key)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":  # pragma: no cover
    main()

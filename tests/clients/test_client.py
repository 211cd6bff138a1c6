"""The SDK against the live service: every operation, typed results, errors, configuration."""

import asyncio
import inspect
import json
from pathlib import Path

import httpx
import pytest
from ferrum_memory_client import (
    APIStatusError,
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    Client,
    ConflictError,
    GoneError,
    InternalServerError,
    NotFoundError,
    Operations,
    cursor_of,
)
from ferrum_memory_client import models as m
from ferrum_memory_client._base import Operation
from ferrum_memory_client.errors import error_from_response
from pydantic import TypeAdapter

from .conftest import FAST_RETRY

pytestmark = pytest.mark.live_server

HTTP_METHODS = {"get", "put", "post", "patch", "delete"}


def _operations() -> dict[str, Operation]:
    return {name: value for name, value in vars(Operations).items() if isinstance(value, Operation)}


def _experience(agent_id: str, n: int, **extra) -> dict:
    return {
        "agent_id": agent_id,
        "task": f"task {n}: book a flight",
        "reward": float(n % 2),
        "tool_calls": [{"name": "search_flights", "arguments": {"n": n}}],
        "test_result": {"passed": n % 2 == 1, "total": 1},
        **extra,
    }


def test_the_client_has_a_method_for_every_operation_of_the_served_schema(server):
    schema = httpx.get(f"{server.base_url}/openapi.json").json()
    served = {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }
    declared = {(op.method, op.path) for op in _operations().values()}
    assert served - declared == set(), "operations the client lacks"
    assert declared - served == set(), "client methods for operations the service does not have"


# Each result model and the schema component it reads.
MODELS = {
    m.BackendStatus: "BackendStatus",
    m.Health: "Health",
    m.MemoryItem: "MemoryOut",
    m.StoredMemory: "StoredMemory",
    m.StoredMemoryBatch: "StoredMemoryBatch",
    m.MemoryHit: "MemoryHit",
    m.MemorySearchResult: "MemorySearchOut",
    m.ContextTurn: "ContextTurn",
    m.ContextMemory: "ContextMemory",
    m.ContextDropped: "ContextDropped",
    m.MemoryContext: "MemoryContextOut",
    m.MemoryPage: "PaginatedMemoryOutList",
    m.MemoryEvent: "MemoryEvent",
    m.MemoryEventPage: "PaginatedMemoryEventList",
    m.ErasureCounts: "ErasureCounts",
    m.AgentErasure: "AgentErasure",
    m.ImportCounts: "ImportCounts",
    m.AgentImport: "AgentImport",
    m.ReplayLimiter: "ReplayLimiter",
    m.ReplaySettings: "ReplaySettingsOut",
    m.Message: "Message",
    m.WorkingMemoryState: "WorkingMemoryState",
    m.Consolidation: "Consolidation",
    m.ToolCall: "ToolCallRecord",
    m.TestResult: "TestResult",
    m.Experience: "ExperienceOut",
    m.ExperienceCreatedItem: "ExperienceCreatedItem",
    m.ExperienceBatch: "ExperienceBatchOut",
    m.ExperiencePage: "PaginatedExperienceOutList",
    m.TdErrorResult: "TdErrorResult",
    m.ReplayItem: "ReplayItem",
    m.ReplayBatch: "ReplayOut",
    m.DreamCycle: "DreamCycle",
    m.DreamCycleItem: "DreamCycleItem",
    m.DreamCycleDetail: "DreamCycleDetail",
    m.ClaimedDreamCycle: "DreamCycleClaimed",
    m.DreamCyclePage: "PaginatedDreamCycleList",
    m.DreamCompletion: "DreamCompletion",
}


@pytest.mark.parametrize(("model", "component"), MODELS.items(), ids=MODELS.values())
def test_each_result_model_reads_what_the_schema_says(server, model, component):
    """Every field of the component is typed in the model; one the service may leave out or
    send as null is optional in the model, so no valid answer fails to parse."""
    schema = httpx.get(f"{server.base_url}/openapi.json").json()["components"]["schemas"]
    properties, required = schema[component]["properties"], set(schema[component]["required"])
    assert set(model.model_fields) == set(properties)
    for name, spec in properties.items():
        field = model.model_fields[name]
        if name not in required:
            assert not field.is_required(), name
        if spec.get("nullable"):
            assert TypeAdapter(field.annotation).validate_python(None) is None, name


def test_sync_and_async_clients_have_the_same_methods():
    def public(cls):
        return {
            name: inspect.signature(getattr(cls, name))
            for name in dir(cls)
            if not name.startswith("_") and callable(getattr(cls, name))
        }

    sync, asynchronous = public(Client), public(AsyncClient)
    sync.pop("close"), asynchronous.pop("aclose")
    assert sync == asynchronous
    assert inspect.iscoroutinefunction(AsyncClient.session_append)


def test_key_and_url_come_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("FERRUM_URL", server.base_url + "/")
    monkeypatch.setenv("FERRUM_API_KEY", server.api_key)
    with Client() as ferrum:
        assert ferrum.base_url == server.base_url
        assert "experience" in ferrum.stats()
    monkeypatch.delenv("FERRUM_API_KEY")
    with Client(base_url=server.base_url) as anonymous:
        assert anonymous.health().status == "ok"  # public
        with pytest.raises(AuthenticationError) as refused:
            anonymous.stats()
    assert refused.value.status == 401
    assert refused.value.message


def test_service_endpoints(client):
    health = client.health()
    assert isinstance(health, m.Health)
    assert health.failed == []
    assert "database" in health.backends
    assert "memory" in client.stats()
    assert "ferrum_api_request_duration_seconds" in client.metrics()


def test_memory_round_trip(client, agent_id):
    stored = client.memory_store(
        agent_id=agent_id,
        content="The deploy script lives in ops/deploy.sh and needs the VPN.",
        kind="procedural",
        tags=["deploy"],
        importance=0.8,
        sensitivity="none",
        metadata={"from": "test"},
    )
    assert isinstance(stored, m.StoredMemory)
    assert stored.duplicate == ""
    assert stored.indexed is True
    assert stored.item.tags == ["deploy"]
    again = client.memory_store(
        agent_id=agent_id, content="The deploy script lives in ops/deploy.sh and needs the VPN."
    )
    assert (again.point_id, again.duplicate) == (stored.point_id, "exact")
    batch = client.memory_store_many(
        items=[
            {"agent_id": agent_id, "content": "Lunch is at noon on Fridays."},
            {"agent_id": agent_id, "content": "The staging database is read-only on Sundays."},
        ]
    )
    assert len(batch.items) == 2
    found = client.memory_search(agent_id=agent_id, query="where is the deploy script?", limit=2)
    assert found.results[0].item.point_id == stored.point_id
    assert isinstance(found.results[0].score, float)
    only_tagged = client.memory_search(agent_id=agent_id, query="database", tags=["deploy"])
    assert [hit.item.point_id for hit in only_tagged.results] == [stored.point_id]
    assert 0 <= found.results[0].relevance <= 1
    spread = client.memory_search(agent_id=agent_id, query="deploy", session_diversity=1.0)
    assert spread.results[0].item.point_id == stored.point_id
    context = client.memory_context(
        agent_id=agent_id, query="how do I deploy?", token_budget=200, max_sensitivity="none"
    )
    assert isinstance(context, m.MemoryContext)
    assert context.memories[0].item.point_id == stored.point_id
    assert "ops/deploy.sh" in context.context
    assert context.tokens_used <= 200 and context.degraded == []
    assert client.memory_get(point_id=stored.point_id).kind == "procedural"
    assert client.memory_delete(point_id=stored.point_id) is None
    with pytest.raises(NotFoundError) as gone:
        client.memory_get(point_id=stored.point_id)
    assert gone.value.status == 404


def test_memory_list_update_history_and_agent_erasure(client, agent_id):
    first = client.memory_store(agent_id=agent_id, content="The office is on floor 3.", tags=["o"])
    client.memory_store(agent_id=agent_id, content="Parking is free after 6 pm.")
    listed = client.memory_list(agent_id=agent_id)
    assert isinstance(listed, m.MemoryPage)
    assert len(listed.results) == 2 and cursor_of(listed.next) is None
    assert [i.point_id for i in client.memory_list(agent_id=agent_id, tags=["o"]).results] == [
        first.point_id
    ]
    version = first.item.version
    updated = client.memory_update(
        point_id=first.point_id, version=version, content="The office is on floor 4.", tags=["o"]
    )
    assert updated.item.content == "The office is on floor 4."
    assert updated.item.version == version + 1
    with pytest.raises(ConflictError) as stale:
        client.memory_update(point_id=first.point_id, version=version, importance=0.9)
    assert stale.value.body["current_version"] == version + 1
    history = client.memory_history(point_id=first.point_id)
    assert isinstance(history.results[-1], m.MemoryEvent)
    assert history.results[-1].changes["content"] == {
        "before": "The office is on floor 3.",
        "after": "The office is on floor 4.",
    }
    exported = client.agent_export(agent_id=agent_id)
    assert b"The office is on floor 4." in exported
    erased = client.agent_erase(agent_id=agent_id)
    assert erased.erased_now and erased.counts.memory_items == 2
    assert client.memory_list(agent_id=agent_id).results == []
    again = client.agent_erase(agent_id=agent_id)  # safe to retry: the last erasure's record
    assert not again.erased_now and again.counts.memory_items == 2
    imported = client.agent_import(agent_id=agent_id, data=exported)
    assert isinstance(imported, m.AgentImport) and imported.imported.memory_items == 2
    assert len(client.memory_list(agent_id=agent_id).results) == 2
    with pytest.raises(BadRequestError):
        client.agent_import(agent_id=agent_id, data=b"not json\n")


def test_replay_settings(client, agent_id):
    default = client.experience_settings_get(agent_id=agent_id)
    assert isinstance(default, m.ReplaySettings) and not default.customized
    changed = client.experience_settings_put(agent_id=agent_id, max_size=50, remover="fifo")
    assert (changed.max_size, changed.remover, changed.customized) == (50, "fifo", True)
    assert client.experience_settings_get(agent_id=agent_id).max_size == 50
    with pytest.raises(BadRequestError) as bad:
        client.experience_settings_put(agent_id=agent_id, remover="random")
    assert "remover" in bad.value.field_errors


def test_bad_input_raises_with_the_field_errors(client, agent_id):
    with pytest.raises(BadRequestError) as bad:
        client.memory_search(agent_id=agent_id, query="x", limit=10_000, mode="fuzzy")
    assert bad.value.status == 400
    assert set(bad.value.field_errors) == {"limit", "mode"}
    assert "limit" in bad.value.message
    with pytest.raises(BadRequestError) as not_hybrid:
        client.memory_search(agent_id=agent_id, query="x", mode="dense", session_diversity=1.0)
    assert set(not_hybrid.value.field_errors) == {"session_diversity"}
    with pytest.raises(BadRequestError) as nested:
        client.experience_record_many(
            items=[_experience(agent_id, 1), {**_experience(agent_id, 2), "test_result": {}}]
        )
    assert "1.test_result.passed" in nested.value.field_errors


def test_sessions(client, agent_id):
    state = client.session_start(agent_id=agent_id, task="Fix the flaky test", facts=["CI is red"])
    assert isinstance(state, m.WorkingMemoryState)
    assert state.version == 1
    updated = client.session_update(
        session_id=state.session_id,
        version=1,
        append_messages=[m.Message(role="user", content="It fails on PostgreSQL only.")],
        scratchpad="suspect: ordering",
    )
    assert (updated.version, updated.scratchpad) == (2, "suspect: ordering")
    with pytest.raises(ConflictError) as stale:
        client.session_update(session_id=state.session_id, version=1, step=3)
    assert stale.value.body["current_version"] == 2
    appended = client.session_append(
        session_id=state.session_id,
        messages=[{"role": "assistant", "content": "An ORDER BY was missing in the query."}],
    )
    assert [msg.role for msg in appended.messages] == ["user", "assistant"]
    assert client.session_get(session_id=state.session_id).version == 3
    compressed = client.memory_compress(session_id=state.session_id)
    assert isinstance(compressed, m.Consolidation)
    closed = client.session_close(session_id=state.session_id)
    assert closed.session_id == state.session_id
    assert client.session_close(session_id=state.session_id).consolidation_id == (
        closed.consolidation_id
    )
    with pytest.raises(GoneError):
        client.session_get(session_id=state.session_id)


def test_session_append_gives_up_after_repeated_conflicts(client, agent_id, monkeypatch):
    state = client.session_start(agent_id=agent_id)
    reads = []
    real_get = client.session_get

    def read_then_lose_the_race(**kwargs):
        """Another writer updates the session just after each read, so the version read is
        stale by the time the append is sent: a real 409 every time."""
        read = real_get(**kwargs)
        reads.append(read.version)
        client.session_update(session_id=read.session_id, version=read.version, step=len(reads))
        return read

    monkeypatch.setattr(client, "session_get", read_then_lose_the_race)
    with pytest.raises(ConflictError):
        client.session_append(
            session_id=state.session_id, messages=[{"role": "user", "content": "x"}]
        )
    assert reads == [1, 2, 3, 4, 5]
    assert real_get(session_id=state.session_id).messages == []


def test_async_session_append_gives_up_after_repeated_conflicts(server, agent_id, monkeypatch):
    async def scenario() -> list[int]:
        async with AsyncClient(server.api_key, server.base_url, retry=FAST_RETRY) as ferrum:
            state = await ferrum.session_start(agent_id=agent_id)
            reads: list[int] = []
            real_get = ferrum.session_get

            async def read_then_lose_the_race(**kwargs):
                read = await real_get(**kwargs)
                reads.append(read.version)
                await ferrum.session_update(
                    session_id=read.session_id, version=read.version, step=len(reads)
                )
                return read

            monkeypatch.setattr(ferrum, "session_get", read_then_lose_the_race)
            with pytest.raises(ConflictError):
                await ferrum.session_append(
                    session_id=state.session_id, messages=[{"role": "user", "content": "x"}]
                )
            return reads

    assert asyncio.run(scenario()) == [1, 2, 3, 4, 5]


def test_experiences(client, agent_id):
    one = client.experience_record(
        **_experience(agent_id, 1, metadata={"k": "v"}),
    )
    assert isinstance(one, m.Experience)
    assert len(one.id) == 32  # made by the client
    assert one.test_result is not None and one.test_result.passed is True
    assert one.tool_calls[0].name == "search_flights"
    batch = client.experience_record_many(items=[_experience(agent_id, n) for n in range(2, 7)])
    assert (batch.created, batch.existing) == (5, 0)
    assert client.experience_get(experience_id=batch.items[0].id).task == "task 2: book a flight"
    known = {**_experience(agent_id, 2), "id": batch.items[0].id}
    again = client.experience_record_many(items=[known])
    assert (again.created, again.existing) == (0, 1)

    seen, cursor = [], None
    while True:
        page = client.experience_list(agent_id=agent_id, cursor=cursor)
        seen += [e.id for e in page.results]
        cursor = cursor_of(page.next)
        if cursor is None:
            break
    assert set(seen) == {one.id, *(item.id for item in batch.items)}
    passed = client.experience_list(agent_id=agent_id, passed=True).results
    assert {e.test_result.passed for e in passed} == {True}

    result = client.experience_td_errors_update(td_errors={one.id: 0.5, "nope": 1.0})
    assert (result.updated, result.unknown_ids) == (1, ["nope"])
    assert client.experience_get(experience_id=one.id).td_error == 0.5

    replay = client.replay_sample(agent_id=agent_id, batch_size=16, seed=7, strategy="uniform")
    assert isinstance(replay, m.ReplayBatch)
    assert (replay.buffer_size, len(replay.items)) == (6, 16)
    assert replay == client.replay_sample(
        agent_id=agent_id, batch_size=16, seed=7, strategy="uniform"
    )  # seeded: the same draw
    with pytest.raises(ConflictError):
        client.replay_sample(agent_id=agent_id, min_size=100)
    assert client.experience_stats()["count"] >= 6

    assert client.experience_delete(experience_id=one.id) is None
    with pytest.raises(NotFoundError):
        client.experience_get(experience_id=one.id)


def test_dream_cycle_resources(client, server, agent_id):
    client.experience_record_many(items=[_experience(agent_id, n) for n in range(6)])
    assert client.dream_cycle_claim(agent_id=agent_id) is None  # none recorded yet
    server.manage("dream", "--agent", agent_id, "--seed", "3")
    listed = client.dream_cycles_list(agent_id=agent_id, status="pending")
    assert [c.agent_id for c in listed.results] == [agent_id]
    assert cursor_of(listed.next) is None
    detail = client.dream_cycle_get(cycle_id=listed.results[0].id)
    assert isinstance(detail, m.DreamCycleDetail)
    assert len(detail.items) == 8
    claimed = client.dream_cycle_claim(agent_id=agent_id, learner="test", lease_seconds=60)
    assert claimed is not None
    assert claimed.claimed_by == "test"
    done = client.dream_cycle_report(
        cycle_id=claimed.id,
        lease_token=claimed.lease_token,
        td_errors={item.experience_id: 0.25 for item in claimed.items},
    )
    assert done.cycle.status == "completed"
    with pytest.raises(ConflictError):  # reported already
        client.dream_cycle_report(
            cycle_id=claimed.id,
            lease_token=claimed.lease_token,
            td_errors={item.experience_id: 0.25 for item in claimed.items},
        )


def test_the_async_client_does_the_same(server, agent_id):
    async def scenario() -> None:
        async with AsyncClient(server.api_key, server.base_url, retry=FAST_RETRY) as ferrum:
            stored = await ferrum.memory_store(agent_id=agent_id, content="Async works too.")
            hits = await ferrum.memory_search(agent_id=agent_id, query="async")
            assert hits.results[0].item.point_id == stored.point_id
            state = await ferrum.session_start(agent_id=agent_id)
            state = await ferrum.session_append(
                session_id=state.session_id, messages=[{"role": "user", "content": "hi"}]
            )
            assert state.version == 2
            with pytest.raises(NotFoundError):
                await ferrum.memory_get(point_id="no-such-item")

    asyncio.run(scenario())


def test_a_given_http_client_is_used_and_left_open(server):
    seen = []
    http = httpx.Client(event_hooks={"request": [lambda request: seen.append(request.url.path)]})
    with Client(server.api_key, server.base_url, http_client=http) as ferrum:
        ferrum.health()
    assert seen == ["/health"]
    assert not http.is_closed
    http.close()


def test_the_readme_quickstart_runs(server, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Quickstart with the Python SDK", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("FERRUM_URL", server.base_url)
    monkeypatch.setenv("FERRUM_API_KEY", server.api_key)
    exec(compile(code, "README.md", "exec"), {})
    assert "Deploys go through ops/deploy.sh, on the VPN." in capsys.readouterr().out


@pytest.mark.parametrize(
    ("status", "body", "cls", "message", "fields"),
    [
        (
            400,
            {"limit": ["Too big."], "kinds": {"0": ["Bad kind."]}},
            BadRequestError,
            "limit: Too big.; kinds.0: Bad kind.",
            {"limit": ["Too big."], "kinds.0": ["Bad kind."]},
        ),
        (
            400,
            [{}, {"task": ["Required."]}],
            BadRequestError,
            "1.task: Required.",
            {"1.task": ["Required."]},
        ),
        (
            400,
            ["Not a list."],
            BadRequestError,
            "non_field_errors: Not a list.",
            {"non_field_errors": ["Not a list."]},
        ),
        (409, {"detail": "Stale.", "current_version": 3}, ConflictError, "Stale.", {}),
        (502, "<html>bad gateway</html>", InternalServerError, "<html>bad gateway</html>", {}),
        (418, "", APIStatusError, "I'm a teapot", {}),
        (400, {"x": 1}, BadRequestError, "x: 1", {"x": ["1"]}),
    ],
)
def test_an_error_answer_becomes_an_exception_with_its_fields(status, body, cls, message, fields):
    content = body if isinstance(body, str) else json.dumps(body)
    error = error_from_response(httpx.Response(status, content=content))
    assert type(error) is cls
    assert (error.status, error.message, error.field_errors) == (status, message, fields)
    assert error.body == body
    assert str(error) == f"{status}: {message}"


def test_a_page_link_gives_its_cursor():
    assert cursor_of("http://x/experience/?cursor=cD0y&agent_id=a") == "cD0y"
    assert cursor_of("http://x/experience/?agent_id=a") is None
    assert cursor_of(None) is None

"""Access control on every API route, generated from the URL configuration.

Each route and method of the API needs a case in CASES (or a place in PUBLIC): a route added
later without one fails test_every_api_route_has_a_case, so it is covered without anyone
remembering. A case is a request aimed at another agent's data; it is also sent at the key's own
agent, which must succeed, so a refusal is proven to come from the key and not from a bad request.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from experience.dream_services import dream_cycle_claim, dream_cycle_run
from experience.models import DreamCycle, Experience, ReplaySettings
from ferrum_memory.core.services import api_key_create
from memory.models import MemoryItem
from memory.services import reset_model_check
from memory.vector_index import reset_vector_index
from sessions.models import Session
from tests.experience.dream_helpers import stock

pytestmark = pytest.mark.django_db

OWN, OTHER = "agent-own", "agent-other"
# Routes that need no key (DESIGN.md, Security); the admin has its own login (tested below).
PUBLIC = {"health", "openapi", "docs"}
# Writes that only a key not limited to agents may make (an operator's, not an agent's).
UNRESTRICTED_ONLY = {("experience-settings", "put")}
WRITE_METHODS = {"post", "put", "patch", "delete"}
# POSTs that only read (their query is a body): a read-only key may send them.
READ_POSTS = {("memory-search", "post"), ("memory-context", "post")}


@dataclass
class AgentData:
    """One agent's data, created through the API (and the dream services) before each case."""

    agent_id: str
    point_id: str
    experience_id: str
    session_id: str
    session_version: int
    pending_cycle_id: int
    claimed_cycle_id: int
    lease_token: str
    claimed_experience_ids: list[str]


@dataclass(frozen=True)
class Request:
    path: str
    body: dict[str, Any] | None = None  # JSON body, or the query of a GET
    lines: list[dict[str, Any]] | None = None  # a JSON Lines body instead


def _empty_export(data: AgentData) -> Request:
    """An import of an export with nothing in it: 201 on the key's own agent."""
    header = {
        "type": "header",
        "format": "ferrum-memory-agent",
        "version": 1,
        "agent_id": data.agent_id,
        "embedding_model": "any",
        "embedding_dim": 384,
    }
    kinds = ("memory_items", "memory_events", "experiences", "sessions", "dream_cycles")
    end = {"type": "end", "counts": dict.fromkeys(kinds, 0)}
    return Request(f"/agents/{data.agent_id}/import", lines=[header, end])


Case = Callable[[AgentData], Request]


def _dream_report(data: AgentData) -> Request:
    path = f"/dream/cycles/{data.claimed_cycle_id}/td-errors"
    report = [{"experience_id": e, "td_error": 0.5} for e in data.claimed_experience_ids]
    return Request(path, {"lease_token": data.lease_token, "td_errors": report})


# route name -> method -> the request aimed at `data`'s agent.
CASES: dict[str, dict[str, Case]] = {
    "memory-store": {
        "post": lambda d: Request("/memory/store", {"agent_id": d.agent_id, "content": "new"})
    },
    "memory-search": {
        "post": lambda d: Request("/memory/search", {"agent_id": d.agent_id, "query": "fact"})
    },
    "memory-list": {"get": lambda d: Request("/memory/", {"agent_id": d.agent_id})},
    "memory-context": {
        "post": lambda d: Request(
            "/memory/context",
            {
                "agent_id": d.agent_id,
                "query": "fact",
                "token_budget": 200,
                "session_id": d.session_id,
            },
        )
    },
    "memory-detail": {
        "get": lambda d: Request(f"/memory/{d.point_id}"),
        "patch": lambda d: Request(f"/memory/{d.point_id}", {"version": 1, "importance": 0.9}),
        "delete": lambda d: Request(f"/memory/{d.point_id}"),
    },
    "memory-history": {"get": lambda d: Request(f"/memory/{d.point_id}/history")},
    "memory-compress": {
        "post": lambda d: Request(f"/memory/compress?session_id={d.session_id}"),
    },
    "experience-list": {
        "get": lambda d: Request("/experience/", {"agent_id": d.agent_id}),
        "post": lambda d: Request(
            "/experience/", {"agent_id": d.agent_id, "task": "t", "reward": 1.0}
        ),
    },
    "experience-stats": {"get": lambda d: Request("/experience/stats")},
    "experience-td-error": {
        "put": lambda d: Request(
            "/experience/td-error", {"experience_id": d.experience_id, "td_error": 0.5}
        )
    },
    "experience-replay": {
        "get": lambda d: Request("/experience/replay", {"agent_id": d.agent_id}),
    },
    "experience-settings": {
        "get": lambda d: Request("/experience/settings", {"agent_id": d.agent_id}),
        "put": lambda d: Request("/experience/settings", {"agent_id": d.agent_id, "max_size": 99}),
    },
    "experience-detail": {
        "get": lambda d: Request(f"/experience/{d.experience_id}"),
        "delete": lambda d: Request(f"/experience/{d.experience_id}"),
    },
    "dream-cycle-list": {"get": lambda d: Request("/dream/cycles/", {"agent_id": d.agent_id})},
    "dream-cycle-claim": {
        "post": lambda d: Request("/dream/cycles/claim", {"agent_id": d.agent_id})
    },
    "dream-cycle-detail": {"get": lambda d: Request(f"/dream/cycles/{d.pending_cycle_id}")},
    "dream-cycle-td-errors": {"post": _dream_report},
    "session-start": {"post": lambda d: Request("/session/start", {"agent_id": d.agent_id})},
    "session-detail": {
        "get": lambda d: Request(f"/session/{d.session_id}"),
        "put": lambda d: Request(
            f"/session/{d.session_id}", {"version": d.session_version, "task": "changed"}
        ),
    },
    "session-close": {"post": lambda d: Request("/session/close", {"session_id": d.session_id})},
    "agent-detail": {"delete": lambda d: Request(f"/agents/{d.agent_id}")},
    "agent-export": {"get": lambda d: Request(f"/agents/{d.agent_id}/export")},
    "agent-import": {"post": _empty_export},
    "stats": {"get": lambda d: Request("/stats")},
    "metrics": {"get": lambda d: Request("/metrics")},
}


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            if entry.app_name != "admin":  # the admin's own views: see test_admin_*
                yield from _walk(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield entry.name or prefix + str(entry.pattern), prefix + str(entry.pattern), entry


def api_routes() -> list[tuple[str, str]]:
    """(route name, method) of every API view in the URL configuration."""
    routes = []
    for name, _, entry in _walk(get_resolver().url_patterns):
        view_class = getattr(entry.callback, "view_class", None)
        methods = getattr(view_class, "http_method_names", [])
        routes += [
            (name, m) for m in methods if m not in {"options", "head"} and hasattr(view_class, m)
        ]
    return routes


def guarded_routes() -> list[tuple[str, str]]:
    return [(name, method) for name, method in api_routes() if name not in PUBLIC]


def client_for(raw_key: str | None = None) -> APIClient:
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def send(client: APIClient, method: str, request: Request) -> Any:
    if request.lines is not None:
        body = b"".join(orjson.dumps(line) + b"\n" for line in request.lines)
        return client.post(request.path, body, content_type="application/x-ndjson")
    if method == "get":
        return client.get(request.path, request.body or {})
    return getattr(client, method)(request.path, request.body, format="json")


@pytest.fixture
def seeded(settings, tmp_path) -> Iterator[dict[str, AgentData]]:
    """Both agents' data: a memory item, experiences, a session, a pending and a claimed cycle."""
    settings.DATA_DIR = tmp_path  # a fresh embedded vector index
    settings.QDRANT_URL = ""
    settings.DREAM_MIN_EXPERIENCES = 1
    settings.DREAM_MAX_PENDING = 0
    reset_vector_index()
    reset_model_check()
    admin = client_for(api_key_create(name="seed")[1])
    data = {}
    for agent_id in (OWN, OTHER):
        point = admin.post(
            "/memory/store",
            {"agent_id": agent_id, "content": f"a fact of {agent_id}"},
            format="json",
        )
        session = admin.post(
            "/session/start", {"agent_id": agent_id, "task": "seed"}, format="json"
        )
        experiences = stock(agent_id, 4)
        claimed = dream_cycle_run(agent_id=agent_id, seed=1)
        pending = dream_cycle_run(agent_id=agent_id, seed=2)
        claim = dream_cycle_claim(agent_id=agent_id, learner="seed")
        assert claim is not None and claim.pk == claimed.pk
        data[agent_id] = AgentData(
            agent_id=agent_id,
            point_id=point.json()["point_id"],
            experience_id=experiences[0].experience_id,
            session_id=session.json()["session_id"],
            session_version=session.json()["version"],
            pending_cycle_id=pending.pk,
            claimed_cycle_id=claim.pk,
            lease_token=claim.lease_token,
            claimed_experience_ids=sorted(set(claim.items.values_list("experience_id", flat=True))),
        )
    yield data
    reset_vector_index()


def other_agents_rows(agent_id: str) -> dict[str, list[Any]]:
    """Everything an agent owns, as the database holds it: unchanged after a refused request."""
    return {
        "memory": list(MemoryItem.objects.filter(agent_id=agent_id).values().order_by("pk")),
        "experience": list(Experience.objects.filter(agent_id=agent_id).values().order_by("pk")),
        "session": list(Session.objects.filter(agent_id=agent_id).values().order_by("pk")),
        "cycles": list(DreamCycle.objects.filter(agent_id=agent_id).values().order_by("pk")),
        "replay_settings": list(ReplaySettings.objects.filter(agent_id=agent_id).values()),
    }


def test_every_api_route_has_a_case():
    missing = [
        f"{method.upper()} {name}"
        for name, method in guarded_routes()
        if method not in CASES.get(name, {})
    ]
    assert not missing, f"Routes with no access-control case in CASES: {missing}"
    stale = {name for name in CASES} - {name for name, _ in api_routes()}
    assert not stale, f"CASES names routes that no longer exist: {stale}"


@pytest.mark.parametrize(("name", "method"), guarded_routes())
@pytest.mark.parametrize("key", [None, "fm_not-a-key"], ids=["no-key", "bad-key"])
def test_a_request_without_a_valid_key_gets_401(seeded, name, method, key):
    response = send(client_for(key), method, CASES[name][method](seeded[OTHER]))
    assert response.status_code == 401, response.content


@pytest.mark.parametrize(("name", "method"), guarded_routes())
def test_a_key_limited_to_one_agent_never_reaches_another_agents_data(seeded, name, method):
    client = client_for(api_key_create(name="own", allowed_agent_ids=[OWN])[1])
    before = other_agents_rows(OTHER)

    response = send(client, method, CASES[name][method](seeded[OTHER]))

    assert response.status_code in {200, 403, 404}, response.content
    if response.status_code == 200:
        # A read over the key's agents, or a TD-error update that reports the other agent's
        # id as unknown: nothing of the other's in the answer, nothing changed (below).
        assert method == "get" or name == "experience-td-error"
        assert OTHER.encode() not in response.content
    assert other_agents_rows(OTHER) == before
    own = send(client, method, CASES[name][method](seeded[OWN]))
    if (name, method) in UNRESTRICTED_ONLY:
        # Refused on the key's own agent too; a key for every agent is served.
        assert own.status_code == 403, own.content
        unrestricted = client_for(api_key_create(name="all")[1])
        served = send(unrestricted, method, CASES[name][method](seeded[OWN]))
        assert 200 <= served.status_code < 300, served.content
        return
    # The same request on the key's own agent is served: the refusal above was about the agent.
    assert 200 <= own.status_code < 300, own.content


@pytest.mark.parametrize(
    ("name", "method"),
    [r for r in guarded_routes() if r[1] in WRITE_METHODS and r not in READ_POSTS],
)
def test_a_read_only_key_cannot_write(seeded, name, method):
    client = client_for(api_key_create(name="ro", read_only=True)[1])
    before = {agent: other_agents_rows(agent) for agent in (OWN, OTHER)}

    response = send(client, method, CASES[name][method](seeded[OWN]))

    assert response.status_code == 403, response.content
    assert {agent: other_agents_rows(agent) for agent in (OWN, OTHER)} == before


@pytest.mark.parametrize(
    ("name", "method"), [r for r in guarded_routes() if r[1] == "get" or r in READ_POSTS]
)
def test_a_read_only_key_can_read(seeded, name, method):
    client = client_for(api_key_create(name="ro", read_only=True)[1])
    response = send(client, method, CASES[name][method](seeded[OWN]))
    assert response.status_code == 200, response.content


def test_admin_needs_a_staff_login(client, django_user_model):
    index = reverse("admin:index")
    assert client.get(index).status_code == 302  # to the login page
    # django-axes (login limits) refuses client.login(), which authenticates without a request:
    # the user who is not staff is logged in directly (the admin's form refuses them), the staff
    # through the admin's login form.
    client.force_login(django_user_model.objects.create_user(username="user", password="pw"))
    assert client.get(index).status_code == 302  # logged in, but not staff
    django_user_model.objects.create_user(username="staff", password="pw", is_staff=True)
    client.logout()
    login = client.post(reverse("admin:login"), {"username": "staff", "password": "pw"})
    assert login.status_code == 302
    assert client.get(index).status_code == 200


def test_an_api_key_does_not_open_the_admin(client, api_key):
    response = client.get(reverse("admin:index"), HTTP_AUTHORIZATION=f"Bearer {api_key[1]}")
    assert response.status_code == 302

"""Observability: traces (in-memory exporter in the test process, a real OTLP/HTTP receiver for
a real Celery worker), Prometheus series on /metrics, and JSON log lines with the ids."""

import gzip
import io
import json
import logging
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from django.db import connection, connections, transaction
from django_celery_beat.models import PeriodicTask
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from pythonjsonlogger.json import JsonFormatter

from ferrum_memory.core.revisions import revision_take
from ferrum_memory.core.telemetry import setup_tracing, teardown_tracing
from memory.models import MemoryItem
from memory.services import reset_model_check
from memory.vector_index import EmbeddingModelMismatch, get_vector_index, reset_vector_index
from sessions.working_memory import reset_working_memory
from tests.experience.factories import experience_jsons
from tests.experience.test_dream_e2e import celery_processes, process_env, wait_for

ROOT = Path(__file__).resolve().parents[2]
AGENT = "observed"
SECRET = "The vault combination is 4-8-15-16-23-42."

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def traced() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, to memory, for this module's tests; then off again."""
    assert setup_tracing(EXPORTER)
    # Connections opened before tracing are not traced: the next query opens a traced one.
    connections.close_all()
    yield EXPORTER
    teardown_tracing()


@pytest.fixture
def spans(traced: InMemorySpanExporter) -> InMemorySpanExporter:
    traced.clear()
    return traced


@pytest.fixture(autouse=True)
def fresh_engines(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.QDRANT_URL = ""
    reset_vector_index()
    reset_model_check()
    reset_working_memory()
    yield
    reset_vector_index()
    reset_working_memory()


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in spans.get_finished_spans() if span.name == name]


def one(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, [span.name for span in spans.get_finished_spans()]
    return found[0]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def children(spans: InMemorySpanExporter, span: ReadableSpan) -> list[ReadableSpan]:
    """Our spans right under `span` (not the database's), in the order they started."""
    below = [
        s
        for s in spans.get_finished_spans()
        if parent_id(s) == span.context.span_id and not attrs(s).get("db.system")
    ]
    return sorted(below, key=lambda s: s.start_time or 0)


def ancestors(spans: InMemorySpanExporter, span: ReadableSpan) -> list[str]:
    """The names of the spans above `span`, nearest first."""
    by_id = {s.context.span_id: s for s in spans.get_finished_spans()}
    names = []
    while (up := by_id.get(parent_id(span) or 0)) is not None:
        names.append(up.name)
        span = up
    return names


# Traces -------------------------------------------------------------------------------------


def test_tracing_is_off_without_an_endpoint(tmp_path):
    # A fresh process, as a web or worker process starts (the one running the tests traces):
    # no provider, no library instrumented, our spans are the no-op ones.
    code = (
        "import django, sys; django.setup();"
        "from opentelemetry import trace;"
        "from ferrum_memory.core.telemetry import setup_tracing, tracer;"
        "on = setup_tracing();"
        "span = tracer.start_span('x');"
        "instrumented = any(m.startswith('opentelemetry.instrumentation') for m in sys.modules);"
        "print(on, span.is_recording(), instrumented, type(trace.get_tracer_provider()).__name__)"
    )
    env = {**process_env(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": ""}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "False", "False", "ProxyTracerProvider"]


@pytest.mark.django_db
def test_store_then_search_is_traced_with_our_spans_under_each_request(api_client, spans):
    stored = api_client.post("/memory/store", {"agent_id": AGENT, "content": SECRET}, format="json")
    assert stored.status_code == 201, stored.json()
    found = api_client.post(
        "/memory/search", {"agent_id": AGENT, "query": "vault combination"}, format="json"
    )
    assert found.status_code == 200 and found.json()["results"]

    store_request = one(spans, "POST memory/store")
    search_request = one(spans, "POST memory/search")
    assert attrs(store_request)["request_id"] == stored["X-Request-ID"]
    assert store_request.context.trace_id != search_request.context.trace_id

    embedded = one(spans, "embedding.documents")
    assert embedded.context.trace_id == store_request.context.trace_id
    assert "POST memory/store" in ancestors(spans, embedded)
    assert attrs(embedded)["batch_size"] == 1

    search = one(spans, "memory.search")
    assert parent_id(search) == search_request.context.span_id
    assert attrs(search)["agent_id"] == AGENT
    assert attrs(search)["mode"] == "hybrid"
    assert attrs(search)["result_count"] == 1
    query, vector_search = children(spans, search)
    assert query.name == "embedding.query"
    assert vector_search.name == "vector_index.search"
    assert attrs(vector_search)["result_count"] >= 1
    (catch_up,) = children(spans, vector_search)
    assert catch_up.name == "index.catch_up" and attrs(catch_up)["index"] == "memory"

    if connection.vendor == "postgresql":  # psycopg's instrumentation; SQLite has none
        queries = [s for s in spans.get_finished_spans() if attrs(s).get("db.system")]
        assert any("POST memory/store" in ancestors(spans, query) for query in queries)

    # Ids and sizes only: memory content never goes into a span.
    for span in spans.get_finished_spans():
        for value in (span.attributes or {}).values():
            assert "vault" not in str(value), (span.name, value)


@pytest.mark.django_db
def test_replay_sampling_is_traced_with_strategy_batch_size_and_results(api_client, spans):
    assert api_client.post("/experience/", experience_jsons(5, agent_id=AGENT), format="json")
    response = api_client.get(f"/experience/replay?batch_size=7&agent_id={AGENT}&seed=1")
    assert response.status_code == 200, response.json()

    sample = one(spans, "replay.sample")
    assert parent_id(sample) == one(spans, "GET experience/replay").context.span_id
    assert attrs(sample) == {
        "strategy": "prioritized",
        "batch_size": 7,
        "agent_id": AGENT,
        "result_count": 7,
    }
    catch_up = one(spans, "index.catch_up")
    assert parent_id(catch_up) == sample.context.span_id
    assert attrs(catch_up)["index"] == "experience"


class OtlpReceiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver, as a collector would be: keeps the spans it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        super().__init__(("127.0.0.1", 0), OtlpHandler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class OtlpHandler(BaseHTTPRequestHandler):
    server: OtlpReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.server.spans.extend(scope_spans.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    yield receiver
    receiver.shutdown()
    receiver.server_close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.django_db(transaction=True)
def test_a_closed_session_is_one_trace_from_the_request_to_the_worker_task(
    api_client,
    spans,
    tmp_path,
    send_tasks_to,
    otlp_receiver,
    monkeypatch,
):
    """The close request publishes through a real broker; a real worker runs the task and
    exports its spans over OTLP. The task's span is a child of the request's publish span."""
    PeriodicTask.objects.update(enabled=False)  # only the close's task runs
    metrics_port = free_port()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export soon, not every 5 s
    monkeypatch.setenv("WORKER_METRICS_BIND", f"127.0.0.1:{metrics_port}")
    with celery_processes(tmp_path) as logs:
        send_tasks_to(process_env(tmp_path)["CELERY_BROKER_URL"])
        start = api_client.post(
            "/session/start",
            {
                "agent_id": AGENT,
                "task": "Rotate the keys",
                "messages": [{"role": "user", "content": "Rotate the signing keys today."}],
            },
            format="json",
        )
        assert start.status_code == 201, start.json()
        closed = api_client.post(
            "/session/close",
            {"session_id": start.json()["session_id"]},
            format="json",
            HTTP_X_REQUEST_ID="close-req-42",
        )
        assert closed.status_code == 202, closed.json()
        assert closed["X-Request-ID"] == "close-req-42"
        task_id = closed.json()["task_id"]

        run = wait_for(
            lambda: next(
                (s for s in otlp_receiver.spans if s.name == "run/sessions.consolidate"), None
            ),
            logs,
            "the worker's task span",
        )
        metrics = wait_for(
            lambda: worker_metrics(metrics_port, "sessions.consolidate"),
            logs,
            "the worker to count the consolidation",
        )

    request = one(spans, "POST session/close")
    publish = one(spans, "apply_async/sessions.consolidate")
    assert "POST session/close" in ancestors(spans, publish)
    assert run.trace_id.hex() == format(request.context.trace_id, "032x")
    assert run.parent_span_id.hex() == format(publish.context.span_id, "016x")
    worker_spans = {s.name for s in otlp_receiver.spans if s.trace_id == run.trace_id}
    assert {"embedding.documents", "index.catch_up"} <= worker_spans
    assert metrics == 1.0

    # The worker's lines for this task are JSON and carry the request's id and its trace id.
    task_lines = [
        json.loads(line)
        for line in (tmp_path / "worker.log").read_text().splitlines()
        if line.startswith("{") and task_id in line
    ]
    in_task = [line for line in task_lines if line["task_id"] == task_id]
    assert in_task, task_lines
    for line in in_task:
        assert line["request_id"] == "close-req-42"
        assert line["trace_id"] == run.trace_id.hex()


def worker_metrics(port: int, task: str) -> float | None:
    with urlopen(f"http://127.0.0.1:{port}/metrics") as response:
        text = response.read().decode()
    return sample(text, "ferrum_task_runs_total", task=task, outcome="success")


# Metrics ------------------------------------------------------------------------------------


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and labels.items() <= found.labels.items():
                return float(found.value)
    return None


@pytest.mark.django_db
def test_metrics_expose_the_named_series_after_traffic(
    api_client, settings, django_capture_on_commit_callbacks
):
    def scrape() -> str:
        response = api_client.get("/metrics")
        assert response.status_code == 200
        return response.content.decode()

    def post(path: str, body: Any) -> int:
        return api_client.post(path, body, format="json").status_code

    before = scrape()
    assert post("/memory/store", {"agent_id": AGENT, "content": SECRET}) == 201
    assert post("/memory/search", {"agent_id": AGENT, "query": "vault"}) == 200
    assert post("/experience/", experience_jsons(3, agent_id=AGENT)) == 201
    assert api_client.get("/experience/replay?batch_size=4&strategy=uniform").status_code == 200
    start = api_client.post("/session/start", {"agent_id": AGENT, "task": "t"}, format="json")
    with django_capture_on_commit_callbacks(execute=True):  # the close's task runs eagerly
        assert post("/session/close", {"session_id": start.json()["session_id"]}) == 202
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: the store is down
    reset_working_memory()
    assert post("/session/start", {"agent_id": AGENT}) == 503
    after = scrape()

    def grew(name: str, **labels: str) -> float:
        return (sample(after, name, **labels) or 0.0) - (sample(before, name, **labels) or 0.0)

    api = "ferrum_api_request_duration_seconds_count"
    assert grew(api, operation="memory/store", method="POST", status="201") == 1
    assert grew(api, operation="memory/search", method="POST", status="200") == 1
    assert grew(api, operation="experience/replay", method="GET", status="200") == 1
    assert grew("ferrum_replay_sample_duration_seconds_count", strategy="uniform") == 1
    assert grew("ferrum_embedding_duration_seconds_count", kind="query") == 1
    assert grew("ferrum_embedding_batch_size_sum", kind="documents") >= 1
    assert sample(after, "ferrum_index_lag_revisions", index="memory") == 0
    assert sample(after, "ferrum_index_lag_revisions", index="experience") == 0
    runs = "ferrum_task_runs_total"
    assert grew(runs, task="sessions.consolidate", outcome="success") == 1
    assert grew("ferrum_working_memory_errors_total", engine="redis") >= 1


@pytest.mark.django_db
def test_a_failing_index_catch_up_reports_its_lag(api_client):
    for n in range(2):
        assert api_client.post(
            "/memory/store", {"agent_id": AGENT, "content": f"fact {n}"}, format="json"
        ).json()["indexed"]
    assert REGISTRY.get_sample_value("ferrum_index_lag_revisions", {"index": "memory"}) == 0
    # Two writes the index cannot apply: rows embedded by another model (as after a model
    # change, before `memory_reindex`).
    for item in MemoryItem.objects.all():
        with transaction.atomic():
            item.embedding_model = "another/model"
            item.revision = revision_take(name="memory")
            item.save()
    with pytest.raises(EmbeddingModelMismatch):
        get_vector_index().catch_up()
    assert REGISTRY.get_sample_value("ferrum_index_lag_revisions", {"index": "memory"}) == 2


# Logs ---------------------------------------------------------------------------------------


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """What the JSON console handler of the LOGGING setting writes, for the test's duration."""
    handler = next(
        h for h in logging.getLogger().handlers if isinstance(h.formatter, JsonFormatter)
    )
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


@pytest.mark.django_db
def test_log_lines_are_json_with_the_request_id_and_trace_id(api_client, spans, log_lines):
    logging.getLogger("memory").warning("a line outside any request")
    stored = api_client.post(
        "/memory/store",
        {"agent_id": AGENT, "content": SECRET},
        format="json",
        HTTP_X_REQUEST_ID="req-7",
    )
    assert stored["X-Request-ID"] == "req-7"
    missing = api_client.get(f"/memory/{uuid.uuid4()}", HTTP_X_REQUEST_ID="req-8")
    assert missing.status_code == 404 and missing["X-Request-ID"] == "req-8"
    traces = {
        "req-7": format(one(spans, "POST memory/store").context.trace_id, "032x"),
        "req-8": format(one(spans, "GET memory/<uuid:point_id>").context.trace_id, "032x"),
    }

    outside, *inside = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    assert outside["request_id"] is None and outside["trace_id"] is None
    assert {line["request_id"] for line in inside} == {"req-7", "req-8"}
    for line in inside:
        assert line["trace_id"] == traces[line["request_id"]]
        assert {"time", "level", "logger", "message", "span_id", "task_id"} <= line.keys()
    access = [line for line in inside if line["logger"] == "ferrum_memory.access"]
    assert [(line["status"], line["level"]) for line in access] == [(201, "INFO"), (404, "WARNING")]
    assert access[0]["operation"] == "memory/store"


@pytest.mark.django_db
def test_a_request_id_is_made_when_none_or_an_unsafe_one_is_sent(api_client, log_lines):
    made = api_client.get("/stats")["X-Request-ID"]
    replaced = api_client.get("/stats", HTTP_X_REQUEST_ID="bad id\nforged: line")["X-Request-ID"]
    assert len(made) == 32 and len(replaced) == 32 and made != replaced
    ids = [json.loads(line)["request_id"] for line in log_lines.getvalue().splitlines()]
    assert ids == [made, replaced]

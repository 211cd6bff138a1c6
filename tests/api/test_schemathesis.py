"""Property-based API test: schemathesis run against /openapi.json, as a new user runs it.

The schemathesis CLI, every check included (a schema-valid request refused fails it, as does a
schema-invalid one accepted), in all its phases: the schema's examples, coverage of its edge
values, fuzzing each operation, and stateful runs that follow the schema's OpenAPI links (store
then get, start then update then close, list dream cycles then claim then report). Warnings
fail the run too: "missing test data" means an operation was never reached past a 404.
No case is filtered or patched here: whatever the schema admits, the server must accept.

It needs only the embedded defaults, which the server uses in either run of scripts/test.sh, so
the scaled-out run deselects it (-m "not live_server") instead of testing the same thing twice.
"""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import requests
from drf_spectacular.generators import SchemaGenerator
from schemathesis.config import SchemathesisWarning

from .live_server import LiveServer, live_server
from .schemathesis_hooks import FIXTURES_AGENT

# Cases per operation and phase; the whole run is bounded by the time limit below as well.
EXAMPLES_PER_OPERATION = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "50"))
SEED = int(os.environ.get("SCHEMATHESIS_SEED", "20"))
HTTP_METHODS = {"get", "put", "post", "patch", "delete"}
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
ROOT = Path(__file__).resolve().parents[2]
FAILING_WARNINGS = [
    w.value
    for w in SchemathesisWarning
    if w not in {SchemathesisWarning.VALIDATION_MISMATCH, SchemathesisWarning.LOW_VALID_RATE}
]

pytestmark = pytest.mark.live_server


def schema_operations() -> set[str]:
    """ "METHOD path" of every operation, read from the schema the server will serve."""
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    return {
        f"{method.upper()} {path}"
        for path, item in paths.items()
        for method in item
        if method in HTTP_METHODS
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LiveServer]:
    # The throttle would answer 429 to this many requests a minute; it is tested elsewhere.
    # One-draw dream cycles, so that the schema's claim-then-report link fills a whole report.
    with live_server(
        tmp_path_factory.mktemp("live"),
        API_THROTTLE_RATE="1000000/min",
        DREAM_BATCH_SIZE="1",
        DREAM_MIN_EXPERIENCES="1",
        DREAM_MAX_PENDING="0",
    ) as live:
        yield live


def _post(live: LiveServer, path: str, body: Any) -> Any:
    response = requests.post(
        f"{live.base_url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {live.api_key}"},
        timeout=120,
    )
    response.raise_for_status()
    return response.json()


def known_ids(live: LiveServer) -> dict[str, dict[str, str]]:
    """Stored data for the operations that need an id, as the schemathesis config's
    `parameters` per operation: the fuzzing phase reaches each past its 404 too. (The stateful
    phase follows the schema's links, but starts its chains only at operations whose inputs it
    believes some response produces, and no response produces an `agent_id`.)"""
    experiences = [{"agent_id": FIXTURES_AGENT, "task": f"task {i}", "reward": i} for i in range(8)]
    _post(live, "/experience/", experiences)
    # Cycles for a learner to claim: beat makes them in production, no worker runs here.
    live.manage(
        "shell",
        "-c",
        "from experience.dream_services import dream_cycle_run\n"
        f"for _ in range(40): dream_cycle_run(agent_id={FIXTURES_AGENT!r})",
    )
    facts = ("The kettle is in the left cupboard.", "Deploys run on Fridays at noon.")
    memory = [{"agent_id": FIXTURES_AGENT, "content": fact} for fact in facts]
    kept, deleted = (item["point_id"] for item in _post(live, "/memory/store", memory)["items"])
    read, compressed, closed = (
        _post(live, "/session/start", {"agent_id": FIXTURES_AGENT, "task": "t"})["session_id"]
        for _ in range(3)
    )
    return {
        "GET /memory/{point_id}": {"point_id": kept},
        "DELETE /memory/{point_id}": {"point_id": deleted},
        "GET /session/{session_id}": {"session_id": read},
        "PUT /session/{session_id}": {"session_id": read},
        "POST /memory/compress": {"session_id": compressed},
        "POST /session/close": {"body.session_id": closed},
        "POST /dream/cycles/{cycle_id}/td-errors": {"cycle_id": "1"},
    }


def schemathesis_config(ids: dict[str, dict[str, str]]) -> str:
    blocks = [
        f"[[operations]]\ninclude-name = {json.dumps(name)}\n[operations.parameters]\n"
        + "".join(f"{json.dumps(key)} = {json.dumps(value)}\n" for key, value in values.items())
        for name, values in ids.items()
    ]
    # One item to delete, and a negative case (an unknown query parameter, which the API
    # ignores) may delete it first: valid cases only there, so a valid one is served.
    blocks.append(
        '[[operations]]\ninclude-name = "DELETE /memory/{point_id}"\n'
        '[operations.generation]\nmode = "positive"\n'
    )
    # A JSON Lines import is a string to a JSON Schema; what makes it an export (a header, typed
    # lines, an end line that counts them) is beyond one, so a generated string is no export:
    # its refusal is no finding. tests/agents/test_transfer.py imports real ones.
    blocks.append(
        '[[operations]]\ninclude-name = "POST /agents/{agent_id}/import"\n'
        "[operations.checks.positive_data_acceptance]\nenabled = false\n"
    )
    # Every check, in the config rather than as `--checks all` (which would override the one
    # exception above).
    # The import's refusals are no schema mismatch either (the test checks that only it warns
    # so); every other warning fails the run.
    warnings = f"[warnings]\nfail-on = {json.dumps(FAILING_WARNINGS)}\n"
    return "\n".join(["[checks]\nenabled = true\n", warnings, *blocks])


def test_schemathesis_with_every_check_finds_nothing(server, tmp_path):
    config = tmp_path / "schemathesis.toml"
    config.write_text(schemathesis_config(known_ids(server)))
    junit = tmp_path / "junit.xml"
    run = subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(config),
            "--no-color",
            "run",
            f"{server.base_url}/openapi.json",
            "--header",
            f"Authorization: Bearer {server.api_key}",
            "--max-examples",
            str(EXAMPLES_PER_OPERATION),
            "--seed",
            str(SEED),
            # One worker thread: CPython 3.11.7's ast module counts its recursion in state
            # shared by threads (gh-106905, fixed in 3.11.8), and hypothesis parses lambdas'
            # sources while it draws: two workers once failed a CI run with "AST constructor
            # recursion depth mismatch".
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--report",
            "junit",
            "--report-junit-path",
            str(junit),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
        cwd=tmp_path,  # its cache folder
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
            "PYTHONPATH": str(ROOT),
        },
    )
    assert run.returncode == 0, run.stdout[-20_000:] + run.stderr[-5_000:]
    section = run.stdout.partition("= WARNINGS =")[2].partition("\n==")[0]
    warned = {line.strip() for line in section.splitlines() if line.startswith("  - ")}
    assert warned <= {"- POST /agents/{agent_id}/import"}, section
    assert section.count("Schema validation mismatch") == len(warned), section
    tested = {case.get("name") for case in ElementTree.parse(junit).iter("testcase")}
    assert schema_operations() <= tested, json.dumps(sorted(tested))

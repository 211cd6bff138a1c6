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
from xml.etree import ElementTree

import pytest
import requests
from drf_spectacular.generators import SchemaGenerator

from .live_server import LiveServer, live_server

# Cases per operation and phase; the whole run is bounded by the time limit below as well.
EXAMPLES_PER_OPERATION = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "50"))
SEED = int(os.environ.get("SCHEMATHESIS_SEED", "20"))
DREAMER = "dreamer"
HTTP_METHODS = {"get", "put", "post", "patch", "delete"}
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"

pytestmark = pytest.mark.live_server


def schema_operations() -> set[str]:
    """"METHOD path" of every operation, read from the schema the server will serve."""
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
        experiences = [{"agent_id": DREAMER, "task": f"task {i}", "reward": i} for i in range(8)]
        requests.post(
            f"{live.base_url}/experience/",
            json=experiences,
            headers={"Authorization": f"Bearer {live.api_key}"},
            timeout=60,
        ).raise_for_status()
        # Cycles for a learner to claim: beat makes them in production, no worker runs here.
        live.manage(
            "shell",
            "-c",
            "from experience.dream_services import dream_cycle_run\n"
            f"for _ in range(40): dream_cycle_run(agent_id={DREAMER!r})",
        )
        yield live


def test_schemathesis_with_every_check_finds_nothing(server, tmp_path):
    config = tmp_path / "schemathesis.toml"
    config.write_text("[warnings]\nfail-on = true\n")
    junit = tmp_path / "junit.xml"
    run = subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(config),
            "--no-color",
            "run",
            f"{server.base_url}/openapi.json",
            "--checks",
            "all",
            "--header",
            f"Authorization: Bearer {server.api_key}",
            "--max-examples",
            str(EXAMPLES_PER_OPERATION),
            "--seed",
            str(SEED),
            "--workers",
            "2",
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
    )
    assert run.returncode == 0, run.stdout[-20_000:] + run.stderr[-5_000:]
    summary = run.stdout[run.stdout.rfind("SUMMARY") :]
    assert "Warnings:" not in summary, summary
    tested = {case.get("name") for case in ElementTree.parse(junit).iter("testcase")}
    assert schema_operations() <= tested, json.dumps(sorted(tested))

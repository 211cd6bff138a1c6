"""A SESSION_SUMMARIZER for the worker-killed test (tests/sessions/summarizers.py has the others).

The first run signals that it is inside consolidation, by creating the file FAULT_MARKER, and
then hangs there until the test kills its worker; every later run summarizes at once."""

import os
import time
from pathlib import Path
from typing import Any

HANG_SECONDS = 600


def hang_the_first_time(*, state: dict[str, Any], lines: list[str], picked: list[str]) -> str:
    marker = Path(os.environ["FAULT_MARKER"])
    try:
        with marker.open("x") as created:
            created.write(str(os.getpid()))
    except FileExistsError:
        return f"Summary of {len(lines)} turns: " + " ".join(picked)
    time.sleep(HANG_SECONDS)  # killed before it ends
    raise AssertionError("the test should have killed this worker")

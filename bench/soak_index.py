"""``python bench/soak_index.py memory_index_server ...``: manage.py, with each index server
process (``--slot``, which the command starts for every server) tracing its allocations
(bench/soak_trace.py); bench/soak.py starts the index servers so with ``--tracemalloc``."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from soak_trace import start_tracing  # noqa: E402 - after the path set-up

if __name__ == "__main__":
    # manage.py's lines, not runpy.run_path(manage.py): that sets sys.argv[0] to manage.py, and
    # the command starts each server as sys.argv[0], which would then run untraced.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferrum_memory.settings.base")
    from django.core.management import execute_from_command_line

    from ferrum_memory.core.telemetry import setup_tracing

    if any(arg.startswith("--slot") for arg in sys.argv):
        start_tracing("index")
    setup_tracing()
    execute_from_command_line(sys.argv)

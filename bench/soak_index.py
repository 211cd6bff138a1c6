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
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferrum_memory.settings.base")
    from django.core.management import execute_from_command_line

    if any(arg.startswith("--slot") for arg in sys.argv):
        start_tracing("index")
    execute_from_command_line(sys.argv)

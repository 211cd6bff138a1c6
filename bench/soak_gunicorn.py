"""gunicorn settings for bench/soak.py: the service's own (gunicorn.conf.py, run here as it is),
and with ``--tracemalloc`` each web worker traces its allocations (bench/soak_trace.py)."""

import runpy
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_service = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
globals().update({k: v for k, v in _service.items() if not k.startswith("__")})
sys.path.insert(0, str(ROOT / "bench"))


def post_worker_init(worker: Any) -> None:
    _service["post_worker_init"](worker)
    from soak_trace import start_tracing

    start_tracing("web")

import signal
import subprocess
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from memory.index_server import serve


class Command(BaseCommand):
    help = (
        "Run the vector index servers (VECTOR_INDEX_SERVERS of them, or --servers): each owns "
        "a qdrant-edge shard, keeps it in step with the DB and answers searches over a socket."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--servers", type=int, default=None, help="how many (default: setting)")
        parser.add_argument("--slot", type=int, default=None, help="run this one server only")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["slot"] is not None:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            serve(options["slot"])
            return
        count = options["servers"] or settings.VECTOR_INDEX_SERVERS or 2
        # One process per server: each holds the GIL while it builds graphs, so two in one
        # process would stop each other.
        children = [
            subprocess.Popen([sys.executable, sys.argv[0], "memory_index_server", f"--slot={slot}"])
            for slot in range(count)
        ]

        def stop(*_: Any) -> None:
            for child in children:
                child.terminate()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"{count} vector index servers started.")
        codes = [child.wait() for child in children]
        if any(codes) and not all(code in (0, -signal.SIGTERM) for code in codes):
            raise SystemExit(1)

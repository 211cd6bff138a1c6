import signal
import subprocess
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from ferrum_memory.core.storage import hold_wal_files_in_this_process
from memory.index_server import serve

RESTART_DELAY_SECONDS = 1.0


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
            hold_wal_files_in_this_process()  # a server, as a web worker: core/storage.py
            serve(options["slot"])
            return
        count = options["servers"] or settings.VECTOR_INDEX_SERVERS or 2
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        signal.signal(signal.SIGINT, lambda *_: stopping.set())
        # One process per server: each holds the GIL while it builds graphs, so two in one
        # process would stop each other. A server that dies is started again.
        children = [self._start(slot) for slot in range(count)]
        self.stdout.write(f"{count} vector index servers started.", ending="\n")
        self.stdout.flush()
        while not stopping.wait(RESTART_DELAY_SECONDS):
            for slot, child in enumerate(children):
                if child.poll() is not None:
                    self.stderr.write(f"index server {slot} exited ({child.returncode}); again")
                    children[slot] = self._start(slot)
        for child in children:
            child.terminate()
        for child in children:
            child.wait()

    @staticmethod
    def _start(slot: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, sys.argv[0], "memory_index_server", f"--slot={slot}"]
        )

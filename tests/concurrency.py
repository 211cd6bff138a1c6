"""Bodies run in threads at once, each with its own DB connection (concurrency tests)."""

import threading
from collections.abc import Callable

from django.db import connection


def run_together(
    bodies: list[Callable[[], None]], *, until_done: Callable[[], None] | None = None
) -> None:
    """Run each body in its own thread, all starting at one moment; with `until_done`, another
    thread calls it in a loop until they are done (a reader catching up all the while). Each
    thread has its own DB connection; any exception fails the caller."""
    stop = threading.Event()
    start = threading.Barrier(len(bodies) + (until_done is not None))
    errors: list[BaseException] = []

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait()
                body()
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
            finally:
                connection.close()

        return run

    def loop(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            while not stop.is_set():
                body()

        return run

    threads = [threading.Thread(target=guarded(body)) for body in bodies]
    watcher = None if until_done is None else threading.Thread(target=guarded(loop(until_done)))
    if watcher is not None:
        watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    if watcher is not None:
        watcher.join()
    if errors:
        # Chained, so the report shows where the first failure was raised, not only its message.
        raise AssertionError(f"{len(errors)} thread(s) failed: {errors}") from errors[0]

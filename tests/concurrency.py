"""Writers in threads against a reader that catches up all the while (index tests)."""

import threading
from collections.abc import Callable

from django.db import connection


def run_writers_against_reader(
    writers: list[Callable[[], None]], catch_up: Callable[[], None]
) -> None:
    """Run each writer in its own thread while another thread calls `catch_up` in a loop until
    they are done. Each thread has its own DB connection; any exception fails the caller."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
            finally:
                connection.close()

        return run

    def reader() -> None:
        while not stop.is_set():
            catch_up()

    threads = [threading.Thread(target=guarded(writer)) for writer in writers]
    watcher = threading.Thread(target=guarded(reader))
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    watcher.join()
    if errors:
        # Chained, so the report shows where the first failure was raised, not only its message.
        raise AssertionError(f"{len(errors)} thread(s) failed: {errors}") from errors[0]

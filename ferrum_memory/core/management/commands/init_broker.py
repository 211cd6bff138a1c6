from typing import Any

from django.core.management.base import BaseCommand

from ferrum_memory.celery import app


class Command(BaseCommand):
    help = "Connect to the Celery broker and declare the default queue before the processes start."

    def handle(self, *args: Any, **options: Any) -> None:
        # On a new embedded (SQLite) broker, a worker and beat starting together can both try to
        # create the queue; kombu's SQLAlchemy transport does not recover from losing that race,
        # and beat then fails every send until restarted. Declaring it first avoids the race.
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)
            conn.default_channel.queue_declare(queue=app.conf.task_default_queue)
        self.stdout.write(f"Broker ready: {conn.as_uri()}")

from typing import Any

from django.core.management.base import BaseCommand

from memory.services import memory_reindex


class Command(BaseCommand):
    help = (
        "Re-embed memory items made by another model (and the sentences and word pieces of "
        "items stored without their vectors), then rebuild the vector index from the DB."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        redone = memory_reindex()
        self.stdout.write(f"Re-embedded {redone} items; the vector index was rebuilt.")

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from experience.serializers import ExperienceInSerializer
from experience.services import experience_create_many
from experience.tau_bench import experiences_from_file
from ferrum_memory.core.exceptions import ServiceError

CHUNK = 500


class Command(BaseCommand):
    help = "Load tau-bench trajectories (a historical_trajectories JSON file) as experiences."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument(
            "--agent", help="Agent id to store them under (default: from the file name)."
        )
        parser.add_argument(
            "--ttl", type=int, help="Seconds to keep them; 0 forever (default: DEFAULT_REPLAY_TTL)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        if not path.is_file():
            raise CommandError(f"No such file: {path}")
        items = experiences_from_file(path, agent_id=options["agent"])
        if options["ttl"] is not None:
            for item in items:
                item["ttl_seconds"] = options["ttl"]
        # The API's own validation, so imported rows obey the same limits as posted ones.
        serializer = ExperienceInSerializer(data=items, many=True)
        if not serializer.is_valid():
            raise CommandError(f"Invalid experiences: {serializer.errors}")
        created = 0
        for start in range(0, len(items), CHUNK):
            chunk = serializer.validated_data[start : start + CHUNK]
            for item in chunk:
                item["experience_id"] = item.pop("id")
            try:
                created += sum(result.created for result in experience_create_many(items=chunk))
            except ServiceError as exc:
                raise CommandError(exc.message) from exc
        self.stdout.write(f"{created} experiences imported, {len(items) - created} already there.")

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.services import agent_import
from ferrum_memory.core.exceptions import ServiceError


class Command(BaseCommand):
    help = "Import an agent's export file (JSON Lines), all or nothing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent_id", help="The agent to import as.")
        parser.add_argument("file")

    def handle(self, *args: Any, agent_id: str, file: str, **options: Any) -> None:
        try:
            with open(file, "rb") as lines:
                result = agent_import(agent_id=agent_id, lines=lines)
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            f"Imported {result.imported} as {agent_id}; skipped (already there) "
            f"{result.skipped}; re-embedded {result.reembedded} memory items."
        )

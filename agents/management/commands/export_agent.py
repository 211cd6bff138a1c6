from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agents.selectors import agent_export


class Command(BaseCommand):
    help = "Write everything of one agent as JSON Lines (the format of GET /agents/{id}/export)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent_id")
        parser.add_argument("--output", "-o", help="File to write; default: standard output.")

    def handle(self, *args: Any, agent_id: str, output: str | None, **options: Any) -> None:
        if not output:
            for line in agent_export(agent_id=agent_id):
                self.stdout.write(line.decode(), ending="")
            return
        lines = 0
        with open(output, "wb") as out:
            for line in agent_export(agent_id=agent_id):
                out.write(line)
                lines += 1
        self.stderr.write(f"Wrote {lines} lines of agent {agent_id} to {output}.")

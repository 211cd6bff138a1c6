from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ferrum_memory.core.services import api_key_create, api_key_deactivate_by_name


class Command(BaseCommand):
    help = "Create an API key and print it (it is stored hashed and cannot be shown again)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="A name to tell the key apart, e.g. the client's.")
        parser.add_argument(
            "--agent",
            action="append",
            default=[],
            dest="agents",
            help="Limit the key to this agent id (repeat for several). Default: every agent.",
        )
        parser.add_argument("--read-only", action="store_true", help="Only GET requests.")
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="Deactivate the active keys with the same name first.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["rotate"]:
            api_key_deactivate_by_name(name=options["name"])
        _, raw_key = api_key_create(
            name=options["name"],
            allowed_agent_ids=options["agents"],
            read_only=options["read_only"],
        )
        self.stdout.write(raw_key)

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from experience.dream_services import dream_cycle_run, dream_run_lock
from ferrum_memory.core.exceptions import ServiceError


class Command(BaseCommand):
    help = "Run one dream cycle for an agent now and print what it sampled."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--agent", required=True, help="The agent id to dream for.")
        parser.add_argument("--seed", type=int, help="Seed of the draw (default: random).")

    def handle(self, *args: Any, **options: Any) -> None:
        # The beat's lock: a cycle made here never races one made by the scheduled run.
        with dream_run_lock() as locked:
            if not locked:
                raise CommandError("A dream run is in progress; try again in a moment.")
            try:
                cycle = dream_cycle_run(agent_id=options["agent"], seed=options["seed"])
            except ServiceError as exc:
                raise CommandError(exc.message) from None
        items = list(cycle.items.all())
        self.stdout.write(
            f"Dream cycle {cycle.pk}: agent {cycle.agent_id} #{cycle.number}, "
            f"{cycle.strategy}, alpha {cycle.alpha:g}, beta {cycle.beta:.4f}, seed {cycle.seed}, "
            f"{len(items)} draws from {cycle.buffer_size} experiences"
        )
        self.stdout.write(f"{'#':>4}  {'probability':>11}  {'IS weight':>9}  {'TD error':>9}  id")
        for item in items:
            td_error = "-" if item.td_error_before is None else f"{item.td_error_before:.4g}"
            self.stdout.write(
                f"{item.position:>4}  {item.probability:>11.5f}  {item.weight:>9.4f}  "
                f"{td_error:>9}  {item.experience_id}"
            )

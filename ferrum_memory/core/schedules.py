"""Default beat schedules: created if missing, by name, so edits made in the admin survive a
deploy (a schedule that exists is never touched)."""

from typing import Any

from django_celery_beat.models import IntervalSchedule, PeriodicTask

_defaults: dict[str, tuple[str, int]] = {}


def register_default_schedule(*, name: str, task: str, every_seconds: int) -> None:
    _defaults[name] = (task, every_seconds)


def ensure_default_schedules(**_: Any) -> int:
    """Create each registered schedule that does not exist yet; return how many were created."""
    created = 0
    for name, (task, every_seconds) in _defaults.items():
        if PeriodicTask.objects.filter(name=name).exists():
            continue
        interval, _ = IntervalSchedule.objects.get_or_create(
            every=every_seconds, period=IntervalSchedule.SECONDS
        )
        PeriodicTask.objects.create(name=name, task=task, interval=interval)
        created += 1
    return created

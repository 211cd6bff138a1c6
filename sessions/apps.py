from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class SessionsConfig(AppConfig):
    name = "sessions"
    # The default label "sessions" is django.contrib.sessions', which the admin needs.
    label = "agent_sessions"
    verbose_name = "Working memory sessions"

    def ready(self) -> None:
        from ferrum_memory.core.health import register_check, register_stats
        from ferrum_memory.core.schedules import register_default_schedule

        from .selectors import session_stats

        check_session_settings()
        register_default_schedule(
            name="sessions: consolidate idle",
            task="sessions.sweep",
            every_seconds=settings.SESSION_SWEEP_SECONDS,
        )
        register_stats("sessions")(session_stats)
        register_check("working_memory")(check_working_memory)


def check_working_memory() -> dict[str, Any]:
    from .working_memory import get_working_memory

    return get_working_memory().ping()


def check_session_settings() -> None:
    if not 0 < settings.SESSION_IDLE_FRACTION < 1:
        raise ImproperlyConfigured("SESSION_IDLE_FRACTION must be between 0 and 1.")
    if settings.DEFAULT_WORKING_MEM_TTL < 1 or settings.SESSION_SWEEP_SECONDS < 1:
        raise ImproperlyConfigured(
            "DEFAULT_WORKING_MEM_TTL and SESSION_SWEEP_SECONDS must be >= 1."
        )

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

PURGE_EVERY_SECONDS = 600


class ExperienceConfig(AppConfig):
    name = "experience"
    verbose_name = "Experience replay"

    def ready(self) -> None:
        from ferrum_memory.core.health import register_stats
        from ferrum_memory.core.schedules import register_default_schedule

        from .selectors import experience_visible

        register_default_schedule(
            name="experience: purge expired",
            task="experience.purge_expired",
            every_seconds=PURGE_EVERY_SECONDS,
        )
        check_dream_settings()
        register_default_schedule(
            name="experience: dream cycles",
            task="experience.dream_cycles",
            every_seconds=settings.DREAM_INTERVAL_SECONDS,
        )
        register_default_schedule(
            name="experience: replay snapshots",
            task="experience.replay_snapshot",
            every_seconds=settings.REPLAY_SNAPSHOT_SECONDS,
        )
        check_replay_settings()
        register_stats("experience")(
            lambda agent_ids: {"count": experience_visible(agent_ids=agent_ids).count()}
        )


def check_dream_settings() -> None:
    """Fail at start-up, in every process, rather than sample with a setting that makes no sense
    (the replay index would treat an unknown strategy as uniform)."""
    if settings.DREAM_STRATEGY not in ("prioritized", "recency", "uniform"):
        raise ImproperlyConfigured("DREAM_STRATEGY must be prioritized, recency or uniform.")
    if not 0 <= settings.DREAM_BETA0 <= 1:
        raise ImproperlyConfigured("DREAM_BETA0 must be between 0 and 1.")
    from .serializers import MAX_REPLAY_BATCH  # a learner reports at most this many TD errors

    if not 1 <= settings.DREAM_BATCH_SIZE <= MAX_REPLAY_BATCH or settings.DREAM_HALF_LIFE <= 0:
        raise ImproperlyConfigured(
            f"DREAM_BATCH_SIZE must be 1 to {MAX_REPLAY_BATCH} and DREAM_HALF_LIFE > 0."
        )
    if settings.DREAM_INTERVAL_SECONDS < 1 or settings.DREAM_LEASE_SECONDS < 1:
        raise ImproperlyConfigured("DREAM_INTERVAL_SECONDS and DREAM_LEASE_SECONDS must be >= 1.")


def check_replay_settings() -> None:
    """The REPLAY_* defaults of the replay controls, checked at start-up as the API checks an
    agent's own."""
    if settings.REPLAY_REMOVER not in ("fifo", "lowest_priority"):
        raise ImproperlyConfigured("REPLAY_REMOVER must be fifo or lowest_priority.")
    counts = ("REPLAY_MAX_SIZE", "REPLAY_MAX_TIMES_SAMPLED", "REPLAY_MIN_SIZE")
    numbers = ("REPLAY_SAMPLES_PER_INSERT", "REPLAY_SPI_TOLERANCE")
    if any(getattr(settings, name) < 0 for name in counts + numbers):
        raise ImproperlyConfigured(f"{', '.join(counts + numbers)} must be >= 0.")
    if settings.REPLAY_SNAPSHOT_SECONDS < 1:
        raise ImproperlyConfigured("REPLAY_SNAPSHOT_SECONDS must be >= 1.")

from django.apps import AppConfig

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
        register_stats("experience")(
            lambda agent_ids: {"count": experience_visible(agent_ids=agent_ids).count()}
        )

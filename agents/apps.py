from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """What spans every app for one agent: erasure, export and import."""

    name = "agents"
    verbose_name = "Agents"

from django.apps import AppConfig


class SessionsConfig(AppConfig):
    name = "sessions"
    # The default label "sessions" is django.contrib.sessions', which the admin needs.
    label = "agent_sessions"
    verbose_name = "Working memory sessions"

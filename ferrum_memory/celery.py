"""The Celery app. Configured from the CELERY_* Django settings; tasks live in each app."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferrum_memory.settings.base")

app = Celery("ferrum_memory")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

import pytest
from django_celery_beat.models import PeriodicTask

import experience.tasks  # noqa: F401 - registers the task, as the worker's autodiscovery does
from ferrum_memory.celery import app
from ferrum_memory.core.schedules import ensure_default_schedules

pytestmark = pytest.mark.django_db


def test_purge_is_scheduled_and_an_admin_edit_survives_a_deploy():
    task = PeriodicTask.objects.get(name="experience: purge expired")  # made by migrate
    assert task.task == "experience.purge_expired" and task.task in app.tasks
    task.enabled = False
    task.save()
    assert ensure_default_schedules() == 0
    assert PeriodicTask.objects.get(name="experience: purge expired").enabled is False
    task.delete()
    assert ensure_default_schedules() == 1

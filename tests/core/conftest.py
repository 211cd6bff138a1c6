from tests.experience.conftest import send_tasks_to  # noqa: F401 - a fixture, for the e2e

"""The deployment files agree with the settings: compose, .env.example and the README."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# Read by Django, the Celery CLI or the image rather than by our settings.
NOT_OURS = {"DJANGO_SETTINGS_MODULE"}


def variables_read_by_code() -> set[str]:
    names: set[str] = set()
    # The test settings' knobs are for the suite, not for people running the service.
    settings_dir = ROOT / "ferrum_memory/settings"
    for path in [
        settings_dir / "base.py",
        settings_dir / "production.py",
        ROOT / "gunicorn.conf.py",
    ]:
        text = path.read_text()
        names |= set(re.findall(r'env\.\w+\(\s*"([A-Z_]+)"', text))
        names |= set(re.findall(r'os\.environ(?:\.get|\.setdefault)\(\s*"([A-Z_]+)"', text))
    return names - {"HF_HUB_OFFLINE"}


def variables_in_env_example() -> set[str]:
    return set(re.findall(r"^([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))


def variables_in_readme() -> set[str]:
    section = (ROOT / "README.md").read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| ([A-Z_]+) \|", section, re.M))


def test_env_example_and_readme_list_exactly_the_variables_the_code_reads():
    read = variables_read_by_code()
    assert {"QDRANT_URL", "REDIS_URL", "DATABASE_URL", "DJANGO_SECRET_KEY"} <= read
    assert variables_in_env_example() == read
    assert variables_in_readme() == read


def test_compose_runs_each_process_with_known_variables():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "qdrant", "web", "worker", "beat"} <= set(services)
    assert services["qdrant"]["image"].startswith("qdrant/qdrant")

    def command(name: str) -> str:
        value = services[name]["command"]
        return value if isinstance(value, str) else " ".join(value)

    assert "gunicorn ferrum_memory.wsgi:application" in command("web")
    assert "runserver" not in command("web")
    assert "celery -A ferrum_memory worker" in command("worker")
    assert "beat" in command("beat")
    assert "django_celery_beat.schedulers:DatabaseScheduler" in command("beat")

    known = variables_read_by_code() | NOT_OURS
    for name in ("web", "worker", "beat"):
        environment = set(services[name]["environment"])
        assert {"DATABASE_URL", "REDIS_URL", "QDRANT_URL", "DJANGO_SECRET_KEY"} <= environment
        assert environment <= known, environment - known


def test_procfile_runs_the_same_processes_as_compose():
    procfile = dict(
        line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line
    )
    # Embedded, the vector index runs in processes of its own (compose has a Qdrant server).
    assert set(procfile) == {"web", "worker", "beat", "index"}
    assert procfile["web"].startswith("VECTOR_INDEX_SERVERS=2 gunicorn ferrum_memory.wsgi:")
    assert procfile["worker"].startswith("VECTOR_INDEX_SERVERS=2 celery -A ferrum_memory worker")
    assert procfile["index"] == "python manage.py memory_index_server --servers 2"
    assert "DatabaseScheduler" in procfile["beat"]

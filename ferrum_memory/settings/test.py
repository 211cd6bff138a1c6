"""Test settings: the base settings on a throwaway data folder.

The database engine follows DATABASE_URL as in production, so the same suite runs on SQLite
(embedded) and on PostgreSQL (scaled out); see scripts/test.sh.
"""

import os
import tempfile

os.environ.setdefault("FERRUM_DATA_DIR", tempfile.mkdtemp(prefix="ferrum-test-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .base import *  # noqa: F403
from .base import DATA_DIR, DATABASES, env

ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# Tests read static files straight from the apps, without collectstatic.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
# Tasks the API enqueues (counting replay draws) run in the test process, so a test sees their
# effect when the request returns. CELERY_TASK_ALWAYS_EAGER=false sends them to a broker.
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=True)
CELERY_TASK_EAGER_PROPAGATES = True

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not SQLite's in-memory default: WAL and concurrent writers need a real file.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}

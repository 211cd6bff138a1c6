import os

from django.core.wsgi import get_wsgi_application

from ferrum_memory.core.telemetry import setup_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferrum_memory.settings.base")

# Before the application loads its middleware, which tracing extends. Under gunicorn this runs
# in each worker after the fork (preload_app stays off: see gunicorn.conf.py).
setup_tracing()
application = get_wsgi_application()

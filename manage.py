#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferrum_memory.settings.base")
    from django.core.management import execute_from_command_line

    from ferrum_memory.core.telemetry import setup_tracing

    # Commands (runserver, dream, memory_reindex) are traced like the services.
    setup_tracing()
    execute_from_command_line(sys.argv)

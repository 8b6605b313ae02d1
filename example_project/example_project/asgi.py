"""ASGI entry point: ``uvicorn example_project.asgi:application`` (from example_project/)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

application = get_asgi_application()

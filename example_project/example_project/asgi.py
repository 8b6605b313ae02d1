"""ASGI entry point: ``uvicorn example_project.asgi:application`` (from example_project/).

``EMBEDDED_WORKER=1`` runs a worker inside the server's process, from its lifespan startup to
its shutdown (docs/worker.md, "The embedded worker").
"""

import os

from django.core.asgi import get_asgi_application

from django_sqltasks import embed_in_asgi

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

application = get_asgi_application()
if os.environ.get("EMBEDDED_WORKER") == "1":
    application = embed_in_asgi(application)

"""WSGI entry point: ``gunicorn example_project.wsgi`` (from example_project/), and runserver's.

``EMBEDDED_WORKER=1`` runs a worker inside the serving process too (docs/worker.md, "The
embedded worker"): ``EMBEDDED_WORKER=1 python manage.py runserver`` runs the tasks it enqueues.
"""

import os

from django.core.wsgi import get_wsgi_application

from django_sqltasks import embed_in_wsgi

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

application = get_wsgi_application()
if os.environ.get("EMBEDDED_WORKER") == "1":
    application = embed_in_wsgi(application)

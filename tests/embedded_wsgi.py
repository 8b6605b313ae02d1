"""The WSGI application of tests/settings_embedded.py: Django's, with an embedded worker."""

from django.core.wsgi import get_wsgi_application

from django_sqltasks import embed_in_wsgi

application = embed_in_wsgi(get_wsgi_application(), concurrency=2)

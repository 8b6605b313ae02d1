"""The test settings with an embedded worker in the WSGI application (runserver's)."""

from tests.settings import *  # noqa: F403

DEBUG = True  # runserver refuses to start without DEBUG or ALLOWED_HOSTS
WSGI_APPLICATION = "tests.embedded_wsgi.application"

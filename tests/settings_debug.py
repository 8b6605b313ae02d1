"""The test settings as a new project has them: DEBUG on, and Django's default logging."""

from tests.settings import *  # noqa: F403

DEBUG = True
LOGGING = {"version": 1, "disable_existing_loggers": False}

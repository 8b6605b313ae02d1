"""Settings for the django-sqltasks example project.

With no configuration it runs on SQLite (``example_project/db.sqlite3``). Set ``DATABASE_URL``
to use PostgreSQL or MySQL/MariaDB instead, for example::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/sqltasks_example
    DATABASE_URL=mysql://root@127.0.0.1:3306/sqltasks_example

This is a demo: the secret key is public and DEBUG is on. Do not deploy it.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-project-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", "testserver"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_sqltasks",
    "shop",
]
try:
    import django.tasks  # noqa: F401
except ImportError:  # Django 5.2: Django Tasks comes from the django-tasks backport
    INSTALLED_APPS.insert(0, "django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
ASGI_APPLICATION = "example_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

STATIC_URL = "static/"

if os.environ.get("DATABASE_URL"):
    try:
        import dj_database_url
    except ImportError as e:
        raise ImportError(
            "DATABASE_URL is set, so the example project needs dj-database-url: "
            "pip install dj-database-url"
        ) from e
    DATABASES = {"default": dj_database_url.config(conn_max_age=0)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "db.sqlite3",
            "OPTIONS": {
                # WAL lets readers (the web process, the admin) work while a worker writes.
                "init_command": "PRAGMA journal_mode=WAL;",
                # Seconds a connection waits for SQLite's single write lock before failing.
                "timeout": 20,
            },
        }
    }

TASKS = {
    "default": {
        "BACKEND": "django_sqltasks.backend.SQLTaskBackend",
        # Tasks may only be enqueued on these queues; shop.tasks uses both.
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            # The defaults, written out so they are easy to find and change.
            "LEASE_TIMEOUT": 30,
            "HEARTBEAT_INTERVAL": 5,
            "POLL_INTERVAL": 1,
            "MAX_PAYLOAD_BYTES": 1024 * 1024,
        },
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        # The worker's own events: start, stop, failures, rescues, database retries.
        "django_sqltasks": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

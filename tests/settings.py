"""Settings for the test suite; ``DATABASE_URL`` picks the database (SQLite by default)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_sqltasks",
    "tests",
]
if os.environ.get("SQLTASKS_TEST_WITHOUT_APP"):  # a deploy that forgot the app
    INSTALLED_APPS.remove("django_sqltasks")
try:  # Django 5.2 runs Django Tasks from the backport, which is an app of its own
    import django.tasks
except ImportError:
    INSTALLED_APPS.insert(0, "django_tasks")

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
# The admin tests log a user in: Django's default hasher spends about 0.5 s of CPU on each
# password it sets, by design, which over the suite's superusers was the largest single cost of
# make test. The tests check permissions, not password hashing.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

SQLITE_PATH = Path(os.environ.get("SQLTASKS_SQLITE_PATH", BASE_DIR / "tests.sqlite3"))
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{SQLITE_PATH}", conn_max_age=0
    )
}
DATABASES["default"].setdefault("TEST", {})
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not memory, so worker subprocesses see the test database.
    DATABASES["default"]["TEST"]["NAME"] = str(SQLITE_PATH.with_name("test_" + SQLITE_PATH.name))
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "timeout": 20,
    }
# Worker subprocesses are told the test database's name, which pytest-django made.
if os.environ.get("SQLTASKS_TEST_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["SQLTASKS_TEST_DB_NAME"]
# Worker subprocesses and enqueuers of the failover tests are given two servers, a primary and
# its standby, in libpq's host list (docs/operations.md, "Failover"): each connection goes to the
# one that takes writes.
if os.environ.get("SQLTASKS_TEST_FAILOVER_PORTS"):
    _ports = os.environ["SQLTASKS_TEST_FAILOVER_PORTS"].split(",")
    DATABASES["default"]["HOST"] = ",".join("127.0.0.1" for _ in _ports)
    DATABASES["default"]["PORT"] = ",".join(_ports)
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"target_session_attrs": "read-write", "connect_timeout": 2}
    )
# Worker subprocesses of the pool tests use Django's connection pool (psycopg_pool), with these
# pool options (JSON).
if os.environ.get("SQLTASKS_TEST_POOL"):
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = json.loads(
        os.environ["SQLTASKS_TEST_POOL"]
    )
# Worker subprocesses of the pooler tests reach the database through the PgBouncer on this port
# (transaction mode); the alias "direct" reaches the same database without it, for
# OPTIONS["LISTEN_DATABASE"] (SQLTASKS_TEST_LISTEN_DATABASE) to name.
if os.environ.get("SQLTASKS_TEST_POOLER_PORT"):
    DATABASES["direct"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
    DATABASES["default"] = {
        **DATABASES["default"],
        "HOST": "127.0.0.1",
        "PORT": int(os.environ["SQLTASKS_TEST_POOLER_PORT"]),
    }

TASKS = {
    "default": {
        "BACKEND": "django_sqltasks.backend.SQLTaskBackend",
        "QUEUES": ["default", "other", "slow"],
        "OPTIONS": {
            "LEASE_TIMEOUT": float(os.environ.get("SQLTASKS_LEASE_TIMEOUT", "30")),
            "MAX_RESCUES": int(os.environ.get("SQLTASKS_MAX_RESCUES", "5")),
            "HEARTBEAT_INTERVAL": float(os.environ.get("SQLTASKS_HEARTBEAT_INTERVAL", "5")),
            "POLL_INTERVAL": float(os.environ.get("SQLTASKS_POLL_INTERVAL", "0.05")),
            # Worker subprocesses of the limit tests limit a queue.
            "QUEUE_LIMITS": json.loads(os.environ.get("SQLTASKS_QUEUE_LIMITS", "{}")),
            # Worker subprocesses of the periodic tests run a one-second schedule.
            "PERIODIC": (
                {"tick": {"task": "tests.tasks.tick", "every": 1}}
                if os.environ.get("SQLTASKS_PERIODIC_EVERY")
                else {}
            ),
        },
    },
    "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
}
if os.environ.get("SQLTASKS_NOTIFY") == "0":  # workers that poll
    TASKS["default"]["OPTIONS"]["NOTIFY"] = False
# Worker subprocesses of the wake ring's tests listen through the alias "listen", at this port
# (a server that never answers).
if os.environ.get("SQLTASKS_TEST_LISTEN_PORT"):
    DATABASES["listen"] = {
        **DATABASES["default"],
        "PORT": int(os.environ["SQLTASKS_TEST_LISTEN_PORT"]),
        "TEST": {"MIRROR": "default"},
    }
    TASKS["default"]["OPTIONS"]["LISTEN_DATABASE"] = "listen"
if os.environ.get("SQLTASKS_TEST_LISTEN_DATABASE"):
    TASKS["default"]["OPTIONS"]["LISTEN_DATABASE"] = os.environ["SQLTASKS_TEST_LISTEN_DATABASE"]
try:
    import django.tasks  # noqa: F401
except ImportError:
    TASKS["immediate"]["BACKEND"] = "django_tasks.backends.immediate.ImmediateBackend"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_sqltasks": {"handlers": ["console"], "level": "INFO"}},
}

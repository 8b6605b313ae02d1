"""Django settings of the ``scale`` profile: the admin and this package on the database named by
``SCALE_DATABASE_URL`` (SQLite file by default)."""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = "benchmarks-only"
DEBUG = False  # DEBUG would keep every query's text: memory, and time, that users do not pay
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_sqltasks",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "benchmarks.scale.urls"
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # not what is measured
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("SCALE_DATABASE_URL", "sqlite:///scale.sqlite3"), conn_max_age=600
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "timeout": 20,
    }
TASKS = {
    "default": {
        "BACKEND": "django_sqltasks.backend.SQLTaskBackend",
        "QUEUES": ["default", "emails", "idle", "reports"],
        "OPTIONS": {"TASK_MODULES": ["benchmarks.scale"]},
    }
}

"""The Celery application, configured from Django settings as Celery's Django guide does."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.projects.settings")

app = Celery("bench", include=["benchmarks.projects.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")

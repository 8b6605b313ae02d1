"""A URLconf whose import declares a task (as a project's does, through its views): the task
builds its backend then (tests/core/test_tasks_check.py)."""

from __future__ import annotations

from django.urls import URLPattern

from django_sqltasks.compat import task


@task
def declared_at_import() -> None:
    """A task of a view module."""


urlpatterns: list[URLPattern] = []

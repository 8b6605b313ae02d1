"""Cancelling the tasks about a model row when the row is deleted (an operator action)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models.signals import post_delete

from ..core.backends import sql_backends
from ..core.subject import subject_of
from ..models import TaskRecord
from . import control


def cancel_tasks_on_delete(*model_classes: type[models.Model], reason: str = "") -> None:
    """Cancel the READY tasks about a row of these models when the row is deleted.

    The tasks are cancelled in the delete's transaction (when they live in the same database),
    as ``backend.cancel()`` cancels them: FAILED with a ``TaskCancelled`` error. A RUNNING task
    is left to finish. Call it once, from an ``AppConfig.ready()``.
    """
    for model in model_classes:
        if not (isinstance(model, type) and issubclass(model, models.Model)):
            raise TypeError(f"cancel_tasks_on_delete() takes model classes, not {model!r}.")
        post_delete.connect(
            _cancel_on_delete(reason),
            sender=model,
            weak=False,
            dispatch_uid=f"django_sqltasks.cancel_tasks_on_delete:{model._meta.label_lower}",
        )


def _cancel_on_delete(reason: str) -> Any:
    def receiver(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
        cancel_ready_tasks(instance, reason=reason)

    return receiver


def cancel_ready_tasks(obj: Any, *, reason: str = "") -> int:
    """Cancel every READY task about ``obj`` in every django_sqltasks backend; return how many."""
    subject = subject_of(obj)
    backends = list(sql_backends().values())
    why = reason or f"Cancelled: its subject {subject} was deleted."
    cancelled = 0
    for database, aliases in _databases(backends).items():
        ready = (
            TaskRecord.objects.using(database)
            .for_subject(subject)
            .ready()
            .filter(backend_name__in=aliases)
            .only("pk")
        )
        cancelled += len(control.cancel(list(ready), using=database, reason=why))
    return cancelled


def _databases(backends: Iterable[Any]) -> dict[str, list[str]]:
    by_database: dict[str, list[str]] = {}
    for backend in backends:
        by_database.setdefault(backend.database, []).append(backend.alias)
    return by_database

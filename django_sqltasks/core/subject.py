"""Tasks about a model row: the subject a task is enqueued for, stored as the row's model label
and primary key, and the opt-in cancelling of a deleted row's waiting tasks.

Django Tasks passes every ``enqueue()`` argument to the task, so the subject travels on the task
object instead: ``send_receipt.using(subject=order).enqueue(order.pk)`` (or
``with_subject(task, order)`` for a plain Django Task).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from django.db import models

from ..compat import InvalidTask, Task
from .serialization import text_problem

MAX_TYPE_LENGTH = 100  # TaskRecord.subject_type: "app_label.modelname"
MAX_ID_LENGTH = 255  # TaskRecord.subject_id: the primary key as text


@dataclasses.dataclass(frozen=True, slots=True)
class Subject:
    """A model row a task is about: its concrete model's label and its primary key as text."""

    type: str
    id: str

    def __str__(self) -> str:
        return f"{self.type}:{self.id}"


def subject_of(obj: Any) -> Subject:
    """The ``Subject`` of a saved model instance; raise ``InvalidTask`` naming the rule."""
    if isinstance(obj, Subject):
        return obj
    if not isinstance(obj, models.Model):
        raise InvalidTask(
            f"subject must be a saved model instance, not {obj!r} (a {type(obj).__name__})."
        )
    if obj.pk is None or obj._state.adding:
        raise InvalidTask(
            f"subject {type(obj).__name__} instance has no primary key (it is not saved yet, "
            "or was deleted): a task row stores its subject's primary key."
        )
    # The concrete model, so that a row's tasks are the same through any proxy of it.
    concrete = obj._meta.concrete_model or type(obj)
    label = concrete._meta.label_lower
    key = str(obj.pk)
    if len(key) > MAX_ID_LENGTH:
        raise InvalidTask(
            f"subject {label} primary key is {len(key)} characters as text, over the "
            f"{MAX_ID_LENGTH} the task table stores."
        )
    problem = text_problem(key)
    if problem is not None:
        raise InvalidTask(f"subject {label} primary key {key!r} {problem}.")
    if len(label) > MAX_TYPE_LENGTH:  # pragma: no cover - app labels and model names are short
        raise InvalidTask(f"subject model label {label!r} is over {MAX_TYPE_LENGTH} characters.")
    return Subject(type=label, id=key)


def with_subject(task: Task, obj: Any) -> Task:
    """Return a copy of ``task`` whose enqueues are about ``obj`` (None: about nothing)."""
    from ..task import SQLTask

    subject = None if obj is None else subject_of(obj)
    clone = object.__new__(type(task) if isinstance(task, SQLTask) else SQLTask)
    for f in dataclasses.fields(task):
        object.__setattr__(clone, f.name, getattr(task, f.name))
    if not isinstance(task, SQLTask):  # a Django 6.0 Task: our options take their defaults
        for f in dataclasses.fields(SQLTask):
            if not hasattr(task, f.name):
                object.__setattr__(clone, f.name, f.default)
    object.__setattr__(clone, "subject", subject)
    return clone


def subject_of_task(task: Task) -> Subject | None:
    """The subject a task's enqueues are about, if any."""
    return getattr(task, "subject", None)


def cancel_tasks_on_delete(*model_classes: type[models.Model], reason: str = "") -> None:
    """Cancel the READY tasks about a row of these models when the row is deleted.

    The tasks are cancelled in the delete's transaction (when they live in the same database),
    as ``backend.cancel()`` cancels them: FAILED with a ``TaskCancelled`` error. A RUNNING task
    is left to finish. Call it once, from an ``AppConfig.ready()``.
    """
    from django.db.models.signals import post_delete

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
    from ..backend import SQLTaskBackend
    from ..compat import task_backends
    from ..models import TaskRecord
    from ..store import control

    subject = subject_of(obj)
    backends = [b for b in task_backends.all() if isinstance(b, SQLTaskBackend)]
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

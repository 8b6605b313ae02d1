"""Tasks about a model row: the subject a task is enqueued for, stored as the row's model label
and primary key, and the opt-in cancelling of a deleted row's waiting tasks.

Django Tasks passes every ``enqueue()`` argument to the task, so the subject travels on the task
object instead: ``send_receipt.using(subject=order).enqueue(order.pk)`` (or
``with_subject(task, order)`` for a plain Django Task).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import models

from ..compat import InvalidTask, Task
from .columns import MAX_SUBJECT_ID_LENGTH, MAX_SUBJECT_TYPE_LENGTH
from .serialization import text_problem


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
    if len(key) > MAX_SUBJECT_ID_LENGTH:
        raise InvalidTask(
            f"subject {label} primary key is {len(key)} characters as text, over the "
            f"{MAX_SUBJECT_ID_LENGTH} the task table stores."
        )
    problem = text_problem(key)
    if problem is not None:
        raise InvalidTask(f"subject {label} primary key {key!r} {problem}.")
    if (
        len(label) > MAX_SUBJECT_TYPE_LENGTH
    ):  # pragma: no cover - app labels and model names are short
        raise InvalidTask(
            f"subject model label {label!r} is over {MAX_SUBJECT_TYPE_LENGTH} characters."
        )
    return Subject(type=label, id=key)


def subject_of_task(task: Task) -> Subject | None:
    """The subject a task's enqueues are about, if any."""
    return getattr(task, "subject", None)

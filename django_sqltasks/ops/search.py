"""Finding tasks from one search term: by id, by a value of their arguments, by subject, by the
class of the error they failed with, or by tag.

On PostgreSQL every branch is an index lookup (the primary key, ``sqltasks_subject_idx`` and
the GIN indexes of ``indexes.py``), so a search costs the same at 50 million rows as at 5,000.
MariaDB and SQLite have no index that finds a value inside JSON: there the id and the subject
are still looked up by index, and the rest is a substring match over the newest
``SEARCH_WINDOW`` tasks only (docs/admin.md says what it cannot find).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import connections
from django.db.models import Q, QuerySet

from ..compat import TaskResultStatus
from ..core.tags import is_tag
from ..indexes import QUEUE_KEY, TASK_KEY
from ..models import TaskRecord, TaskRecordQuerySet
from ..sql import dialect_for
from ..sql.lists import estimated_rows
from ..sql.search import ArgumentValues, ErrorClassName, LastErrorClass
from .declared import declared_task_paths

# The alias of a task's argument values, which the search and by_column filter on, on
# PostgreSQL (the search index's expression): a list holding it is narrowed through that index.
SEARCH_ALIAS = "argument_values"
SEARCH_WINDOW = 10_000  # newest tasks a search reads where no index finds JSON values
# Estimated rows of a task or a queue below which its tasks are found through the search index
# (by_column): past it, a page of them is found sooner among the newest ids than by reading
# the index entry of every one.
FEW_BELOW = 10_000
TasksT = TypeVar("TasksT", bound=QuerySet[Any])
# "app_label.modelname:primary key", as a task's subject is shown.
SUBJECT_TERM = re.compile(r"(?P<type>\w+\.\w+):(?P<id>.+)", re.DOTALL)
CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
INTEGER = re.compile(r"-?\d{1,18}")


@dataclass(frozen=True)
class Found:
    """What a search selects, and whether it read only the newest ``SEARCH_WINDOW`` tasks."""

    tasks: TaskRecordQuerySet
    windowed: bool = False


def search(tasks: TaskRecordQuerySet, term: str) -> Found:
    """Narrow ``tasks`` to those ``term`` names: their id, their declared task's path, a value
    of their arguments, their subject (``app_label.model:pk``), their error's class, or a tag."""
    term = term.strip()
    if not term:
        return Found(tasks)
    if unstorable(term):  # no column holds it: nothing matches, and the driver would refuse it
        return Found(tasks.none())
    try:
        return Found(tasks.filter(pk=uuid.UUID(term)))
    except ValueError:
        pass
    if term in declared_task_paths():  # as the task filter
        return Found(by_column(tasks, "task_path", term))
    subject = SUBJECT_TERM.fullmatch(term)
    if not dialect_for(connections[tasks.db]).indexes_json_values:
        if subject is not None:
            return Found(tasks.filter(subject_query(subject)))
        return Found(tasks.filter(pk__gte=window_start(tasks.db)).filter(text_query(term)), True)
    # The cheapest test first: where the rows an index found are checked again (a window of
    # ids, a bitmap with conditions no index holds), PostgreSQL tests the branches in this
    # order and stops at the first that holds, and computing a row's argument values is the
    # dearest (16,580 FAILED tasks of a day by error class: 97 ms with it first, 34 ms last).
    query = Q()
    if subject is not None:
        query |= subject_query(subject)
    if CLASS_PATH.fullmatch(term):
        query |= error_class_query(term)
    if is_tag(term):
        query |= Q(tags__contains=[term])
    query |= Q(argument_values__contains=[term])
    if INTEGER.fullmatch(term):
        query |= Q(argument_values__contains=[int(term)])
    return Found(
        tasks.alias(
            **{SEARCH_ALIAS: ArgumentValues()},
            error_class_name=ErrorClassName(),
            last_error_class=LastErrorClass(),
        ).filter(query)
    )


def by_column(tasks: TasksT, column: str, value: str) -> TasksT:
    """The tasks of ``tasks`` whose ``column`` (``task_path`` or ``queue_name``) is ``value``.

    Where many are (the planner's estimate: ``FEW_BELOW`` or more), the list reads them newest
    first along the primary key, and a page is found among the newest ids. Where few or none
    are (a job that runs once a day, a queue whose tasks never fail), that read would go
    through every partition: on PostgreSQL they are found through the search index's entry for
    the task and queue (``indexes.ARGUMENT_VALUES_SQL``), whatever the table's size. MariaDB
    and SQLite read an index of the column and id (``indexes.FilterIndex``) either way.
    """
    matching = tasks.filter(**{column: value})
    if not dialect_for(connections[tasks.db]).indexes_json_values:
        return matching  # read through (column, id) (indexes.FilterIndex)
    estimate = estimated_rows(matching)
    if estimate is not None and estimate >= FEW_BELOW:
        return matching
    key = {"task_path": TASK_KEY, "queue_name": QUEUE_KEY}[column]
    return matching.alias(**{SEARCH_ALIAS: ArgumentValues()}).filter(
        Q(argument_values__contains=[{key: value}])
    )


def error_class_query(term: str) -> Q:
    """FAILED tasks whose last error is of class ``term``: a dotted path exactly, a bare name
    in any module (through the index of the class's name, sqltasks_error_class_idx)."""
    name = Q(error_class_name=term.rpartition(".")[2])  # the index's expression
    if "." not in term:
        return Q(status=TaskResultStatus.FAILED) & name
    # The exact path first: it implies the name, and reads no regular expression.
    return Q(status=TaskResultStatus.FAILED) & Q(last_error_class=term) & name


def subject_query(match: re.Match[str]) -> Q:
    return Q(subject_type=match["type"].lower(), subject_id=match["id"])


def text_query(term: str) -> Q:
    """A substring of the JSON of a task's arguments, tags, or failed task's errors."""
    query = Q(args__icontains=term) | Q(kwargs__icontains=term)
    query |= Q(status=TaskResultStatus.FAILED, errors__icontains=term)
    if is_tag(term):
        query |= Q(tags__icontains=f'"{term}"')
    return query


def window_start(using: str) -> Any:
    """The id of the ``SEARCH_WINDOW``-th newest task (a read of the primary key's end)."""
    newest = TaskRecord.objects.using(using).order_by("-id").values_list("id", flat=True)
    cut = list(newest[SEARCH_WINDOW - 1 : SEARCH_WINDOW])
    return cut[0] if cut else uuid.UUID(int=0)


def unstorable(text: str) -> bool:
    """Whether ``text`` holds a NUL or a lone surrogate, which no stored text can."""
    return "\x00" in text or any("\ud800" <= c <= "\udfff" for c in text)

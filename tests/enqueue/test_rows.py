"""Input checked where it enters the backend: each bad call is refused by enqueue, aenqueue and
enqueue_many alike, with an error naming the field and the rule, and leaves no row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from django_sqltasks.compat import (
    InvalidTask,
    Task,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task,
    task_backends,
)
from django_sqltasks.core import binding
from django_sqltasks.core.serialization import normalized
from django_sqltasks.enqueue import rows
from django_sqltasks.exceptions import InvalidTaskArguments, PayloadTooLarge
from django_sqltasks.models import TaskRecord
from django_sqltasks.sql.packet import max_allowed_packet
from django_sqltasks.task import SQLTaskResult
from tests import tasks, tasks_hardening
from tests.conftest import set_backend_options

pytestmark = pytest.mark.django_db
UTC = timezone.utc

Enqueue = Callable[[Task, Any, Any], Any]


def enqueue(task: Task, args: Any, kwargs: Any) -> TaskResult:
    return task_backends["default"].enqueue(task, args, kwargs)


def aenqueue(task: Task, args: Any, kwargs: Any) -> TaskResult:
    result: TaskResult = async_to_sync(task_backends["default"].aenqueue)(task, args, kwargs)
    return result


def enqueue_many(task: Task, args: Any, kwargs: Any) -> list[TaskResult]:
    # The bad call second: nothing of the batch may be written.
    return task_backends["default"].enqueue_many(task, [(("ok",), {}), (args, kwargs)])


ENTRIES = [
    pytest.param(enqueue, id="enqueue"),
    pytest.param(aenqueue, id="aenqueue"),
    pytest.param(enqueue_many, id="enqueue_many"),
]

BAD_CALLS: list[tuple[str, Any, Any, str]] = [
    ("NUL in a kwarg name", [], {"a\x00b": 1}, r"keyword argument name 'a\x00b' contains a NUL"),
    ("surrogate kwarg name", [], {"\ud800": 1}, "keyword argument name '\\ud800' contains a lone"),
    ("int kwarg name", [], {1: "a"}, "name 1 is of type int; keyword argument names must be"),
    ("None kwarg name", [], {None: "a"}, "name None is of type NoneType"),
    ("args a string", "abc", {}, "args must be a list or tuple, not str"),
    ("args a dict", {"a": 1}, {}, "args must be a list or tuple, not dict"),
    ("kwargs a list", [], [("a", 1)], "kwargs must be a dict of name -> value, not list"),
]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    ("args", "kwargs", "message"), [pytest.param(a, k, m, id=n) for n, a, k, m in BAD_CALLS]
)
def test_bad_arguments_are_refused_at_every_entry(
    entry: Enqueue, args: Any, kwargs: Any, message: str
) -> None:
    with pytest.raises(InvalidTaskArguments) as info:
        entry(tasks.echo, args, kwargs)
    assert message in str(info.value)
    if entry is enqueue_many:
        assert str(info.value).startswith("calls[1]: ")
    assert not TaskRecord.objects.exists()


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    "run_after",
    [
        pytest.param(datetime(9998, 1, 1, tzinfo=UTC), id="the-suspect-mark"),
        pytest.param(datetime(9999, 1, 1, tzinfo=UTC), id="the-parked-mark"),
        # Before 9998 where it was written, the mark's instant in UTC.
        pytest.param(
            datetime(9997, 12, 31, 20, tzinfo=timezone(-timedelta(hours=5))), id="west-of-utc"
        ),
    ],
)
def test_a_run_after_on_the_workers_marks_is_refused(entry: Enqueue, run_after: datetime) -> None:
    """A task due on the suspects' mark ran at once, as a suspect: the dates from 9998-01-01
    on are the workers' marks."""
    with pytest.raises(InvalidTask) as info:
        entry(tasks.echo.using(run_after=run_after), ["a"], {})
    assert "run_after must be before 9998-01-01 00:00 UTC" in str(info.value)
    assert not TaskRecord.objects.exists()
    latest = datetime(9997, 12, 31, 23, 59, tzinfo=UTC)
    assert entry(tasks.echo.using(run_after=latest), ["a"], {})


@pytest.mark.parametrize(
    ("priority", "shown"),
    [(True, "True (a bool)"), (False, "False (a bool)"), (1.0, "1.0 (a float)"), ("1", "'1'")],
)
def test_a_priority_must_be_an_int(priority: Any, shown: str) -> None:
    """True would be stored as 1 (SQLite, MariaDB) or refused by PostgreSQL's smallint."""
    with pytest.raises(InvalidTask) as info:
        tasks.noop.using(priority=priority)
    assert "priority must be a whole number between -100 and 100" in str(info.value)
    assert f"Got {shown}" in str(info.value)
    assert tasks.noop.using(priority=-100).priority == -100


@pytest.mark.parametrize(
    ("queue_name", "message"),
    [
        pytest.param("a\x00b", "contains a NUL character", id="NUL"),
        pytest.param("q\udfff", "contains a lone surrogate", id="surrogate"),
        pytest.param("", "queue_name must be a non-empty string", id="empty"),
        pytest.param(7, "queue_name must be a non-empty string, not 7", id="int"),
    ],
)
def test_queue_names_are_checked_when_queues_is_empty(
    settings: Any, queue_name: Any, message: str
) -> None:
    settings.TASKS = {**settings.TASKS, "default": {**settings.TASKS["default"], "QUEUES": []}}
    with pytest.raises(InvalidTask, match=message):
        tasks.noop.using(queue_name=queue_name)
    with pytest.raises(InvalidTask, match=message):
        task(queue_name=queue_name)(tasks_hardening.stand_in)
    tasks.noop.using(queue_name="any-name").enqueue()  # QUEUES empty: any storable name
    assert TaskRecord.objects.get().queue_name == "any-name"


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("nul", r"returned the key 'a\x00b', which contains a NUL character"),
        ("surrogate", "returned the key '\\ud800', which contains a lone surrogate"),
        ("int", "must return a non-empty str, not 7"),
    ],
)
def test_a_dedupe_key_must_be_storable_text(entry: Enqueue, kind: str, message: str) -> None:
    with pytest.raises(InvalidTask) as info:
        entry(tasks_hardening.hostile_key, [kind], {})
    assert "dedupe callable of tests.tasks_hardening.hostile_key" in str(info.value)
    assert message in str(info.value)
    assert not TaskRecord.objects.exists()


# MySQL and MariaDB drop the connection on a statement over max_allowed_packet -----------------


mysql_only = pytest.mark.skipif(
    connection.vendor != "mysql", reason="only MySQL and MariaDB limit a statement's size"
)


@pytest.mark.django_db(transaction=True)
@mysql_only
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_payload_over_max_allowed_packet_is_refused_and_the_connection_lives(
    settings: Any, entry: Enqueue
) -> None:
    set_backend_options(settings, MAX_PAYLOAD_BYTES=None)
    packet = max_allowed_packet(connection)
    assert packet is not None
    with pytest.raises(PayloadTooLarge) as info:
        entry(tasks.echo, ["x" * (packet + 1024)], {})
    assert f"exceeds the server's max_allowed_packet of {packet} bytes" in str(info.value)
    assert not TaskRecord.objects.exists()
    # Not a raw error 2006: the connection still works.
    entry(tasks.echo, ["small"], {})
    assert TaskRecord.objects.filter(args=["small"]).count() == 1


@mysql_only
def test_escaping_counts_towards_the_packet(settings: Any) -> None:
    """A JSON string of quotes doubles in the statement, as the driver escapes each one."""
    set_backend_options(settings, MAX_PAYLOAD_BYTES=None)
    packet = max_allowed_packet(connection)
    assert packet is not None
    with pytest.raises(PayloadTooLarge, match="max_allowed_packet"):
        tasks.echo.enqueue('"' * (packet // 3))
    assert not TaskRecord.objects.exists()


@mysql_only
def test_a_batch_larger_than_the_packet_is_written_in_several_statements(settings: Any) -> None:
    set_backend_options(settings, MAX_PAYLOAD_BYTES=None)
    packet = max_allowed_packet(connection)
    assert packet is not None
    size = packet // 4
    results = task_backends["default"].enqueue_many(tasks.echo, [(["x" * size], {})] * 10)
    assert TaskRecord.objects.count() == 10
    assert {len(r.args[0]) for r in results} == {size}


def test_the_ready_result_is_the_one_sqltaskresult_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The READY result built field by field equals the one SQLTaskResult() builds (the way
    taken if the fields ever change), on either source of TaskResult."""
    assert tuple(f.name for f in fields(SQLTaskResult)) == rows.READY_RESULT_FIELDS
    backend = task_backends["default"]
    _, direct = backend.new_row(tasks.echo, (1, ("a", b"b")), {"k": {"n": None}})
    monkeypatch.setattr(rows, "_DIRECT_RESULT", False)
    _, built = backend.new_row(tasks.echo, (1, ("a", b"b")), {"k": {"n": None}})
    for name in rows.READY_RESULT_FIELDS:
        if name not in ("id", "enqueued_at"):
            assert getattr(direct, name) == getattr(built, name), name
    assert direct.args == [1, ["a", "b"]] and direct.kwargs == {"k": {"n": None}}
    assert direct.status == TaskResultStatus.READY and direct.metadata == {}
    with pytest.raises(ValueError, match="not finished"):
        direct.return_value  # noqa: B018


class _Text(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        (),
        [1, 2.5, True, None, "x"],
        ((1, (2, [3])), {"a": (4,)}),
        [b"utf-8 bytes", bytearray(b"ab")],
        {"nested": {"deeper": [(), {}]}},
        MappingProxyType({"read": ("only",)}),
        [_Text("a str subclass"), {_Text("key"): 1}],
    ],
)
def test_arguments_are_normalized_as_django_normalizes_them(value: Any) -> None:
    assert normalized(value) == normalize_json(value)
    assert type(normalized(value)) is type(normalize_json(value))


def test_a_call_shape_that_fits_is_remembered_one_that_does_not_never_is() -> None:
    """Whether a call binds depends only on its number of arguments and keyword names: a shape
    that fit is not bound again, and a refused one is refused every time, naming the task."""
    backend = task_backends["default"]
    binding._fitting.clear()
    backend.new_row(tasks.add, (1, 2), {})
    backend._rows.call(tasks.add, (1, 2), {})
    assert (tasks.add.func, False, 2, frozenset()) in binding._fitting
    for _ in range(2):
        with pytest.raises(InvalidTaskArguments, match=r"tests\.tasks\.add\(a, b\) cannot be"):
            backend._rows.call(tasks.add, (1,), {"c": 2})
    assert len(binding._fitting) == 1
    backend._rows.call(tasks.add, (1,), {"b": 2})  # another shape: bound, then remembered
    assert len(binding._fitting) == 2

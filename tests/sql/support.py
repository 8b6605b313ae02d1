"""What the SQL tests share: the worker they claim for, new task rows, and a claim."""

from __future__ import annotations

import uuid

from django.db import connection
from django.utils import timezone

from django_sqltasks.sql import NewTask
from django_sqltasks.sql.dialect import Dialect
from django_sqltasks.sql.marks import ClaimMarks

WORKER = "dialect-worker"


def new_task(dedupe_key: str | None = None, **fields: object) -> NewTask:
    now = timezone.now()
    values: dict[str, object] = {
        "id": uuid.uuid4(),
        "task_path": "tests.tasks.add",
        "backend_name": "default",
        "queue_name": "default",
        "priority": 0,
        "args": [1, 2],
        "kwargs": {},
        "enqueued_at": now,
        "run_after": None,
        "dedupe_key": dedupe_key,
    }
    values.update(fields)
    return NewTask(**values)


def claim_batch(
    dialect: Dialect,
    limit: int = 10,
    queues: list[str] | None = None,
    marks: ClaimMarks | None = None,
) -> list:
    with connection.cursor() as cursor:
        return dialect.claim(
            cursor,
            backend_name="default",
            queue_names=queues,
            worker_id=WORKER,
            limit=limit,
            marks=marks,
        )

"""Walking a large set of tasks in batches: what an operator's action on every task matching a
filter does, so that no statement locks or rewrites millions of rows at once."""

from __future__ import annotations

from collections.abc import Iterator

from ..models import TaskRecordQuerySet

BATCH_SIZE = 500  # tasks per batch: each batch is its own short transaction


def in_batches(tasks: TaskRecordQuerySet, size: int = BATCH_SIZE) -> Iterator[TaskRecordQuerySet]:
    """Yield ``tasks`` as querysets of at most ``size`` rows, newest first, each read by a
    range of the primary key below the last (keyset), so a batch never skips over the rows
    before it; a row that stops matching while it waits is left out of its batch."""
    last = None
    while True:
        rest = tasks.order_by("-pk") if last is None else tasks.filter(pk__lt=last).order_by("-pk")
        ids = list(rest.values_list("pk", flat=True)[:size])
        if not ids:
            return
        yield tasks.filter(pk__in=ids)
        last = ids[-1]

"""The limited claim: tasks under a concurrency or rate limit, taken while their limits allow.

The main claim never takes a task with a limit key, nor one in a limited queue. This claim
takes them in one transaction per round: it locks the ``TaskLimit`` rows of the limits it
fills (``SKIP LOCKED``: a limit another worker is filling is left to it this round), counts
the tasks RUNNING under each, reads each rate limit's recent starts, claims what is left
room for, and records the starts. Two workers can thus never both take a limit's last slot,
and a task rescued from a dead worker is no longer RUNNING, so its slot is free again.

A queue's limits may be overridden at run time (``QueueLimitOverride``): each round reads
the overrides of the queues it fills, in its transaction, and each scan looks for overrides of
queues the settings do not limit, which are limited from then on (and left to the main claim
again once their override is gone).

Everything here runs on the worker's database thread.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.backends.utils import CursorWrapper
from django.db.models import Q

from ..core.limits import (
    Limit,
    queue_key,
    record_starts,
)
from ..models import TaskLimit, TaskRecord
from ..sql import ClaimedRow, Dialect, Scope, SuspectRow
from ..sql.marks import ClaimMarks
from .fair import FairTasks, claim_fair, write_transaction
from .gates import Gate
from .limit_keys import LimitKeys

logger = logging.getLogger("django_sqltasks.worker")

DISCOVER_EVERY = 0.5  # seconds between two scans for the limit keys of READY tasks
FORGET_EVERY = 600.0  # seconds between two deletions of stale limit rows by one worker
GROUPS_A_ROUND = 50  # limit keys tried by one claim round; the next round starts after them
FRESH_A_ROUND = GROUPS_A_ROUND // 2  # of a round's groups, at most this many are new keys
MARKS_KEPT = 1_000  # groups whose claim marks a worker keeps (each a few hundred bytes)


class LimitedClaim:
    """Claims the tasks of the limit keys of READY tasks (``LimitKeys``) within their limits."""

    def __init__(
        self,
        *,
        backend_name: str,
        database: str,
        worker_id: str,
        queue_names: list[str] | None,
        queue_limits: dict[str, Limit],
    ) -> None:
        # Set once here; everything below is owned by the database thread.
        self.backend_name = backend_name
        self.database = database
        self.worker_id = worker_id
        self.queue_names = queue_names
        self.keys = LimitKeys(
            backend_name=backend_name,
            database=database,
            worker_id=worker_id,
            queue_names=queue_names,
            queue_limits=queue_limits,
        )
        self._next_scan = 0.0  # monotonic time of the next scan
        self._next_forget = time.monotonic() + FORGET_EVERY
        self._offset = 0  # where the next round starts among the groups
        self._fair = FairTasks(backend_name)  # which keys are taken round robin (fair.py)
        # Where each limit key's claim starts reading (sql/marks.py), most recently used last.
        self._marks: OrderedDict[tuple[Any, ...], ClaimMarks] = OrderedDict()

    def _marks_of(self, key: tuple[Any, ...]) -> ClaimMarks:
        """The marks of one group's claims, kept for the MARKS_KEPT groups claimed last."""
        marks = self._marks.get(key)
        if marks is None:
            marks = self._marks[key] = ClaimMarks()
            if len(self._marks) > MARKS_KEPT:
                self._marks.popitem(last=False)
        else:
            self._marks.move_to_end(key)
        return marks

    @property
    def active(self) -> bool:
        """Whether a round may find anything (queue limits, or limit keys seen)."""
        return self.keys.active

    @property
    def queue_limits(self) -> dict[str, Limit]:
        """Each limited queue's limits in force (the settings', or an override's)."""
        return self.keys.queue_limits

    @property
    def excluded(self) -> tuple[str, ...]:
        """The limited queues the main claim must leave alone."""
        return self.keys.excluded

    def scan(self, dialect: Dialect, cursor: CursorWrapper, force: bool = False) -> None:
        """Refresh the limit keys of READY tasks, at most every ``DISCOVER_EVERY`` seconds."""
        now = time.monotonic()
        if not force and now < self._next_scan:
            return
        self._next_scan = now + DISCOVER_EVERY
        if now >= self._next_forget:
            self._next_forget = now + FORGET_EVERY
            self.keys.forget_stale(dialect, cursor)
        self.keys.scan(dialect, cursor)

    def forget_stale(self, dialect: Dialect, cursor: CursorWrapper) -> int:
        """Delete this backend's limit rows that no claim has touched for ``STALE_AFTER``."""
        return self.keys.forget_stale(dialect, cursor)

    def claim(self, dialect: Dialect, cursor: CursorWrapper, room: int) -> list[ClaimedRow]:
        """Claim up to ``room`` limited tasks that their limits let start now."""
        self.scan(dialect, cursor)
        count = self.keys.group_count()
        if not count or room <= 0:
            return []
        start = self._offset % count
        # New keys first, once (then in their turn), and the next groups in turn.
        fresh = [g for key in self.keys.take_fresh(FRESH_A_ROUND) for g in self.keys.groups_of(key)]
        window = [self.keys.group((start + i) % count) for i in range(min(count, GROUPS_A_ROUND))]
        self._offset = start + len(window)
        groups = fresh + window
        rows: list[ClaimedRow] = []
        fair = [g for g in groups if self._fair.fair(g.limit_key)]
        with write_transaction(self.database, dialect.single_writer and bool(fair)):
            now = dialect.db_now(cursor)
            gates = self._lock([k for g in groups for k in g.gates], dialect, now)
            epoch = now.timestamp()
            for group in groups:
                if len(rows) >= room:
                    break
                if fair and group in fair:
                    continue  # taken round robin below
                held = [gates.get(k) for k in group.gates]
                if any(g is None for g in held):
                    continue  # another worker is filling one of its limits
                allowed = [r for g in held if g is not None and (r := g.room(epoch)) is not None]
                take = min([room - len(rows), *allowed])
                if take <= 0:
                    continue
                scope = Scope(limit_key=group.limit_key, exclude_queues=group.exclude)
                got = dialect.claim(
                    cursor,
                    backend_name=self.backend_name,
                    queue_names=list(group.queues)
                    if group.queues is not None
                    else self.queue_names,
                    worker_id=self.worker_id,
                    limit=take,
                    scope=scope,
                    marks=self._marks_of((scope, group.queues)),
                )
                for gate in held:
                    assert gate is not None
                    gate.taken += len(got)
                rows.extend(got)
            if fair and len(rows) < room:
                got, last = claim_fair(
                    dialect,
                    cursor,
                    backend_name=self.backend_name,
                    worker_id=self.worker_id,
                    queue_names=self.queue_names,
                    groups=fair,
                    gates=gates,
                    now=epoch,
                    room=room - len(rows),
                )
                rows.extend(got)
                if len(rows) >= room and last is not None:
                    # The next round goes on after the last key served, not after the whole
                    # round: the keys the batch had no room for come first then.
                    served = groups.index(fair[last]) - len(fresh)
                    if served >= 0:
                        self._offset = start + served + 1
            self._save(gates, now)
        return rows

    def claim_suspect(
        self, dialect: Dialect, cursor: CursorWrapper, suspect: SuspectRow
    ) -> ClaimedRow | None:
        """Claim ``suspect`` if its limits (its queue's, its task's) let it start now, and
        count its start against them; None if they do not, or another worker took it."""
        keys: list[str] = []
        if suspect.queue_name in self.queue_limits:
            keys.append(queue_key(suspect.queue_name))
        if suspect.limit_key is not None:
            keys.extend(self.keys.gates_of(suspect.limit_key))
        if not keys:
            return dialect.claim_suspect_by_id(cursor, suspect.id, self.worker_id)
        with write_transaction(self.database, dialect.single_writer):
            now = dialect.db_now(cursor)
            gates = self._lock(keys, dialect, now)
            if len(gates) < len(set(keys)):
                return None  # another worker is filling one of its limits
            epoch = now.timestamp()
            rooms = [r for gate in gates.values() if (r := gate.room(epoch)) is not None]
            if rooms and min(rooms) <= 0:
                return None
            row = dialect.claim_suspect_by_id(cursor, suspect.id, self.worker_id)
            if row is not None:
                for gate in gates.values():
                    gate.taken += 1
                self._save(gates, now)
        return row

    def waiting(self, dialect: Dialect, cursor: CursorWrapper) -> bool:
        """Whether limited tasks of this worker's queues are due (a burst worker waits for
        them: their limits will let them start)."""

        if not self.active:
            return False
        due = TaskRecord.objects.using(self.database).due(dialect.db_now(cursor))
        due = due.for_backend(self.backend_name).in_queues(self.queue_names)
        return due.filter(Q(limit_key__isnull=False) | Q(queue_name__in=self.excluded)).exists()

    # Groups and limits --------------------------------------------------------------------

    def _lock(self, keys: Sequence[str], dialect: Dialect, now: datetime) -> dict[str, Gate]:
        """Lock the ``TaskLimit`` rows of ``keys`` (made if missing), skipping rows another
        worker holds; return a gate for each row locked."""
        unique = sorted(set(keys))
        rows = TaskLimit.objects.using(self.database).filter(
            backend_name=self.backend_name, key__in=unique
        )
        missing = set(unique) - set(rows.values_list("key", flat=True))
        if missing:
            TaskLimit.objects.using(self.database).bulk_create(
                [TaskLimit(backend_name=self.backend_name, key=k) for k in sorted(missing)],
                ignore_conflicts=True,
            )
        if dialect.single_writer:
            # One writer at a time: write first, so that the transaction holds the lock
            # from its first statement instead of failing to upgrade a read later.
            rows.update(updated_at=now)
        self.keys.read_round_overrides(unique)
        locked = rows.select_for_update(skip_locked=True).values_list("key", "starts")
        running = TaskRecord.objects.using(self.database).filter(
            backend_name=self.backend_name, status="RUNNING"
        )
        gates: dict[str, Gate] = {}
        for key, starts in locked:
            if key.startswith("queue:"):
                counted = running.filter(queue_name=key[len("queue:") :])
            else:
                counted = running.filter(self._fair.counted(key))
            gates[key] = Gate(
                key,
                self.keys.limit_of(key),
                [t for t in (starts or []) if isinstance(t, (int, float))],
                counted.count,
            )
        return gates

    def _save(self, gates: dict[str, Gate], now: datetime) -> None:
        """Write each locked limit's new starts, and its limits as this worker has them."""
        epoch = now.timestamp()
        for gate in gates.values():
            limit = gate.limit
            TaskLimit.objects.using(self.database).filter(
                backend_name=self.backend_name, key=gate.key
            ).update(
                concurrency=limit.concurrency,
                rate=limit.rate,
                period=limit.period,
                starts=record_starts(limit, gate.starts, epoch, gate.taken),
                updated_at=now,
            )


def limited_claim_for(backend: Any, worker_id: str, queue_names: list[str] | None) -> LimitedClaim:
    return LimitedClaim(
        backend_name=backend.alias,
        database=backend.database,
        worker_id=worker_id,
        queue_names=queue_names,
        queue_limits=dict(backend.config.queue_limits),
    )

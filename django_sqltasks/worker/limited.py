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
from datetime import datetime, timedelta
from typing import Any

from django.db.backends.utils import CursorWrapper
from django.db.models import Q

from ..core.limits import (
    Limit,
    overridden,
    queue_key,
    rate_key,
    record_starts,
    task_limit,
    task_path_of,
)
from ..core.resolve import resolve_task
from ..models import TaskLimit, TaskRecord
from ..sql import ClaimedRow, Dialect, Scope, SuspectRow
from ..sql.marks import ClaimMarks
from ..store.queue_limits import overrides
from . import events
from .fair import FairTasks, claim_fair, counted_on, write_transaction
from .gates import Gate, Group

logger = logging.getLogger("django_sqltasks.worker")

DISCOVER_EVERY = 0.5  # seconds between two scans for the limit keys of READY tasks
GROUPS_A_ROUND = 50  # limit keys tried by one claim round; the next round starts after them
KEYS_A_SCAN = 500  # keys read by one scan; the next scan goes on after the last
# Tasks enqueued since the last scan read by one scan for keys not seen yet (the next scan goes
# on after them): a new key is served at the next round, not when the scan comes round to it.
ENQUEUED_A_SCAN = 5_000
FRESH_A_ROUND = GROUPS_A_ROUND // 2  # of a round's groups, at most this many are new keys
# A limit row untouched this long holds nothing: no start within any period (an hour at most),
# and its RUNNING tasks are counted, not stored. Workers delete such rows (one per key ever
# seen, for per-customer keys) and make them again when a task needs one.
STALE_AFTER = timedelta(hours=2)
FORGET_EVERY = 600.0  # seconds between two deletions of stale limit rows by one worker
MARKS_KEPT = 1_000  # groups whose claim marks a worker keeps (each a few hundred bytes)


class LimitedClaim:
    """Finds the limit keys of READY tasks and claims those tasks within their limits."""

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
        self._settings = {q: queue_limits[q] for q in sorted(queue_limits) if self._serves(q)}
        self.queue_limits = dict(self._settings)  # in force, with the overrides last read
        self._scanned: dict[str, Limit] = {}  # the overrides the last scan found
        self._overrides: dict[str, Limit] = {}  # the same, or as a round read them since
        # The limited queues the main claim must leave alone (one immutable tuple, replaced
        # when an override limits a queue or stops limiting one).
        self.excluded = tuple(self.queue_limits)
        self._keys: list[str] = []  # limit keys of READY tasks, as of the last scans
        self._scan_after = ""  # where the next scan goes on from
        self._since: Any = None  # the last task id read for new keys (None: not read yet)
        self._fresh: list[str] = []  # new keys, to serve at the next round
        self._next_scan = 0.0  # monotonic time of the next scan
        self._offset = 0  # where the next round starts among the groups
        self._task_limits: dict[str, Limit] = {}  # limits by task path, as this code has them
        self._fair = FairTasks(backend_name)  # which keys are taken round robin (fair.py)
        # Where each limit key's claim starts reading (sql/marks.py), most recently used last.
        self._marks: OrderedDict[tuple[Any, ...], ClaimMarks] = OrderedDict()
        self._next_forget = time.monotonic() + FORGET_EVERY

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
        return bool(self.queue_limits or self._keys)

    def scan(self, dialect: Dialect, cursor: CursorWrapper, force: bool = False) -> None:
        """Refresh the limit keys of READY tasks, at most every ``DISCOVER_EVERY`` seconds."""
        now = time.monotonic()
        if not force and now < self._next_scan:
            return
        self._next_scan = now + DISCOVER_EVERY
        if now >= self._next_forget:
            self._next_forget = now + FORGET_EVERY
            self.forget_stale(dialect, cursor)
        whole = not self._scan_after  # this scan reads the keys from the first
        found = dialect.limit_keys(cursor, self.backend_name, self._scan_after, KEYS_A_SCAN)
        if self._scan_after:
            # Going on from the last key: keep the keys before it, replace those after.
            kept = [k for k in self._keys if k <= self._scan_after]
            self._keys = kept + found
        else:
            self._keys = found
        self._scan_after = found[-1] if len(found) == KEYS_A_SCAN else ""
        if whole and not found:
            # No READY task has a limit key: the next scan finds any enqueued from now on as
            # soon as a read of what was enqueued since would (most projects use no keys, and
            # that read walks every partition's primary key: 5 ms of the server's CPU).
            self._since = None
        else:
            self._discover_enqueued(dialect, cursor)
        self._read_overrides(overrides(self.database, self.backend_name))

    def _discover_enqueued(self, dialect: Dialect, cursor: CursorWrapper) -> None:
        """Serve at the next round the keys of the tasks enqueued since the last read."""
        enqueued, self._since = dialect.limit_keys_since(
            cursor, self.backend_name, self._since, ENQUEUED_A_SCAN
        )
        if enqueued:
            known = set(self._keys) | set(self._fresh)
            new = [k for k in enqueued if k not in known]
            self._fresh += new
            self._keys += new

    def _serves(self, queue: str) -> bool:
        return self.queue_names is None or queue in self.queue_names

    def _read_overrides(self, found: dict[str, Limit]) -> None:
        """Take the overrides of this backend's queues in force (those this worker serves)."""
        found = {q: limit for q, limit in found.items() if self._serves(q)}
        self._overrides = dict(found)
        if found == self._scanned:
            return
        self._scanned = found
        queues = sorted(set(self._settings) | set(found))
        self.queue_limits = {
            q: overridden(self._settings.get(q, Limit()), found.get(q)) for q in queues
        }
        if tuple(queues) != self.excluded:
            logger.info(
                "Limited queues now %s backend=%s worker_id=%s",
                ", ".join(queues) or "none",
                self.backend_name,
                self.worker_id,
                extra={"action": "limited_queues", "queues": queues},
            )
            self.excluded = tuple(queues)
            events.emit("limited_queues", worker_id=self.worker_id, queues=queues)

    def _read_round_overrides(self, keys: Sequence[str]) -> None:
        """Read the overrides of the queues among ``keys``, in the round's transaction: an
        override set since the last scan holds from this round on."""
        queues = [k[len("queue:") :] for k in keys if k.startswith("queue:")]
        if not queues:
            return
        found = overrides(self.database, self.backend_name, queues)
        for queue in queues:
            if queue in found:
                self._overrides[queue] = found[queue]
            else:
                self._overrides.pop(queue, None)

    def forget_stale(self, dialect: Dialect, cursor: CursorWrapper) -> int:
        """Delete this backend's limit rows that no claim has touched for ``STALE_AFTER``."""
        cutoff = dialect.db_now(cursor) - STALE_AFTER
        deleted, _ = (
            TaskLimit.objects.using(self.database)
            .filter(backend_name=self.backend_name, updated_at__lt=cutoff)
            .delete()
        )
        return deleted

    def claim(self, dialect: Dialect, cursor: CursorWrapper, room: int) -> list[ClaimedRow]:
        """Claim up to ``room`` limited tasks that their limits let start now."""
        self.scan(dialect, cursor)
        count = self._group_count()
        if not count or room <= 0:
            return []
        start = self._offset % count
        # New keys first, once (then in their turn), and the next groups in turn.
        fresh = [g for key in self._fresh[:FRESH_A_ROUND] for g in self._groups_of(key)]
        self._fresh = self._fresh[FRESH_A_ROUND:]
        window = [self._group((start + i) % count) for i in range(min(count, GROUPS_A_ROUND))]
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
            keys.extend(self._gates_of(suspect.limit_key))
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

    def _group_count(self) -> int:
        """How many groups a round turns through: for each limited queue, its tasks of no
        limit key and those of each key; then each key's tasks outside the limited queues."""
        return (len(self.queue_limits) + 1) * len(self._keys) + len(self.queue_limits)

    def _group(self, index: int) -> Group:
        """The group at ``index`` (of ``_group_count``), built when a round reaches it: a
        round reads 50 of them, however many keys there are (100,000 fair keys, say)."""
        per_queue = len(self._keys) + 1
        queued = len(self.queue_limits) * per_queue
        if index >= queued:
            key = self._keys[index - queued]
            return Group(key, None, self.excluded, self._gates_of(key))
        queue = list(self.queue_limits)[index // per_queue]
        gates = (queue_key(queue),)
        if index % per_queue == 0:
            return Group(None, (queue,), (), gates)
        key = self._keys[index % per_queue - 1]
        return Group(key, (queue,), (), gates + self._gates_of(key))

    def _groups_of(self, key: str) -> list[Group]:
        """Every group of ``key``'s tasks: in each limited queue, and outside them."""
        gates = self._gates_of(key)
        in_queues = [Group(key, (q,), (), (queue_key(q), *gates)) for q in self.queue_limits]
        return [*in_queues, Group(key, None, self.excluded, gates)]

    def _gates_of(self, key: str) -> tuple[str, ...]:
        """The limits a task of ``key`` counts against: its key's concurrency and its task's
        rate (one row when the key is the task's own)."""
        limit = self._task_limit(key)
        gates = []
        if limit.concurrency is not None:
            gates.append(counted_on(key))
        if limit.rate is not None and rate_key(key) not in gates:
            gates.append(rate_key(key))
        return tuple(gates)

    def _task_limit(self, key: str) -> Limit:
        path = task_path_of(key)
        if path is None:
            return Limit()
        limit = self._task_limits.get(path)
        if limit is None:
            try:
                limit = task_limit(resolve_task(path, backend=self.backend_name))
            except Exception:
                # It cannot be imported here: claimed without a limit, it fails alone with
                # the reason when it runs.
                limit = Limit()
            self._task_limits[path] = limit
        return limit

    def _limit_of(self, key: str) -> Limit:
        if key.startswith("queue:"):
            queue = key[len("queue:") :]
            return overridden(self._settings.get(queue, Limit()), self._overrides.get(queue))
        limit = self._task_limit(key)
        if "#" in key:  # a key's own row counts concurrency; the rate is on the task's row
            return Limit(concurrency=limit.concurrency)
        if limit.concurrency is not None and rate_key(key) == key:
            return limit
        return Limit(rate=limit.rate, period=limit.period)

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
        self._read_round_overrides(unique)
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
                self._limit_of(key),
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

"""What a worker knows of the limits of its queues and tasks: the limit keys of READY tasks
(scanned at the limited claim's pace, the newly enqueued first), each limited queue's limits
in force (the settings, and the overrides of ``QueueLimitOverride``), the groups a claim round
turns through, and the limit rows each group's tasks count against. The limited claim
(``worker/limited.py``) takes tasks by them.

Everything here runs on the worker's database thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db.backends.utils import CursorWrapper

from ..core.limits import (
    Limit,
    overridden,
    queue_key,
    rate_key,
    task_limit,
    task_path_of,
)
from ..core.resolve import resolve_task
from ..models import TaskLimit
from ..sql import Dialect
from ..store.queue_limits import overrides
from . import events
from .fair import counted_on
from .gates import Group

logger = logging.getLogger("django_sqltasks.worker")

KEYS_A_SCAN = 500  # keys read by one scan; the next scan goes on after the last
# Tasks enqueued since the last scan read by one scan for keys not seen yet (the next scan goes
# on after them): a new key is served at the next round, not when the scan comes round to it.
ENQUEUED_A_SCAN = 5_000
# A limit row untouched this long holds nothing: no start within any period (an hour at most),
# and its RUNNING tasks are counted, not stored. Workers delete such rows (one per key ever
# seen, for per-customer keys) and make them again when a task needs one.
STALE_AFTER = timedelta(hours=2)


class LimitKeys:
    """The limit keys of READY tasks and the limits in force, as this worker last read them."""

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
        self._task_limits: dict[str, Limit] = {}  # limits by task path, as this code has them

    @property
    def active(self) -> bool:
        """Whether a round may find anything (queue limits, or limit keys seen)."""
        return bool(self.queue_limits or self._keys)

    def scan(self, dialect: Dialect, cursor: CursorWrapper) -> None:
        """Refresh the limit keys of READY tasks and the overrides in force."""
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

    def read_round_overrides(self, keys: Sequence[str]) -> None:
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

    def take_fresh(self, count: int) -> list[str]:
        """The first ``count`` keys seen since the last rounds took theirs (served once
        first; then in their turn)."""
        fresh, self._fresh = self._fresh[:count], self._fresh[count:]
        return fresh

    # Groups and limits --------------------------------------------------------------------

    def group_count(self) -> int:
        """How many groups a round turns through: for each limited queue, its tasks of no
        limit key and those of each key; then each key's tasks outside the limited queues."""
        return (len(self.queue_limits) + 1) * len(self._keys) + len(self.queue_limits)

    def group(self, index: int) -> Group:
        """The group at ``index`` (of ``group_count``), built when a round reaches it: a
        round reads 50 of them, however many keys there are (100,000 fair keys, say)."""
        per_queue = len(self._keys) + 1
        queued = len(self.queue_limits) * per_queue
        if index >= queued:
            key = self._keys[index - queued]
            return Group(key, None, self.excluded, self.gates_of(key))
        queue = list(self.queue_limits)[index // per_queue]
        gates = (queue_key(queue),)
        if index % per_queue == 0:
            return Group(None, (queue,), (), gates)
        key = self._keys[index % per_queue - 1]
        return Group(key, (queue,), (), gates + self.gates_of(key))

    def groups_of(self, key: str) -> list[Group]:
        """Every group of ``key``'s tasks: in each limited queue, and outside them."""
        gates = self.gates_of(key)
        in_queues = [Group(key, (q,), (), (queue_key(q), *gates)) for q in self.queue_limits]
        return [*in_queues, Group(key, None, self.excluded, gates)]

    def gates_of(self, key: str) -> tuple[str, ...]:
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

    def limit_of(self, key: str) -> Limit:
        if key.startswith("queue:"):
            queue = key[len("queue:") :]
            return overridden(self._settings.get(queue, Limit()), self._overrides.get(queue))
        limit = self._task_limit(key)
        if "#" in key:  # a key's own row counts concurrency; the rate is on the task's row
            return Limit(concurrency=limit.concurrency)
        if limit.concurrency is not None and rate_key(key) == key:
            return limit
        return Limit(rate=limit.rate, period=limit.period)

"""Fair queues: tasks with a ``fair_key`` taken round robin across keys, within a priority.

A fair task is stored with the limit key ``fair:<path>#<key>`` (``core/limits.py``), so the
main claim leaves it alone and the limited claim (``worker/limited.py``) finds its key and
hands the fair keys of each round here, in the round's order (which it turns each round).
One round reads the due priorities of each key's tasks (one index probe each), then, from the
highest priority down, claims a share of the batch from each key with tasks of that priority,
in turn, until the batch is full: 100,000 waiting tasks of one key take one share a round,
like the single task of another key. A key's share is the batch split evenly among the keys
of that priority (rounded up: the keys the batch has no room for come first next round), so a
key alone still fills the batch.

Everything here runs on the worker's database thread, inside the limited claim's round.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from django.db import connections, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import Q

from ..core.limits import concurrency_key_of, fair_prefix, is_fair, task_path_of
from ..core.resolve import resolve_task
from ..sql import ClaimedRow, Dialect

G = TypeVar("G")


class Gated(Protocol):
    """A group of the limited claim (``gates.Group``): what one claim statement takes."""

    @property
    def limit_key(self) -> str | None: ...
    @property
    def queues(self) -> tuple[str, ...] | None: ...
    @property
    def exclude(self) -> tuple[str, ...]: ...
    @property
    def gates(self) -> tuple[str, ...]: ...


class Held(Protocol):
    """A locked limit row of the round (``gates.Gate``)."""

    taken: int

    def room(self, now: float) -> int | None: ...


class FairTasks:
    """Which limit keys are fair, and which RUNNING tasks a task limit counts, as this worker's
    code has its tasks (each task path resolved once). Owned by the database thread."""

    def __init__(self, backend_name: str) -> None:
        self.backend_name = backend_name
        self._paths: dict[str, bool] = {}  # task path: whether it has a fair_key

    def fair(self, key: str | None) -> bool:
        """Whether tasks of limit key ``key`` are taken round robin: a fair key, or the
        concurrency key of a task whose fair_key is its concurrency_key."""
        if key is None:
            return False
        if is_fair(key):
            return True
        path = task_path_of(key)
        return path is not None and "#" in key and self._task_is_fair(path)

    def counted(self, key: str) -> Q:
        """The RUNNING tasks the limit row ``key`` counts: its own, and for a fair task's row
        (``task:<path>``), those of every fair key of the task."""
        path = task_path_of(key)
        if path is None or "#" in key or not self._task_is_fair(path):
            return Q(limit_key=key)
        return Q(limit_key=key) | Q(limit_key__startswith=fair_prefix(path))

    def _task_is_fair(self, path: str) -> bool:
        fair = self._paths.get(path)
        if fair is None:
            try:
                task = resolve_task(path, backend=self.backend_name)
            except Exception:
                fair = False  # it cannot be imported here: it fails alone when it runs
            else:
                fair = getattr(task, "fair_key", None) is not None
            self._paths[path] = fair
        return fair


def counted_on(key: str) -> str:
    """The limit row that counts the concurrency of the tasks of ``key``."""
    return concurrency_key_of(key)


def claim_fair(
    dialect: Dialect,
    cursor: CursorWrapper,
    *,
    backend_name: str,
    worker_id: str,
    queue_names: list[str] | None,
    groups: Sequence[Gated],
    gates: dict[str, Any],
    now: float,
    room: int,
) -> tuple[list[ClaimedRow], int | None]:
    """The fair round of the limited claim: ``fair_round`` over its fair ``groups``, each
    within the ``gates`` (locked limit rows) it counts against. The round's statements each
    serve many keys: one reads the due priorities of every key, one claims a pass of shares
    (per set of queues), whatever the number of keys."""

    def held(group: Gated) -> list[Held | None]:
        return [gates.get(k) for k in group.gates]

    def queues(group: Gated) -> list[str] | None:
        return list(group.queues) if group.queues is not None else queue_names

    def allowed(group: Gated) -> int | None:
        gated = held(group)
        if any(g is None for g in gated):
            return 0  # another worker is filling one of its limits
        rooms = [r for g in gated if g is not None and (r := g.room(now)) is not None]
        return min(rooms) if rooms else None

    def take(group: Gated, count: int) -> None:
        for gate in held(group):
            if gate is not None:
                gate.taken += count

    def priorities(chosen: Sequence[Gated]) -> list[list[int]]:
        open_ = [g for g in chosen if allowed(g) != 0]
        found = dialect.due_priorities_of_keys(
            cursor,
            backend_name=backend_name,
            queue_names=queue_names,
            keys=[g.limit_key or "" for g in open_],
        )
        by_group = {id(g): p for g, p in zip(open_, found, strict=True)}
        return [by_group.get(id(g), []) for g in chosen]

    def claim(wants: Sequence[tuple[Gated, int]], priority: int) -> list[list[ClaimedRow]]:
        # One statement per set of queues (and per repeat of a key: a new key may also be in
        # the round's turn); the shares were taken from the gates already.
        got: list[list[ClaimedRow]] = [[] for _ in wants]
        batches: dict[tuple[Any, ...], list[list[int]]] = {}
        for index, (group, _) in enumerate(wants):
            batch = batches.setdefault((group.queues, group.exclude), [[]])
            keys = {wants[i][0].limit_key for i in batch[-1]}
            if group.limit_key in keys:
                batch.append([])
            batch[-1].append(index)
        for (group_queues, exclude), parts in batches.items():
            for part in parts:
                rows = dialect.claim_of_keys(
                    cursor,
                    backend_name=backend_name,
                    queue_names=list(group_queues) if group_queues is not None else queue_names,
                    exclude_queues=exclude,
                    worker_id=worker_id,
                    priority=priority,
                    wants=[(wants[i][0].limit_key or "", wants[i][1]) for i in part],
                )
                for i, claimed in zip(part, rows, strict=True):
                    got[i] = claimed
                    take(wants[i][0], len(claimed) - wants[i][1])  # give back what it left
        return got

    return fair_round(groups, room, priorities=priorities, allowed=allowed, take=take, claim=claim)


def fair_round(
    groups: Sequence[G],
    room: int,
    *,
    priorities: Callable[[Sequence[G]], list[list[int]]],
    allowed: Callable[[G], int | None],
    take: Callable[[G, int], None],
    claim: Callable[[Sequence[tuple[G, int]], int], list[list[ClaimedRow]]],
) -> tuple[list[ClaimedRow], int | None]:
    """Claim up to ``room`` tasks of ``groups``: ``priorities(gs)`` are the due priorities of
    each g's tasks, highest first; ``allowed(g)`` how many its limits let start (None: no
    bound); ``take(g, n)`` counts n more of g's tasks against its limits; ``claim(wants,
    priority)`` takes up to n tasks of ``priority`` of each (g, n), counted already, and gives
    back what it did not take. Return the rows, and the index of the last group that got one
    (None: none did)."""
    levels: dict[int, list[int]] = {}
    for index, found in enumerate(priorities(groups)):
        for priority in found:
            levels.setdefault(priority, []).append(index)
    rows: list[ClaimedRow] = []
    last: int | None = None
    for priority in sorted(levels, reverse=True):
        waiting = levels[priority]
        while waiting and len(rows) < room:
            # The batch, or the room their limits leave (which keys of one task share), split
            # evenly among the keys waiting.
            bounds = [b for index in waiting if (b := allowed(groups[index])) is not None]
            share = max(1, -(-min([room - len(rows), *bounds]) // len(waiting)))  # rounded up
            planned: list[tuple[int, int]] = []  # (group index, count) of this pass
            left = room - len(rows)
            for index in waiting:
                free = allowed(groups[index])
                count = min(share, left, room if free is None else free)
                if count <= 0:
                    continue
                take(groups[index], count)
                planned.append((index, count))
                left -= count
                if left <= 0:
                    break
            if not planned:
                break
            got = claim([(groups[index], count) for index, count in planned], priority)
            more: list[int] = []  # the keys that gave a whole share: they may have more
            for (index, count), claimed in zip(planned, got, strict=True):
                rows.extend(claimed)
                if claimed:
                    last = index
                if len(claimed) == count:
                    more.append(index)
            waiting = more
        if len(rows) >= room:
            break
    return rows, last


@contextlib.contextmanager
def write_transaction(database: str, single_writer: bool) -> Iterator[None]:
    """A transaction; on a database of one writer (SQLite), one that takes the write lock as
    it begins (``BEGIN IMMEDIATE``): a fair round reads before it writes, and a transaction
    that has read cannot wait for the write lock once another connection has written."""
    if not single_writer:
        with transaction.atomic(using=database):
            yield
        return
    sqlite: Any = connections[database]  # django-stubs lack its transaction_mode (5.1+)
    sqlite.ensure_connection()  # connecting sets transaction_mode from the settings
    mode = sqlite.transaction_mode
    sqlite.transaction_mode = "EXCLUSIVE" if mode == "EXCLUSIVE" else "IMMEDIATE"
    atomic = transaction.atomic(using=database)
    try:
        atomic.__enter__()
    finally:
        sqlite.transaction_mode = mode
    with contextlib.ExitStack() as stack:
        stack.push(atomic)
        yield

"""Task ids: UUIDv7, so new rows append to the end of the primary key index."""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

RANDOM_POOL = 4096  # bytes drawn from os.urandom at once: the random bits of 512 ids
_VERSION_7 = 0x7 << 12  # in the second 16 bits of the high half
_VARIANT = 0b10 << 62  # the top bits of the low half
_RAND_B = (1 << 62) - 1
_new_object = object.__new__
# UUID's two slots, written through their descriptors (UUID refuses attribute writes): faster
# than object.__setattr__, which looks each one up on the class. A UUID made with object.__new__
# and both set is uuid.UUID(int=...) without its range check (for ids made or decoded in bulk).
set_uuid_int = vars(uuid.UUID)["int"].__set__
set_uuid_safe = vars(uuid.UUID)["is_safe"].__set__
# How far the clock of the machine that made a task's id (the enqueuing client) may be ahead of
# the clock that writes its finished_at (the worker's, or the database's) for a read by id to
# still find the finished task in PostgreSQL's partitioned table (see finished_not_before).
ID_CLOCK_SKEW = timedelta(days=1)

# Guarded by the lock: the last id made, and the unused part of the random pool.
_lock = threading.Lock()
_last = 0
_pool = b""
_used = 0


def _forget_pool() -> None:
    """In a forked child: its parent's pool would give both processes the same ids."""
    global _pool, _used
    _pool, _used = b"", 0


if hasattr(os, "register_at_fork"):  # POSIX only; Windows has no fork()
    os.register_at_fork(after_in_child=_forget_pool)


def new_task_id() -> uuid.UUID:
    """Return a new time-ordered UUID (version 7, RFC 9562), increasing within this process.

    The 12 bits after the millisecond timestamp hold the sub-millisecond time (RFC 9562,
    method 3); ids made within the same tick are bumped past the previous one. The 62 random
    bits come from ``os.urandom``, read a pool at a time (one system call per 512 ids).
    """
    global _last, _pool, _used
    unix_ms, sub_ms_ns = divmod(time.time_ns(), 1_000_000)
    high = (unix_ms & 0xFFFF_FFFF_FFFF) << 16 | _VERSION_7 | sub_ms_ns * 4096 // 1_000_000
    with _lock:
        if _used >= len(_pool):
            _pool, _used = os.urandom(RANDOM_POOL), 0
        low = int.from_bytes(_pool[_used : _used + 8], "big") & _RAND_B | _VARIANT
        _used += 8
        value = high << 64 | low
        if value <= _last:
            value = _last + 1
        _last = value
    # uuid.UUID(int=value) without its range check (value has 128 bits by construction).
    task_id = _new_object(uuid.UUID)
    set_uuid_int(task_id, value)
    set_uuid_safe(task_id, uuid.SafeUUID.unknown)
    return task_id


def first_id_at(moment: datetime) -> uuid.UUID:
    """Return the smallest task id of ``moment``'s millisecond: every task enqueued before
    ``moment`` has a smaller id."""
    return uuid.UUID(int=(int(moment.timestamp() * 1000) << 80) | _VERSION_7 << 64)


def finished_not_before(task_id: uuid.UUID) -> datetime | None:
    """The earliest finished_at task ``task_id`` can have: the time in its UUIDv7 id (a task
    finishes after it is enqueued) less ID_CLOCK_SKEW. None when the id is not a UUIDv7 (an id
    from a custom id function, a row from before ids were time-ordered) or its time is in the
    future (the clock that made it was wrong): nothing is known."""
    if task_id.version != 7:
        return None
    made_at = datetime.fromtimestamp((task_id.int >> 80) / 1000, tz=timezone.utc)
    if made_at > datetime.now(timezone.utc):
        return None
    return made_at - ID_CLOCK_SKEW

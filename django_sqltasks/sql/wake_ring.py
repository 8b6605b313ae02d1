"""The wake ring's statements (PostgreSQL): how the supervisors of ``tasks_worker --processes``
on many machines share the enqueue's notifications, one machine a notification.

The supervisors of one backend and one set of queues form a ring, named by ``ring_key``. Each
holds a numbered slot, a session advisory lock ``(key, n)`` on its ``LISTEN`` connection, and
listens on its slot's channel. The one that also holds the head lock ``(key, 0)`` listens on
the enqueue's channel: it wakes one of its own processes, or passes the notification on to the
next slot's channel when it has no room. A machine that dies drops its locks with its session,
and another takes its place at its next check.
"""

from __future__ import annotations

import zlib

from .channels import CHANNEL

HEAD = 0  # the head lock's number: its holder listens on the enqueue's channel
SLOTS = 1024  # the most machines in one ring


def ring_key(backend_name: str, queue_names: list[str] | None) -> int:
    """The advisory lock class (a positive int4) of the ring of the supervisors that run
    ``queue_names`` (None: every queue) of ``backend_name``."""
    queues = "*" if queue_names is None else ",".join(sorted(queue_names))
    return zlib.crc32(f"sqltasks wake ring\0{backend_name}\0{queues}".encode()) & 0x7FFFFFFF


def slot_channel(key: int, slot: int) -> str:
    """The channel of ``slot`` in the ring ``key`` (under 63 bytes: one identifier)."""
    return f"{CHANNEL}_{int(key):x}_{int(slot)}"


def take_slot_sql(key: int) -> str:
    """The first free slot of the ring, now held by this session (no row: all are taken). The
    limit stops the scan at the first lock it gets."""
    return (
        f"SELECT n FROM generate_series(1, {SLOTS}) AS n "
        f"WHERE pg_try_advisory_lock({int(key)}, n) LIMIT 1"
    )


def take_head_sql(key: int) -> str:
    return f"SELECT pg_try_advisory_lock({int(key)}, {HEAD})"


def check_sql(key: int, slot: int, head: bool) -> str:
    """Listen on the slot's channel again (a no-op that keeps ``LISTEN`` the session's last
    statement), try for the head lock unless held, and read the slots held: one row, (whether
    this session holds the head lock, the slots as an array's text)."""
    held = "true" if head else f"pg_try_advisory_lock({int(key)}, {HEAD})"
    return (
        f"LISTEN {slot_channel(key, slot)}; "
        f"SELECT {held}, ARRAY(SELECT objid FROM pg_locks WHERE locktype = 'advisory' "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        f"AND classid = {int(key)} AND objsubid = 2 AND objid > {HEAD} AND granted ORDER BY objid)"
    )


def pass_payload(hops: int, queue_name: str | None) -> str:
    """A passed notification's payload: how many machines passed it, and its queue."""
    return f"{hops}:{queue_name or ''}"


def read_payload(payload: str) -> tuple[int, str | None]:
    hops, _, queue_name = payload.partition(":")
    return (int(hops) if hops.isdigit() else 0), queue_name or None


def read_slots(text: str) -> list[int]:
    """The slots of an array's text, ``{1,2,5}``."""
    return [int(n) for n in text.strip("{}").split(",") if n]

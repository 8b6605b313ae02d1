"""What holds the MVCC horizon of a database back: the oldest of another session's
transaction, a prepared transaction and a replication slot, whose dead rows no vacuum (or
purge) may remove yet; and how old a transaction may grow before it is warned of
(SQLTASKS_OLD_TRANSACTION_SECONDS). Named by the health warnings (``ops/health.py``), the
probe, ``tasks_status`` and the admin's overview in the same words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from ..sql import TableHealth
from .durations import short

# How old another session's transaction may grow before it is said to hold cleanup back;
# settings.SQLTASKS_OLD_TRANSACTION_SECONDS overrides it. One minute: longer than a web
# request's transaction (servers time requests out after about 30 s) or a short atomic task's,
# and a minute is already costly: at a full drain (about 3,800 tasks/s measured) it leaves some
# 450,000 dead row versions behind, and claims grew 0.17-0.19 ms per 1,000 tasks drained with
# a snapshot open (docs/reliability.md), so about 40 ms slower after one minute.
OLD_TRANSACTION_SECONDS = 60.0


def _setting() -> object:
    return getattr(settings, "SQLTASKS_OLD_TRANSACTION_SECONDS", OLD_TRANSACTION_SECONDS)


def setting_problem() -> str | None:
    """Say what is wrong with SQLTASKS_OLD_TRANSACTION_SECONDS, if anything."""
    value = _setting()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        return (
            f"SQLTASKS_OLD_TRANSACTION_SECONDS is {value!r}; it must be a number of seconds, "
            "over 0."
        )
    return None


def old_transaction_seconds() -> float:
    """The age, in seconds, past which another session's transaction is warned of (the
    default while the setting is invalid: the system check E011 says so)."""
    value = _setting()
    if setting_problem() is not None or not isinstance(value, (int, float)):
        return OLD_TRANSACTION_SECONDS
    return float(value)


@dataclass(frozen=True)
class Holder:
    """What holds back the horizon of a database: the oldest transaction whose dead rows no
    vacuum (or purge) may remove yet."""

    kind: str  # "session", "prepared" (a prepared transaction) or "slot" (a replication slot)
    name: str  # "session 4711, idle in transaction, application 'psql'", ...
    seconds: float | None  # how long it has held it (a slot's age is not known in time)
    xids: int | None  # how many transactions ago its snapshot began (PostgreSQL)
    pid: int | None = None  # a session's
    gid: str | None = None  # a prepared transaction's
    query: str | None = None  # the start of a session's current or last statement
    old: bool = False  # older than old_transaction_seconds(): W005 warns of it

    @property
    def sentence(self) -> str:
        """The holder as the subject of a message, its age included."""
        if self.kind == "session":
            query = f", query {self.query[:QUERY_SHOWN]!r}" if self.query else ""
            return f"A transaction open for {short(self.seconds or 0)} ({self.name}{query})"
        if self.kind == "prepared":
            return f"A {self.name}, open for {short(self.seconds or 0)},"
        return f"The {self.name}, whose xmin is {self.xids or 0:,} transactions old,"

    def opened(self, using: str) -> str:
        """How long it has been open, on which database (W005's message)."""
        age = short(self.seconds or 0)
        if self.kind == "prepared":
            return f"A {self.name} has been open for {age} on database {using!r}"
        query = f", query {self.query[:QUERY_SHOWN]!r}" if self.query else ""
        return f"A transaction has been open for {age} on database {using!r} ({self.name}{query})"

    def end_it(self, ending: str, timeout: str) -> str:
        """What the hint says to do about it."""
        if self.kind == "prepared":
            return (
                f"Finish that prepared transaction (COMMIT PREPARED '{self.gid}' or ROLLBACK "
                f"PREPARED '{self.gid}'): no session timeout ends one"
            )
        if self.kind == "slot":
            return (
                f"Let the replica of the {self.name} catch up, or drop the slot if nothing "
                "uses it (pg_drop_replication_slot)"
            )
        return (
            f"End that transaction (commit it, or end session {self.pid} with {ending}), and "
            f"set {timeout} so that a forgotten one ends by itself"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "pid": self.pid,
            "gid": self.gid,
            "seconds": self.seconds,
            "xids": self.xids,
            "query": self.query,
        }


QUERY_SHOWN = 80  # characters of a holder's statement a message quotes (the read has 200)


def horizon_holder(health: TableHealth) -> Holder | None:
    """Whichever of another session's transaction, a prepared transaction and a replication
    slot holds the horizon furthest back (by transactions on PostgreSQL; MariaDB and MySQL
    name only a session); None if nothing is open."""
    limit = old_transaction_seconds()
    found: list[Holder] = []
    seconds = health.oldest_transaction_seconds
    if seconds is not None:
        found.append(
            Holder(
                "session",
                session(health),
                seconds,
                health.oldest_transaction_xids,
                pid=health.oldest_transaction_pid,
                query=health.oldest_transaction_query,
                old=seconds > limit,
            )
        )
    seconds = health.prepared_seconds
    if seconds is not None and health.prepared_gid is not None:
        owner = f" (owner {health.prepared_owner})" if health.prepared_owner else ""
        found.append(
            Holder(
                "prepared",
                f"prepared transaction {health.prepared_gid!r}{owner}",
                seconds,
                health.prepared_xids,
                gid=health.prepared_gid,
                old=seconds > limit,
            )
        )
    if health.slot_name is not None and health.slot_xids is not None:
        found.append(
            Holder("slot", f"replication slot {health.slot_name!r}", None, health.slot_xids)
        )
    if not found:
        return None
    return max(found, key=lambda h: (h.xids or 0, h.seconds or 0))


def session(health: TableHealth) -> str:
    """The session of the oldest transaction, as a message names it."""
    parts = [f"session {health.oldest_transaction_pid}"]
    if health.oldest_transaction_state:
        parts.append(health.oldest_transaction_state)
    if health.oldest_transaction_application:
        parts.append(f"application {health.oldest_transaction_application!r}")
    return ", ".join(parts)

"""The backend's OPTIONS: read once, checked with messages that name the option and the rule."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .bounds import MAX_COUNT, MAX_DAYS, MAX_DELAY, MAX_INTERVAL, is_count, is_number
from .limits import Limit, parse_queue_limits
from .schedules import Schedule, ScheduleError, check_time_zone, default_time_zone, parse_schedules

DEFAULT_LEASE_TIMEOUT = 30.0  # seconds without a heartbeat before a worker's tasks are rescued
DEFAULT_HEARTBEAT_INTERVAL = 5.0  # seconds between a worker's heartbeats
DEFAULT_POLL_INTERVAL = 1.0  # seconds between claims when idle
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024  # encoded args + kwargs of one task
DEFAULT_MAX_ATTEMPTS = 1  # no retries unless a task or the backend asks for them
DEFAULT_MAX_RESCUES = 5  # lost workers a task is put back in the queue for; then it fails
DEFAULT_MAX_SNOOZES = 100  # times a task may snooze; the next Snooze fails it
DEFAULT_RETRY_BACKOFF = 1.0  # seconds before the first retry; doubles each attempt
DEFAULT_RETRY_BACKOFF_MAX = 300.0  # seconds; the cap of the doubling


def _module_prefixes(alias: str, raw: Any) -> tuple[str, ...]:
    """TASK_MODULES as a tuple of dotted module names; raise ``OptionError`` naming a bad one."""
    where = f"TASKS[{alias!r}]['OPTIONS']['TASK_MODULES']"
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
        raise OptionError(f"{where} must be a list of module names (or None), not {raw!r}.")
    for name in raw:
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            raise OptionError(
                f"{where} must hold dotted module names such as 'myapp.tasks', not {name!r}."
            )
    return tuple(raw)


class OptionError(ValueError):
    """An OPTIONS value breaks its rule; the message names the option."""


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """Validated OPTIONS of one SQLTaskBackend."""

    database: str | None = None
    lease_timeout: float = DEFAULT_LEASE_TIMEOUT
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    poll_interval: float = DEFAULT_POLL_INTERVAL
    max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES
    notify: bool = True
    # The database alias the workers' LISTEN connection (and its claim) uses instead of
    # DATABASE: the same database reached directly, where DATABASE goes through a pooler in
    # transaction mode. None: DATABASE.
    listen_database: str | None = None
    tracing: bool = False  # OpenTelemetry spans for enqueues and runs (the otel extra)
    enqueue_on_commit: bool | str = False
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_rescues: int | None = DEFAULT_MAX_RESCUES  # None: put back in the queue every time
    max_snoozes: int = DEFAULT_MAX_SNOOZES
    retry_backoff: float = DEFAULT_RETRY_BACKOFF
    retry_backoff_max: float = DEFAULT_RETRY_BACKOFF_MAX
    timeout: float | None = None
    prune_successful_days: float | None = None  # None keeps successful tasks for ever
    prune_failed_days: float | None = None  # None keeps failed tasks for ever
    # Days an event sent for a key no task waits for is kept; None keeps it for ever.
    prune_unclaimed_event_days: float | None = None
    periodic: Mapping[str, Schedule] = field(default_factory=dict)
    # Packages a stored task path may import (besides modules already loaded); None: the
    # installed apps. See results.allowed_modules.
    task_modules: tuple[str, ...] | None = None
    # The zone cron schedules are read in; None: settings.TIME_ZONE with USE_TZ, else UTC.
    time_zone: str | None = None
    # Concurrency and rate limits of whole queues, shared by every worker.
    queue_limits: Mapping[str, Limit] = field(default_factory=dict)
    # False (the default): a claim's commit does not wait for its WAL flush (PostgreSQL's
    # synchronous_commit off, for the claim's transaction only); a server crash may then run
    # recent claims again. True: every claim waits for its flush.
    claim_synchronous_commit: bool = False

    @property
    def direct_sessions(self) -> bool:
        """Whether DATABASE's sessions are the client's own (a direct connection, or a pooler
        in session mode): it takes the workers' LISTEN (NOTIFY on, no LISTEN_DATABASE), which
        a pooler in transaction mode would lose. Only then may a worker set a session's
        settings on it, which such a pooler would hand on to the next client."""
        return self.notify and self.listen_database is None

    @classmethod
    def parse(cls, alias: str, raw: Mapping[str, Any]) -> BackendOptions:
        """Build options from ``TASKS[alias]["OPTIONS"]``; raise ``OptionError`` on a bad value."""
        known = {f.name.upper(): f.name for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise OptionError(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown option(s) {', '.join(unknown)}; "
                f"known options are {', '.join(sorted(known))}."
            )
        values = {known[key]: value for key, value in raw.items()}
        where = f"TASKS[{alias!r}]['OPTIONS']"
        try:
            zone = values.get("time_zone")
            if zone is not None:
                check_time_zone(f"{where}['TIME_ZONE']", zone)
            values["periodic"] = parse_schedules(
                where, values.get("periodic"), zone or default_time_zone()
            )
        except ScheduleError as e:
            raise OptionError(str(e)) from e
        try:
            values["queue_limits"] = parse_queue_limits(
                values.get("queue_limits"), f"{where}['QUEUE_LIMITS']"
            )
        except ValueError as e:
            raise OptionError(str(e)) from e
        if values.get("task_modules") is not None:
            values["task_modules"] = _module_prefixes(alias, values["task_modules"])
        opts = cls(**values)
        opts._check(alias)
        return opts

    def _check(self, alias: str) -> None:
        where = f"TASKS[{alias!r}]['OPTIONS']"
        if self.database is not None and (not isinstance(self.database, str) or not self.database):
            raise OptionError(f"{where}['DATABASE'] must be a database alias (a non-empty string).")
        for name in ("lease_timeout", "heartbeat_interval", "poll_interval"):
            value = getattr(self, name)
            if not is_number(value, 0, MAX_INTERVAL, above=True):
                raise OptionError(
                    f"{where}[{name.upper()!r}] must be a positive number of seconds, at most "
                    f"{MAX_INTERVAL:g} (a day), not {value!r}."
                )
        if self.heartbeat_interval * 2 > self.lease_timeout:
            raise OptionError(
                f"{where}['HEARTBEAT_INTERVAL'] ({self.heartbeat_interval}s) must be at most half "
                f"of LEASE_TIMEOUT ({self.lease_timeout}s), or live workers would lose their "
                "tasks to a rescue."
            )
        listen = self.listen_database
        if listen is not None and (not isinstance(listen, str) or not listen):
            raise OptionError(
                f"{where}['LISTEN_DATABASE'] must be a database alias (a non-empty string) or "
                f"None, not {listen!r}."
            )
        if not isinstance(self.notify, bool):
            raise OptionError(f"{where}['NOTIFY'] must be True or False, not {self.notify!r}.")
        if not isinstance(self.tracing, bool):
            raise OptionError(f"{where}['TRACING'] must be True or False, not {self.tracing!r}.")
        if not isinstance(self.claim_synchronous_commit, bool):
            raise OptionError(
                f"{where}['CLAIM_SYNCHRONOUS_COMMIT'] must be True or False, not "
                f"{self.claim_synchronous_commit!r}."
            )
        if not isinstance(self.enqueue_on_commit, (bool, str)) or self.enqueue_on_commit == "":
            raise OptionError(
                f"{where}['ENQUEUE_ON_COMMIT'] must be True, False or a database alias, not "
                f"{self.enqueue_on_commit!r}."
            )
        most = f"at most {MAX_COUNT:,}"
        attempts = self.max_attempts
        if not is_count(attempts, 1):
            raise OptionError(
                f"{where}['MAX_ATTEMPTS'] must be a whole number of at least 1, {most}, not "
                f"{attempts!r}."
            )
        rescues = self.max_rescues
        if rescues is not None and not is_count(rescues, 0):
            raise OptionError(
                f"{where}['MAX_RESCUES'] must be a whole number (0 or more) or None, {most}, "
                f"not {rescues!r}."
            )
        if not is_count(self.max_snoozes, 0):
            raise OptionError(
                f"{where}['MAX_SNOOZES'] must be a whole number (0 or more), {most}, not "
                f"{self.max_snoozes!r}."
            )
        for name in ("retry_backoff", "retry_backoff_max"):
            value = getattr(self, name)
            if not is_number(value, 0, MAX_DELAY):
                raise OptionError(
                    f"{where}[{name.upper()!r}] must be a non-negative number of seconds, at "
                    f"most {MAX_DELAY:g} (366 days), not {value!r}."
                )
        timeout = self.timeout
        if timeout is not None and not is_number(timeout, 0, MAX_DELAY, above=True):
            raise OptionError(
                f"{where}['TIMEOUT'] must be a positive number of seconds, at most "
                f"{MAX_DELAY:g} (366 days), or None, not {timeout!r}."
            )
        for name in ("prune_successful_days", "prune_failed_days", "prune_unclaimed_event_days"):
            days = getattr(self, name)
            if days is not None and not is_number(days, 0, MAX_DAYS):
                raise OptionError(
                    f"{where}[{name.upper()!r}] must be a number of days (0 or more) or None, at "
                    f"most {MAX_DAYS:,}, not {days!r}."
                )
        size = self.max_payload_bytes
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise OptionError(
                f"{where}['MAX_PAYLOAD_BYTES'] must be a positive integer or None, not {size!r}."
            )

"""What a running task reports about itself: how far it is (a number from 0 to 1 and a short
note) and a small dict of metadata.

A task that takes its context reports through it::

    @task(takes_context=True)
    def resize(context, image_id):
        context.set_progress(0.4, "resizing")
        context.set_metadata(pages=12)

Each call only changes this attempt's report in memory (``AttemptReport``); the worker writes
the latest report to the task's row at most once per heartbeat, and once more when the attempt
ends. The stored report names its attempt (``TaskResult.attempts`` when it ran): a new attempt
starts with no report, and the last attempt's report stays on the row once it has ended.
"""

from __future__ import annotations

import copy
import math
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn, Protocol

from django.utils import timezone

from ..compat import TaskContext
from ..exceptions import InvalidTaskArguments
from .durable import DurableContext, StepLog
from .serialization import check_json, dumps, loads
from .storable import escape

MAX_NOTE_CHARS = 200  # characters of a progress note
MAX_METADATA_BYTES = 8_192  # of the metadata dict, encoded as JSON
MAX_METADATA_KEYS = 64


class Metadata(dict[str, Any]):
    """A report's metadata: a dict that refuses changes, and that pickles, copies and deep-copies
    as one (a ``TaskResult`` holding it goes through ``pickle``, caches and
    ``dataclasses.asdict``)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("A task result's metadata is read-only: copy it with dict() to change it.")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[Metadata], tuple[dict[str, Any]]]:
        return (type(self), (dict(self),))

    def __copy__(self) -> Metadata:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Metadata:
        return type(self)(copy.deepcopy(dict(self), memo))


NO_METADATA: Mapping[str, Any] = Metadata()  # read-only, so one is shared by all


def no_metadata() -> Mapping[str, Any]:
    """NO_METADATA, as a dataclass default (a dict default must come from a factory)."""
    return NO_METADATA


class ReportSink(Protocol):
    """Where an attempt's report goes when it changes: the worker's writer, or nowhere."""

    def changed(self, report: AttemptReport) -> None: ...


def check_progress(value: Any) -> float:
    """``value`` as a float; raise ``TypeError``/``ValueError`` naming the field and the rule."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"progress must be a number from 0 to 1, not {value!r} (a {type(value).__name__})."
        )
    number = float(value)
    if not (math.isfinite(number) and 0.0 <= number <= 1.0):
        raise ValueError(f"progress must be a finite number from 0 to 1, not {value!r}.")
    return number


def check_note(note: Any) -> str:
    """``note`` made storable (NUL and lone surrogates escaped); raise naming the rule."""
    if not isinstance(note, str):
        raise TypeError(f"note must be a string, not {note!r} (a {type(note).__name__}).")
    if len(note) > MAX_NOTE_CHARS:
        raise ValueError(f"note must be at most {MAX_NOTE_CHARS} characters, not {len(note)}.")
    return escape(note)


def storable_json(value: Any) -> Any:
    """``value`` with every string (keys too) escaped as ``storable.escape`` does."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, Mapping):
        return {
            (escape(key) if isinstance(key, str) else key): storable_json(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [storable_json(item) for item in value]
    return value


def check_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` as storable JSON; raise naming the key and the rule."""
    if len(metadata) > MAX_METADATA_KEYS:
        raise ValueError(
            f"metadata must have at most {MAX_METADATA_KEYS} keys, not {len(metadata)}."
        )
    stored = storable_json(dict(metadata))
    try:
        check_json(stored, "metadata")
    except InvalidTaskArguments as e:
        raise ValueError(str(e)) from None
    try:
        size = len(dumps(stored).encode())
    except TypeError as e:  # bytes, say: check_json lets through what normalize_json converts
        raise ValueError(f"metadata must be JSON-serializable: {e}.") from None
    if size > MAX_METADATA_BYTES:
        raise ValueError(
            f"metadata must encode to at most {MAX_METADATA_BYTES:,} bytes of JSON, not "
            f"{size:,}: store large data elsewhere and keep its key here."
        )
    return stored


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """A report as stored: the attempt that made it, and what it said."""

    attempt: int
    progress: float | None = None
    note: str = ""
    metadata: Mapping[str, Any] = field(default_factory=no_metadata)
    updated_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "progress": self.progress,
            "note": self.note,
            "metadata": dict(self.metadata),
            "updated_at": None if self.updated_at is None else self.updated_at.isoformat(),
        }

    @classmethod
    def from_json(cls, value: Any) -> ProgressReport | None:
        """The report a row's ``progress`` column holds; None if it holds none (or garbage)."""
        if value is None:
            return None
        try:
            data = loads(value)
            updated = data.get("updated_at")
            progress = data.get("progress")
            return cls(
                attempt=int(data["attempt"]),
                progress=None if progress is None else float(progress),
                note=str(data.get("note") or ""),
                metadata=Metadata(data.get("metadata") or {}),
                updated_at=None if updated is None else datetime.fromisoformat(updated),
            )
        except (TypeError, ValueError, KeyError, AttributeError):
            return None  # written by hand, or damaged: a report is only informative


def current_report(value: Any, attempt: int) -> ProgressReport | None:
    """The stored report if it belongs to ``attempt`` (the task's latest); None otherwise."""
    report = ProgressReport.from_json(value)
    if report is None or report.attempt != attempt:
        return None
    return report


class AttemptReport:
    """One attempt's report in memory: changed by the task's code (on its thread or the event
    loop), read by the worker's writer (the database thread). Every access holds the lock."""

    def __init__(
        self,
        task_id: Any,
        attempt: int,
        sink: ReportSink | None,
        *,
        claims: int = 0,
        labels: tuple[str, str, str] = ("", "", ""),
    ) -> None:
        # Set once, read from any thread.
        self.task_id = task_id
        self.attempt = attempt  # TaskResult.attempts of the attempt: its run number
        self.claims = claims  # the row's attempts column while this attempt holds it
        self.labels = labels  # backend, queue, task path: the metrics' labels
        self.sink = sink
        self._lock = threading.Lock()
        self._progress: float | None = None
        self._note = ""
        self._metadata: dict[str, Any] = {}
        self._updated_at: datetime | None = None
        self._unwritten = False  # changed since it was last taken for writing

    def set_progress(self, progress: float, note: str | None = None) -> None:
        value = check_progress(progress)
        text = None if note is None else check_note(note)
        with self._lock:
            self._progress = value
            if text is not None:
                self._note = text
            self._changed()

    def set_metadata(self, values: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        if values is not None and not isinstance(values, Mapping):
            raise TypeError(f"metadata must be a dict, not {type(values).__name__}.")
        update = {**(values or {}), **more}
        with self._lock:
            merged = check_metadata({**self._metadata, **update})
            self._metadata = merged
            self._changed()

    def _changed(self) -> None:
        """Mark the report changed (the lock is held) and tell the sink the first time."""
        self._updated_at = timezone.now()
        first = not self._unwritten
        self._unwritten = True
        if first and self.sink is not None:
            self.sink.changed(self)

    def snapshot(self) -> ProgressReport:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> ProgressReport:
        return ProgressReport(
            attempt=self.attempt,
            progress=self._progress,
            note=self._note,
            metadata=Metadata(self._metadata),
            updated_at=self._updated_at,
        )

    def take(self) -> ProgressReport | None:
        """The report if it changed since the last ``take`` (then it counts as written)."""
        with self._lock:
            if not self._unwritten:
                return None
            self._unwritten = False
            return self._snapshot()

    def untake(self) -> None:
        """A write of the taken report failed: write it again with the next one."""
        with self._lock:
            self._unwritten = True

    @property
    def unwritten(self) -> bool:
        with self._lock:
            return self._unwritten


# django-stubs declare TaskContext without frozen=True, which it is (at runtime, on Django 6
# and in the backport).
@dataclass(frozen=True, slots=True, kw_only=True)
class SQLTaskContext(DurableContext, TaskContext):  # type: ignore[misc]
    """The context of a ``takes_context=True`` task run by django-sqltasks: Django's
    ``TaskContext`` with ``set_progress`` and ``set_metadata``, and the durable methods
    (``step``, ``sleep``, ``wait_for_event``: see ``core/durable.py``)."""

    report: AttemptReport
    steps: StepLog | None = None

    def set_progress(self, progress: float, note: str | None = None) -> None:
        """Record how far this attempt is: ``progress`` from 0 to 1, and a short ``note``
        (kept from the last call when None)."""
        self.report.set_progress(progress, note)

    def set_metadata(self, values: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        """Merge ``values`` and keyword arguments into this attempt's metadata, as
        ``dict.update`` does."""
        self.report.set_metadata(values, **more)

    @property
    def progress(self) -> float | None:
        return self.report.snapshot().progress

    @property
    def note(self) -> str:
        return self.report.snapshot().note

    @property
    def metadata(self) -> Mapping[str, Any]:
        """This attempt's metadata, read-only: change it with ``set_metadata``."""
        return self.report.snapshot().metadata


class ProgressWriter(Protocol):
    """A worker's writer of progress reports, as the metrics read it (``worker/reporter.py``)."""

    def counts(self) -> tuple[int, int]: ...

    def running(self) -> list[Any]: ...


class LiveWriters:
    """Every live progress writer of this process: added to by the thread that makes a worker,
    read by a metrics scrape's thread; behind the lock. Held weakly: a stopped worker's writer
    leaves with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: weakref.WeakSet[Any] = weakref.WeakSet()

    def add(self, writer: ProgressWriter) -> None:
        with self._lock:
            self._writers.add(writer)

    def all(self) -> list[ProgressWriter]:
        with self._lock:
            return list(self._writers)


live_writers = LiveWriters()

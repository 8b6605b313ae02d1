"""How values cross to one database and back: ids, datetimes, and the rows a claim returns,
decoded in one pass where they are sound and column by column where they are not."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

import orjson
from django.db.backends.base.base import BaseDatabaseWrapper

from ..ids import set_uuid_int, set_uuid_safe
from .rows import RETURNED_COLUMNS, UTC, ClaimedRow, json_column

json_loads = orjson.loads
_new_object = object.__new__
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown
_from_iso = datetime.fromisoformat


def uuid_from_text(text: str) -> uuid.UUID:
    """``uuid.UUID(text)`` for the database's text form of an id, in half the time: the
    checks of ``UUID.__init__`` but the one that matters here, 32 hex digits."""
    digits = text.replace("-", "")
    if len(digits) != 32:
        return uuid.UUID(text)
    value = _new_object(uuid.UUID)
    set_uuid_int(value, int(digits, 16))
    set_uuid_safe(value, _UNKNOWN_SAFETY)
    return value


def _text_id(value: Any) -> str:
    """A claimed id's text where it is the canonical form (PostgreSQL's uuid as text, 36
    characters), else "" (SQLite's and MySQL's are 32 hex digits)."""
    return value if type(value) is str and len(value) == 36 else ""


class Values:
    """One database's values in and out, on one Django connection (set by ``Vendor``)."""

    connection: BaseDatabaseWrapper
    use_tz: bool  # settings.USE_TZ
    # The text of the last claimed row's started_at and its decoded value.
    _claim_clock: tuple[Any, datetime | None]

    def _encode_id(self, value: uuid.UUID) -> Any:
        return value.hex

    def _decode_id(self, value: Any) -> uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(value)

    def _encode_datetime(self, value: datetime | None) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def _decode_datetime(self, value: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC) if self.use_tz else value
        # Text from the database is in the connection's time zone, which without USE_TZ is
        # TIME_ZONE: the naive local time Django would return.
        return value if self.use_tz else value.replace(tzinfo=None)

    def _claimed_row(self, values: Sequence[Any], *, json_decoded: bool = False) -> ClaimedRow:
        """A claimed row from its RETURNED_COLUMNS values; ``json_decoded`` when the JSON
        columns arrive as Python values rather than text."""
        if not json_decoded:
            # One pass for a sound row (each column decoded inline, no check recorded); any
            # row it does not take whole is decoded again column by column, which says why.
            try:
                row = self._sound_claimed_row(values)
            except (ValueError, TypeError, RecursionError, AttributeError):
                row = None
            if row is not None:
                return row
        return self._checked_claimed_row(values, json_decoded=json_decoded)

    def _sound_claimed_row(self, values: Sequence[Any]) -> ClaimedRow | None:
        """A claimed row from text JSON columns, if every column holds what it should; None
        (or an exception) if not."""
        (
            id_,
            _task_path,  # these four pass through as they came (values[1:5])
            _backend_name,
            _queue_name,
            _priority,
            args,
            kwargs,
            enqueued_at,
            run_after,
            started_at,
            last_attempted_at,
            errors,
            worker_ids,
            attempts,
            snoozes,
            workflow_id,
            trace_parent,
        ) = values  # fmt: skip  (RETURNED_COLUMNS, in order)
        # Empty ones (most) without the decoder: a fresh list or dict each, as it would give.
        args = [] if args == "[]" else json_loads(args)
        kwargs = {} if kwargs == "{}" else json_loads(kwargs)
        errors = [] if errors == "[]" else json_loads(errors)
        worker_ids = json_loads(worker_ids)
        if (
            type(args) is not list
            or type(kwargs) is not dict
            or type(errors) is not list
            or type(worker_ids) is not list
        ):
            return None
        decode = self._decode_datetime
        enqueued: datetime | None
        if type(enqueued_at) is str and self.use_tz:
            # The common case inline (a claim decodes one per row): aware text, kept aware.
            enqueued = _from_iso(enqueued_at)
            if enqueued.tzinfo is None:
                enqueued = enqueued.replace(tzinfo=UTC)
        else:
            enqueued = decode(enqueued_at)
        # The rows of one claim share its clock, and a first attempt's two times are one:
        # decode each text once (a tuple, replaced whole: threads may share this dialect).
        memo_text, memo_value = self._claim_clock
        if started_at == memo_text:
            started = memo_value
        else:
            started = decode(started_at)
            self._claim_clock = (started_at, started)
        attempted = started if last_attempted_at == started_at else decode(last_attempted_at)
        if enqueued is None or started is None or attempted is None:
            return None
        if type(id_) is str:
            task_id = uuid_from_text(id_)
            text_id = id_ if len(id_) == 36 else ""  # as _text_id, without its call
        else:
            task_id, text_id = (id_ if type(id_) is uuid.UUID else uuid_from_text(id_)), ""
        # Positional, in ClaimedRow's field order: its 18 keywords cost a row about 0.2 us.
        return ClaimedRow(
            task_id,
            values[1],  # task_path, backend_name, queue_name and priority, as they came
            values[2],
            values[3],
            values[4],
            args,
            kwargs,
            enqueued,
            None if run_after is None else decode(run_after),
            started,
            attempted,
            errors,
            worker_ids,
            attempts,
            snoozes,
            None if workflow_id is None else self._decode_id(workflow_id),
            None,  # corrupt
            trace_parent,
            text_id,
        )

    def _checked_claimed_row(
        self, values: Sequence[Any], *, json_decoded: bool = False
    ) -> ClaimedRow:
        """A claimed row decoded column by column: a column that does not hold what it should
        is recorded in ``corrupt``, so that the row fails alone and says why."""
        v = dict(zip(RETURNED_COLUMNS, values, strict=True))
        # A row damaged outside this package must fail alone, not break the whole claim.
        problems: list[str] = []
        decode_json = partial(json_column, decoded=json_decoded, problems=problems)
        decode = partial(self._decode_claimed_datetime, problems=problems)
        workflow_id = v["workflow_id"]
        return ClaimedRow(
            id=self._decode_id(v["id"]),
            task_path=v["task_path"],
            backend_name=v["backend_name"],
            queue_name=v["queue_name"],
            priority=v["priority"],
            args=decode_json("args", v["args"]),
            kwargs=decode_json("kwargs", v["kwargs"]),
            enqueued_at=decode(v["enqueued_at"]),  # type: ignore[arg-type]
            run_after=decode(v["run_after"]),
            started_at=decode(v["started_at"]),  # type: ignore[arg-type]
            last_attempted_at=decode(v["last_attempted_at"]),  # type: ignore[arg-type]
            errors=decode_json("errors", v["errors"]),
            worker_ids=decode_json("worker_ids", v["worker_ids"]),
            attempts=v["attempts"],
            snoozes=v["snoozes"],
            workflow_id=None if workflow_id is None else self._decode_id(workflow_id),
            corrupt="; ".join(problems) or None,
            trace_parent=v["trace_parent"],
            text_id=_text_id(v["id"]),
        )

    def _decode_claimed_datetime(self, value: Any, *, problems: list[str]) -> datetime | None:
        try:
            return self._decode_datetime(value)
        except (TypeError, ValueError) as e:
            problems.append(f"a date column holds {str(value)[:100]!r} ({e})")
            return datetime.now(UTC)

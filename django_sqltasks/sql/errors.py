"""The database driver's errors beneath Django's: what each database's dialect reads its
SQLSTATE or error code from, and what the layers above read a partition move from
(``store/moved.py``)."""

from __future__ import annotations


def driver_error(error: BaseException) -> BaseException:
    """The database driver's exception behind Django's wrapper (or ``error`` itself)."""
    cause = error.__cause__
    return cause if cause is not None else error

"""A stored error read back for people: its class's short name and its message's first line.

A task's error is stored as ``{"exception_class_path", "traceback"}``. The traceback is either
Python's formatted traceback, whose last ``Name: message`` line is the message, or, for errors
the worker or an operator records (cancelled, worker lost), the reason itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

TRACEBACK_START = "Traceback (most recent call last):"
KEYS = ("exception_class_path", "traceback")
UNREADABLE = "<a stored value too deeply nested to show>"


def stored_errors(value: Any) -> list[dict[str, str]]:
    """A row's ``errors`` column as a list of ``{"exception_class_path", "traceback"}`` of text,
    whatever it holds: the worker writes that shape, but a row written by hand (or damaged) may
    hold a dict, a string, other items or other values; each becomes one error that shows it."""
    if value is None or value == []:
        return []
    items = value if isinstance(value, list) else [value]
    errors = []
    for item in items:
        if isinstance(item, dict) and any(key in item for key in KEYS):
            errors.append({key: _text(item.get(key)) for key in KEYS})
        else:
            errors.append({"exception_class_path": "", "traceback": _text(item)})
    return errors


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, default=repr)
    except (RecursionError, ValueError):  # nested deeper than Python recurses, or circular
        return UNREADABLE


def short_class(class_path: str) -> str:
    return class_path.rsplit(".", 1)[-1]


def first_line(class_path: str, traceback: str) -> str:
    """The first line of the error's message ("" when it has none)."""
    lines = traceback.splitlines()
    if not traceback.lstrip().startswith(TRACEBACK_START):
        return next((line.strip() for line in lines if line.strip()), "")
    short = short_class(class_path)
    # The raised exception is the last one printed; its message may span lines, so take the
    # last line that starts with its name, not the traceback's last line.
    for line in reversed(lines):
        for name in (class_path, short):
            if line == name:
                return ""
            if line.startswith(f"{name}: "):
                return line[len(name) + 2 :].strip()
    return ""


def summary(error: Mapping[str, Any]) -> str:
    """``"ValueError: boom"``: the class's short name, and the message's first line if any."""
    class_path = str(error.get("exception_class_path") or "")
    message = first_line(class_path, str(error.get("traceback") or ""))
    short = short_class(class_path) or "Error"
    return f"{short}: {message}" if message else short


def error_summary(error: Any) -> str:
    """Return ``"ValueError: boom"`` for one of a result's ``errors`` (a ``TaskError``)."""
    return summary(
        {
            "exception_class_path": getattr(error, "exception_class_path", ""),
            "traceback": getattr(error, "traceback", ""),
        }
    )

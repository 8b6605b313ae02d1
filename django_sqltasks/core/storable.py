"""Making text that a worker writes (tracebacks, error messages, salvage reasons) storable.

A task's exception can carry anything: a lone surrogate from a file name that is not UTF-8, a
NUL byte from binary data, a message of many megabytes. None of these may reach the database
as they are: PostgreSQL refuses NUL and invalid UTF-8 in text and JSON, MySQL refuses
statements over ``max_allowed_packet``, and a refused outcome would hold up every outcome
written with it. So the text is escaped and capped here, before it is written, and the cap says
so in the stored text.
"""

from __future__ import annotations

MAX_TRACEBACK_CHARS = 65_536  # characters of a stored traceback; the rest is cut, and said so
MAX_ERROR_CLASS_CHARS = 1_000  # characters of a stored exception class path
# Of a capped text, the share kept from its start; the rest comes from its end, where a
# traceback names the exception and its message.
HEAD_SHARE = 0.25


def escape(text: str) -> str:
    """``text`` with NUL written as ``\\x00`` and lone surrogates as ``\\udXXX`` escapes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def storable(text: str, limit: int, what: str = "text") -> str:
    """``text`` escaped (see ``escape``) and cut to at most ``limit`` characters; a cut text
    says how much was cut, in place of the cut part, naming ``what`` and its limit."""
    text = escape(text)
    if len(text) <= limit:
        return text
    note = f"\n[... {{}} characters cut: a stored {what} keeps at most {limit:,} characters ...]\n"
    room = max(0, limit - len(note) - 20)
    head = int(room * HEAD_SHARE)
    tail = room - head
    cut = len(text) - head - tail
    return text[:head] + note.format(f"{cut:,}") + (text[-tail:] if tail else "")


def storable_traceback(text: str) -> str:
    """A formatted traceback, escaped and capped at MAX_TRACEBACK_CHARS."""
    return storable(text, MAX_TRACEBACK_CHARS, "traceback")


def storable_class_path(text: str) -> str:
    """An exception's class path, escaped and capped at MAX_ERROR_CLASS_CHARS."""
    return storable(text, MAX_ERROR_CLASS_CHARS, "exception class path")

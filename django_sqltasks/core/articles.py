"""A noun with its indefinite article, for messages that name a value's class."""

from __future__ import annotations


def a_or_an(noun: str) -> str:
    """``noun`` after its article: "a dict", "an int", "an ImmediateBackend"."""
    return f"{'an' if noun and noun[0].lower() in 'aeiou' else 'a'} {noun}"

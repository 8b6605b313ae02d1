"""JSON rules for what a task takes and returns, with errors that name the offending value."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..compat import normalize_json
from ..exceptions import InvalidTaskArguments
from .articles import a_or_an

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# Floats of this magnitude or more are integers, which PostgreSQL's jsonb writes out in full
# digits (1e300 as 1 and 300 zeros): they come back as integers beyond 64 bits.
FLOAT_MIN, FLOAT_MAX = -(2.0**63), 2.0**63
# Nesting levels of one argument or return value. MariaDB's JSON stops at 32 levels (its
# JSON_VALID check refuses deeper documents, and the args column adds a level), so this is the
# deepest every supported database stores; deeper data is almost certainly a mistake.
MAX_DEPTH = 30


def check_json(value: Any, where: str, _depth: int = 0) -> None:
    """Raise ``InvalidTaskArguments`` naming ``where`` unless ``value`` round-trips through JSON.

    Accepts what Django's ``normalize_json`` accepts (tuples and bytearrays become lists,
    UTF-8 bytes become str), and refuses what a database's JSON would silently change:
    non-string object keys, NaN and infinities, integers beyond 64 bits and floats of their
    magnitude (PostgreSQL returns them as such integers); and text no
    database can take back: NUL characters (PostgreSQL's jsonb refuses them) and lone
    surrogates (not UTF-8).
    """
    if isinstance(value, str):
        check_text(value, where)
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise InvalidTaskArguments(
                f"{where} is an integer outside the signed 64-bit range JSON columns can hold; "
                "pass it as a string."
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidTaskArguments(f"{where} is {value!r}, which JSON cannot represent.")
        if not FLOAT_MIN < value < FLOAT_MAX:
            raise InvalidTaskArguments(
                f"{where} is {value!r}, a float of magnitude 2**63 or more, which PostgreSQL's "
                "JSON gives back as an integer outside the signed 64-bit range; pass it as a "
                "string."
            )
        return
    if _depth >= MAX_DEPTH:
        raise InvalidTaskArguments(
            f"{where} is nested more than {MAX_DEPTH} levels deep, deeper than MariaDB's JSON "
            "stores; flatten it."
        )
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidTaskArguments(
                f"{where} is bytes that are not valid UTF-8; encode binary data (base64) first."
            ) from e
        check_text(text, where)
        return
    if isinstance(value, bytearray):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidTaskArguments(
                    f"{where} has the key {key!r} of type {type(key).__name__}; JSON object keys "
                    "must be strings."
                )
            check_text(key, f"{where} key {key!r}")
            check_json(item, f"{where}[{key!r}]", _depth + 1)
        return
    if isinstance(value, Sequence) and not isinstance(value, str):
        for index, item in enumerate(value):
            check_json(item, f"{where}[{index}]", _depth + 1)
        return
    kind = type(value)
    raise InvalidTaskArguments(
        # "Unsupported type" is Django's own wording (django.utils.json.normalize_json).
        f"Unsupported type: {where} is {a_or_an(f'{kind.__module__}.{kind.__qualname__}')}, "
        "which is not "
        "JSON-serializable: "
        "use str, int, float, bool, None, list, tuple or dict (convert dates, Decimals, UUIDs "
        "and model instances to strings or ids)."
    )


def text_problem(value: str) -> str | None:
    """Say why ``value`` cannot be stored as text by every supported database, or None."""
    if "\x00" in value:
        return (
            "contains a NUL character (\\x00), which not every supported database can store "
            "(PostgreSQL's text and jsonb cannot), so no database takes it; remove it, or "
            "encode the data (base64) first"
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"contains a lone surrogate ({value[e.start]!r}), which is not valid UTF-8 text"
    return None


def check_text(value: str, where: str) -> None:
    """Raise ``InvalidTaskArguments`` if ``value`` holds text that a JSON column cannot store."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidTaskArguments(f"{where} {problem}.")


def check_arguments(args: Any, kwargs: Any) -> None:
    """Check every positional and keyword argument, naming the first that is not JSON.

    ``backend.enqueue(task, args, kwargs)`` is public, so the shapes are checked too: args a
    list or tuple, kwargs a dict whose keys are storable strings.
    """
    if not isinstance(args, (list, tuple)):
        raise InvalidTaskArguments(
            f"Task arguments args must be a list or tuple, not {type(args).__name__}."
        )
    if not isinstance(kwargs, Mapping):
        raise InvalidTaskArguments(
            f"Task arguments kwargs must be a dict of name -> value, not {type(kwargs).__name__}."
        )
    for index, value in enumerate(args):
        check_json(value, f"Task argument args[{index}]")
    for name, value in kwargs.items():
        if not isinstance(name, str):
            raise InvalidTaskArguments(
                f"Task keyword argument name {name!r} is of type {type(name).__name__}; keyword "
                "argument names must be strings."
            )
        check_text(name, f"Task keyword argument name {name!r}")
        check_json(value, f"Task argument kwargs[{name!r}]")


_SCALARS = frozenset({str, int, float, bool, type(None)})


def normalized(value: Any) -> Any:
    """Django's ``normalize_json`` of a checked value (``check_json``): lists, dicts and
    scalars of the exact built-in types are walked here, anything else by Django's function."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        return [normalized(item) for item in value]
    if kind is dict:
        return {key: normalized(item) for key, item in value.items()}
    return normalize_json(value)


def dumps(value: Any) -> str:
    """Encode already-checked, normalized JSON data."""
    return orjson.dumps(value).decode()


def loads(value: str | bytes | Any) -> Any:
    """Decode a JSON column as a driver returns it (text, bytes, or already decoded)."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return orjson.loads(value)
    return value

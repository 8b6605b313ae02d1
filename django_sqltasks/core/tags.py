"""Tags: short labels set at enqueue (``@task(tags=[...])``, ``task.using(tags=[...])``), stored
with each task, and shown, filtered and searched in the admin."""

from __future__ import annotations

import re
from typing import Any

from ..compat import InvalidTask

MAX_TAGS = 16  # tags per task: each one is a key of the tag index
MAX_TAG_LENGTH = 64  # characters per tag
# Letters, digits and ``_ . : / @ = + -``: a tag is a label, and with no quote, backslash, space
# or wildcard in it a tag is found as the same text on every database, ``"tag"`` in the list's
# JSON (the bounded search of MariaDB and SQLite reads it so).
TAG_PATTERN = re.compile(r"[\w.:/@=+-]+")
TAG_RULE = (
    f"a list of at most {MAX_TAGS} strings of 1 to {MAX_TAG_LENGTH} letters, digits or "
    "_ . : / @ = + -"
)


def normalized_tags(value: Any) -> Any:
    """``value`` as a tuple when it is a list (so that a task stays hashable), else unchanged
    (``check_tags`` then names what is wrong with it)."""
    return tuple(value) if isinstance(value, list) else value


def check_tags(value: Any) -> tuple[str, ...]:
    """Return ``value`` as a tuple of tags; raise ``InvalidTask`` naming the rule it breaks."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InvalidTask(f"tags must be {TAG_RULE}, not {value!r}.")
    if len(value) > MAX_TAGS:
        raise InvalidTask(f"tags must be {TAG_RULE}: {len(value)} given.")
    for tag in value:
        if not isinstance(tag, str) or not is_tag(tag):
            raise InvalidTask(f"tags must be {TAG_RULE}: {tag!r} is not.")
    return tuple(dict.fromkeys(value))  # each tag once, in the order given


def is_tag(text: str) -> bool:
    """Whether ``text`` could be a tag (the admin's search asks before it looks for one)."""
    return 0 < len(text) <= MAX_TAG_LENGTH and TAG_PATTERN.fullmatch(text) is not None

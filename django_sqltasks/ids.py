"""Task ids: UUIDv7, so new rows append to the end of the primary key index."""

from __future__ import annotations

import os
import time
import uuid


def new_task_id() -> uuid.UUID:
    """Return a new time-ordered UUID (version 7, RFC 9562)."""
    unix_ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> 68  # 12 bits
    rand_b = rand & ((1 << 62) - 1)  # 62 bits
    value = (unix_ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return uuid.UUID(int=value)

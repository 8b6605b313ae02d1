"""Task ids: UUIDv7, so new rows append to the end of the primary key index."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last = 0


def new_task_id() -> uuid.UUID:
    """Return a new time-ordered UUID (version 7, RFC 9562), increasing within this process.

    The 12 bits after the millisecond timestamp hold the sub-millisecond time (RFC 9562,
    method 3); ids made within the same tick are bumped past the previous one.
    """
    global _last
    now_ns = time.time_ns()
    unix_ms, sub_ms_ns = divmod(now_ns, 1_000_000)
    rand_a = sub_ms_ns * 4096 // 1_000_000  # 12 bits of sub-millisecond precision
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (unix_ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    with _lock:
        if value <= _last:
            value = _last + 1
        _last = value
    return uuid.UUID(int=value)

"""Task ids: UUIDv7, increasing within a process, random bits read from a pool."""

from __future__ import annotations

import itertools
import os
import time
import uuid

import pytest

from django_sqltasks import ids

RAND_B = (1 << 62) - 1


def test_ids_are_version_7_with_the_time_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    made = ids.new_task_id()
    after = time.time_ns() // 1_000_000
    assert made.version == 7 and made.variant == uuid.RFC_4122
    assert before <= made.int >> 80 <= after


def test_ids_increase_and_differ_past_many_pool_refills() -> None:
    count = ids.RANDOM_POOL  # eight pools' worth of ids
    made = [ids.new_task_id() for _ in range(count)]
    assert made == sorted(made)
    assert len(set(made)) == count
    # The random bits are not a counter: most neighbours differ in more than the last bits.
    far = sum(1 for a, b in itertools.pairwise(made) if (a.int ^ b.int) & RAND_B > 1 << 32)
    assert far > count * 0.9


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_does_not_reuse_its_parents_random_bits() -> None:
    ids.new_task_id()  # the parent has a pool with unused bytes in it
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.write(write, b"".join(ids.new_task_id().bytes for _ in range(4)))
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    data = os.read(read, 64)
    os.close(read)
    theirs = {uuid.UUID(bytes=data[i : i + 16]).int & RAND_B for i in range(0, 64, 16)}
    mine = {ids.new_task_id().int & RAND_B for _ in range(4)}
    assert len(theirs) == 4 and not theirs & mine, "the child drew the parent's random bits"


def test_ids_stay_increasing_when_the_clock_steps_back(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ids.new_task_id()
    now = time.time_ns()
    monkeypatch.setattr(ids.time, "time_ns", lambda: now - 3_600 * 10**9)
    second = ids.new_task_id()
    assert second > first

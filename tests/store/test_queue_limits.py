"""Queue limits changed at run time: an override over QUEUE_LIMITS, set from the command or the
backend, read by workers at their next limited claim, cleared back to the settings; on every
database."""

from __future__ import annotations

import json
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_sqltasks.compat import task_backends
from django_sqltasks.core.bounds import MAX_COUNT
from django_sqltasks.core.limits import Limit, parse_override
from django_sqltasks.models import QueueLimitOverride, TaskLimit
from django_sqltasks.sql import ClaimedRow, dialect_for
from django_sqltasks.worker.limited import LimitedClaim
from tests import tasks_limits, tasks_queue_limits
from tests.conftest import WorkerProcess, set_backend_options
from tests.events import EventLog, Gate
from tests.tasks_limits import intervals, most_at_once
from tests.worker.test_limited import claim, finish, limited_claim, main_claim, make_due

pytestmark = pytest.mark.django_db


def tasks_queue(*args: str) -> str:
    out = StringIO()
    call_command("tasks_queue", *args, stdout=out)
    return out.getvalue()


def override(queue: str = "other", **limits: Any) -> None:
    task_backends["default"].set_queue_limit(queue, **limits)


# Values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("concurrency", "rate", "message"),
    [
        ("0", None, "--concurrency must be at least 1: a queue that runs nothing is paused"),
        (0, None, "--concurrency must be at least 1"),
        ("-1", None, "--concurrency must be a whole number of at least 1"),
        ("1e300", None, "--concurrency must be a whole number of at least 1"),
        (1e300, None, "--concurrency must be a whole number of at least 1"),
        ("2.0", None, "--concurrency must be a whole number"),
        ("abc", None, "--concurrency must be a whole number"),
        ("", None, "--concurrency must be a whole number"),
        ("\x00", None, "--concurrency must be a whole number"),
        ("\ud800", None, "--concurrency must be a whole number"),
        ("\u0661", None, "--concurrency must be a whole number"),  # an Arabic-Indic one
        (str(MAX_COUNT + 1), None, "--concurrency must be a whole number"),
        ("9" * 400, None, "--concurrency must be a whole number .* not '9{40}\\.\\.\\.'"),
        (True, None, "--concurrency must be a whole number"),
        (None, "0/s", "--rate must allow 1 to 10,000 starts a period, not 0"),
        (None, "10001/s", "--rate must allow 1 to 10,000"),
        (None, "9" * 5000 + "/s", "--rate must allow 1 to 10,000 .* not 9{20}\\.\\.\\."),
        (None, "10/d", "--rate must be a string like '10/s'"),
        (None, "-1/s", "--rate must be a string like '10/s'"),
        (None, "1e300/s", "--rate must be a string like '10/s'"),
        (None, "ten/m", "--rate must be a string like '10/s'"),
        (None, "", "--rate must be a string like '10/s'"),
        (None, None, "Give --concurrency, --rate or both"),
    ],
)
def test_bad_overrides_are_refused_naming_the_field_and_rule(
    concurrency: object, rate: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_override(concurrency, rate, fields=("--concurrency", "--rate"))


def test_an_override_reads_digits_and_rates() -> None:
    parse = parse_override
    assert parse(" 7 ", None, fields=("c", "r")) == Limit(concurrency=7)
    assert parse(None, "100/m", fields=("c", "r")) == Limit(rate=100, period=60.0)
    assert parse(3, "5/h", fields=("c", "r")) == Limit(3, 5, 3600.0)


# The backend and the command --------------------------------------------------------------


def test_the_command_sets_shows_and_clears_an_override(settings: Any) -> None:
    set_backend_options(settings, QUEUE_LIMITS={"other": {"concurrency": 5, "rate": "100/m"}})
    assert tasks_queue("limits") == (
        "other:\n  concurrency: 5 (settings)\n  rate: 100/m (settings)\n"
    )
    out = tasks_queue("limit", "other", "--concurrency", "2")
    assert out == (
        "Set the override of queue 'other'.\n"
        "other:\n  concurrency: 2 (override; settings: 5)\n  rate: 100/m (settings)\n"
    )
    out = tasks_queue("limit", "slow", "--rate", "3/s")
    assert "slow:\n  concurrency: none\n  rate: 3/s (override; settings: none)\n" in out
    assert tasks_queue("limit", "other") == (
        "other:\n  concurrency: 2 (override; settings: 5)\n  rate: 100/m (settings)\n"
    )
    assert [q for q in tasks_queue("limits").splitlines() if not q.startswith(" ")] == [
        "other:",
        "slow:",
    ]
    assert tasks_queue("limit", "other", "--clear") == (
        "Cleared the override of queue 'other'.\n"
        "other:\n  concurrency: 5 (settings)\n  rate: 100/m (settings)\n"
    )
    assert tasks_queue("limit", "slow", "--clear").endswith(
        "Queue 'slow' of backend 'default' has no limit.\n"
    )
    assert tasks_queue("limit", "slow", "--clear").startswith("Queue 'slow' had no override.")
    assert not QueueLimitOverride.objects.exists()


def test_setting_again_replaces_the_whole_override() -> None:
    override(concurrency=2, rate="5/s")
    override(concurrency=3)
    row = QueueLimitOverride.objects.get()
    assert (row.queue_name, row.concurrency, row.rate, row.period) == ("other", 3, None, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "--concurrency must be at least 1: a queue that runs nothing"),
        (["--concurrency", "-3"], "--concurrency must be a whole number of at least 1"),
        (["--concurrency", "1e300"], "--concurrency must be a whole number of at least 1"),
        (["--concurrency", "lots"], "--concurrency must be a whole number of at least 1"),
        (["--rate", "5"], "--rate must be a string like '10/s'"),
        (["--rate", "5/fortnight"], "--rate must be a string like '10/s'"),
        (["--rate", "0/m"], "--rate must allow 1 to 10,000 starts a period"),
        (["--clear", "--concurrency", "2"], "--clear takes no --concurrency or --rate"),
    ],
)
def test_the_command_refuses_bad_limits_naming_the_option(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        tasks_queue("limit", "other", *args)
    assert not QueueLimitOverride.objects.exists()


def test_the_command_refuses_an_unknown_queue() -> None:
    with pytest.raises(CommandError, match="'nope' is not a queue of backend 'default'"):
        tasks_queue("limit", "nope", "--concurrency", "2")
    with pytest.raises(CommandError, match="a queue name"):
        tasks_queue("limit", "bad\x00name", "--concurrency", "2")


def test_the_backend_refuses_bad_limits_naming_the_argument() -> None:
    backend = task_backends["default"]
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        backend.set_queue_limit("other", concurrency=0)
    with pytest.raises(ValueError, match="rate must be a string like"):
        backend.set_queue_limit("other", rate=10)
    assert backend.clear_queue_limit("other") is False


# The limited claim ------------------------------------------------------------------------


def test_an_override_holds_from_the_next_limited_claim_and_clearing_restores_the_settings(
    tmp_path: Path,
) -> None:
    log = str(tmp_path / "log")
    for i in range(8):
        tasks_limits.in_other_queue.enqueue(log, f"q{i}")
    make_due()
    worker = limited_claim(queue_limits={"other": Limit(concurrency=1)})
    first = claim(worker)
    assert len(first) == 1
    override(concurrency=3)
    second = one_round(worker, scan=False)  # the round itself reads the override
    assert len(second) == 2
    assert TaskLimit.objects.get(key="queue:other").concurrency == 3  # as last written
    finish(first + second)
    task_backends["default"].clear_queue_limit("other")
    assert len(claim(worker)) == 1
    assert claim(worker) == []


def test_an_override_limits_a_queue_the_settings_do_not(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    capped = [tasks_limits.in_other_queue.enqueue(log, f"q{i}") for i in range(4)]
    free = [tasks_limits.unlimited.enqueue(log, f"u{i}") for i in range(2)]
    make_due()
    worker = limited_claim()
    claim(worker)
    assert worker.excluded == () and not worker.active
    override(concurrency=2)
    assert one_round(worker, scan=False) == [] and worker.excluded == ()
    got = one_round(worker, scan=True)
    assert worker.excluded == ("other",) and worker.active
    assert len(got) == 2 and {str(r.id) for r in got} <= {r.id for r in capped}
    # The main claim leaves the queue to the limited one from now on.
    assert {str(r.id) for r in main_claim(exclude=worker.excluded)} == {r.id for r in free}
    assert claim(worker) == []
    task_backends["default"].clear_queue_limit("other")
    # Until the next scan, a round reads no limit for the queue: nothing holds it back.
    assert len(one_round(worker, scan=False)) == 2
    one_round(worker, scan=True)
    assert worker.excluded == () and not worker.active


def one_round(worker: LimitedClaim, *, scan: bool) -> list[ClaimedRow]:
    """One claim round, after a scan (its own pace made due) or with none."""
    worker._next_scan = 0.0 if scan else float("inf")
    with connection.cursor() as cursor:
        return worker.claim(dialect_for(connection), cursor, 100)


def test_an_override_of_a_rate_keeps_the_settings_concurrency(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    for i in range(6):
        tasks_limits.in_other_queue.enqueue(log, f"q{i}")
    make_due()
    worker = limited_claim(queue_limits={"other": Limit(concurrency=4)})
    override(rate="2/h")
    assert len(claim(worker)) == 2  # the rate's two, under the settings' four
    row = TaskLimit.objects.get(key="queue:other")
    assert (row.concurrency, row.rate, row.period) == (4, 2, 3600.0)


def test_a_worker_ignores_overrides_of_queues_it_does_not_serve(tmp_path: Path) -> None:
    override(queue="slow", concurrency=1)
    worker = LimitedClaim(
        backend_name="default",
        database="default",
        worker_id="w1",
        queue_names=["default"],
        queue_limits={},
    )
    one_round(worker, scan=True)
    assert worker.excluded == () and not worker.active


def test_no_limit_and_no_override_costs_the_claim_nothing(
    tmp_path: Path, django_assert_num_queries: Any
) -> None:
    tasks_limits.unlimited.enqueue(str(tmp_path / "log"), "u")
    worker = LimitedClaim(
        backend_name="default", database="default", worker_id="w", queue_names=None, queue_limits={}
    )
    # A scan (every DISCOVER_EVERY seconds): the limit keys of READY tasks and the overrides.
    # With no key READY, nothing enqueued since is read: the next scan finds any new key.
    with django_assert_num_queries(2), connection.cursor() as cursor:
        worker.scan(dialect_for(connection), cursor, force=True)
    assert not worker.active
    # Between scans a claim with no limit reads nothing.
    with django_assert_num_queries(0):
        assert one_round(worker, scan=False) == []


# Worker processes -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process
def test_two_workers_take_an_override_at_their_next_claim_and_the_settings_after_it(
    worker_process: Callable[..., WorkerProcess], events: EventLog, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    env = {"SQLTASKS_QUEUE_LIMITS": json.dumps({"other": {"concurrency": 1}})}
    workers = [worker_process("--concurrency", "4", "--queue", "*", env=env) for _ in range(2)]
    events.wait("worker_started", count=2)
    override(concurrency=3)
    gate = Gate(str(tmp_path / "gate"))
    try:
        for i in range(4):
            tasks_queue_limits.gated.enqueue(str(log), f"g{i}", gate.path)
        # Three at once, where the settings allow one: the override holds.
        events.wait("note", what="start", count=3)
        task_backends["default"].clear_queue_limit("other")
        gate.open()
        events.wait("task_finished", count=4)
    finally:
        gate.close()
    for i in range(4):
        tasks_limits.in_other_queue.enqueue(str(log), f"c{i}", 0.05)
    events.wait("task_finished", count=8)
    for worker in workers:
        worker.stop()
    spans = intervals(log)
    assert most_at_once([s for s in spans if s[2].startswith("g")]) == 3
    assert most_at_once([s for s in spans if s[2].startswith("c")]) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker_process_core  # limits shared by workers are enforced per database
def test_two_workers_limit_a_queue_the_settings_do_not_once_it_is_overridden(
    worker_process: Callable[..., WorkerProcess], events: EventLog, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    workers = [worker_process("--concurrency", "4", "--queue", "*") for _ in range(2)]
    events.wait("worker_started", count=2)
    mark = events.mark()
    override(concurrency=2)
    # Each worker finds the override at its next scan, and says so.
    events.wait("limited_queues", queues=["other"], count=2, after=mark)
    for i in range(8):
        tasks_limits.in_other_queue.enqueue(str(log), f"q{i}", 0.05)
    events.wait("task_finished", count=8)
    mark = events.mark()
    task_backends["default"].clear_queue_limit("other")
    events.wait("limited_queues", queues=[], count=2, after=mark)
    for worker in workers:
        worker.stop()
    assert most_at_once(intervals(log)) <= 2

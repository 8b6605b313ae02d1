"""The options of ``tasks_worker``: each checked as it is parsed, with an error naming the option
and the rule (``arguments.py`` holds the checks the other commands share)."""

from __future__ import annotations

import argparse

from django.core.management.base import CommandParser

from ..compat import DEFAULT_TASK_BACKEND_ALIAS
from ..core.bounds import MAX_INTERVAL
from .arguments import (
    MAX_NAME_LENGTH,
    backend_alias,
    log_level,
    megabytes,
    non_negative_seconds,
    positive_int,
    positive_seconds,
    queue_names,
    seconds_at_least,
    text,
    whole_number,
)
from .help import HelpFormatter

DEFAULT_CONCURRENCY = 10
# Ceilings that catch a typo (an extra zero or three) before it becomes thousands of threads
# or a claim that locks a whole table; far above what one process can use.
MAX_CONCURRENCY = 1000
MAX_PREFETCH = 10_000
MIN_POLL_INTERVAL = 0.01  # seconds: below this an idle worker commits a claim per few ms
DEFAULT_METRICS_HOST = "127.0.0.1"  # metrics name queues and tasks: not for other machines
MAX_PROCESSES = 256  # a typo's ceiling: far above the cores of one machine
# A supervisor's children are named after it: its id, a dash, and a number.
MAX_SUPERVISOR_ID_LENGTH = MAX_NAME_LENGTH - 8

EXAMPLES = """\
examples:
  manage.py tasks_worker                            the backend's QUEUES (or 'default'), 10 at once
  manage.py tasks_worker -Q emails,reports -c 50    two queues, up to 50 tasks at once
  manage.py tasks_worker -Q '*' --burst             every queue until nothing is due, then exit
  manage.py tasks_worker -Q '*' -X bulk             every queue of QUEUES but 'bulk'
  manage.py tasks_worker -l info                    also log each task's start and end
  manage.py tasks_worker --wait-for-database 60     start before the database is up (containers)

Stop with SIGTERM or Ctrl-C: unstarted tasks go back to the queue and running ones finish;
a second signal puts the running ones back too and exits at once.
"""


def port(value: str) -> int:
    number = positive_int(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 1 to 65535, not {number}")
    return number


def worker_id(value: str) -> str:
    return text(value, "a worker id", most=MAX_NAME_LENGTH)


def host(value: str) -> str:
    return text(value, most=255)


def health_file(value: str) -> str:
    return text(value, "a path", most=4096)


def supervisor_link(value: str) -> tuple[int, int, int | None]:
    """The hidden ``--supervisor FD,PID[,WAKE_FD]`` a supervisor gives its children: its pipe,
    its pid, and the socket through which it wakes them if it listens for them."""
    try:
        numbers = [int(part) for part in value.split(",")]
        if len(numbers) not in (2, 3):
            raise ValueError(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be FD,PID[,WAKE_FD], not {value!a}") from e
    return numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else None


def add_worker_arguments(parser: CommandParser) -> None:
    parser.formatter_class = HelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument(
        "-Q",
        "--queue",
        "--queues",
        dest="queues",
        action="append",
        type=queue_names,
        metavar="NAME[,NAME...]",
        help="Queues to run tasks from: comma-separated or repeated, '*' for all (default: "
        "the backend's QUEUES, or 'default'). With QUEUES set, other names are refused.",
    )
    parser.add_argument(
        "-X",
        "--exclude-queues",
        dest="exclude_queues",
        action="append",
        type=queue_names,
        metavar="NAME[,NAME...]",
        help="Run every queue of the backend's QUEUES but these (comma-separated or "
        "repeated), as Celery's -X; with -Q '*' or no -Q only.",
    )
    parser.add_argument(
        "-c",
        "--concurrency",
        type=whole_number(1, MAX_CONCURRENCY),
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help=f"Tasks run at once in this process, 1 to {MAX_CONCURRENCY} "
        f"(default: {DEFAULT_CONCURRENCY}).",
    )
    parser.add_argument(
        "--prefetch",
        type=whole_number(0, MAX_PREFETCH),
        metavar="N",
        help="Tasks claimed beyond the free slots, started as soon as a slot frees up, "
        f"0 to {MAX_PREFETCH} (default: a quarter of --concurrency; 0 for long tasks "
        "shared by several workers).",
    )
    parser.add_argument(
        "--burst",
        action="store_true",
        help="Exit once no task is due and none is running. A task waiting out a retry's "
        "backoff or deferred with run_after is not due: it stays READY for the next worker.",
    )
    parser.add_argument(
        "--max-tasks",
        type=positive_int,
        metavar="N",
        help="Exit after claiming this many tasks and finishing them (default: no limit).",
    )
    parser.add_argument(
        "--backend",
        type=backend_alias,
        default=DEFAULT_TASK_BACKEND_ALIAS,
        metavar="ALIAS",
        help="The TASKS alias whose tasks to run (default: 'default').",
    )
    parser.add_argument(
        "--worker-id",
        type=worker_id,
        metavar="ID",
        help=f"A unique id for this worker, up to {MAX_NAME_LENGTH} characters "
        "(default: hostname and a random suffix).",
    )
    parser.add_argument(
        "--poll-interval",
        type=seconds_at_least(MIN_POLL_INTERVAL, MAX_INTERVAL),
        metavar="S",
        help=f"Seconds between claims when idle, {MIN_POLL_INTERVAL:g} to {MAX_INTERVAL:g} "
        "(default: the POLL_INTERVAL option, 1).",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=positive_seconds,
        metavar="S",
        help="On stop, seconds to wait for running tasks before requeueing them "
        "(default: wait for them).",
    )
    parser.add_argument(
        "--wait-for-database",
        type=non_negative_seconds,
        default=0.0,
        metavar="S",
        help="If the database cannot be reached at start, keep trying for this many "
        "seconds, with backoff (default: 0, fail at once).",
    )
    parser.add_argument(
        "-l",
        "--loglevel",
        type=log_level,
        metavar="LEVEL",
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL, for the worker's log and Django's "
        "task log (default: from -v: 0 WARNING, 1 INFO, 2 DEBUG).",
    )
    parser.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="Serve Prometheus metrics on this port at /metrics (needs prometheus-client, "
        "the 'metrics' extra; default: off).",
    )
    parser.add_argument(
        "--metrics-host",
        type=host,
        default=DEFAULT_METRICS_HOST,
        metavar="HOST",
        help=f"The address --metrics-port listens on (default: {DEFAULT_METRICS_HOST}, this "
        "machine only; 0.0.0.0 for every interface).",
    )
    parser.add_argument(
        "--health-file",
        type=health_file,
        metavar="PATH",
        help="Touch this file at each heartbeat while the worker makes progress (with "
        "--processes: while every worker process does), for a liveness probe that checks "
        "its age (default: none).",
    )
    parser.add_argument(
        "-p",
        "--processes",
        type=whole_number(1, MAX_PROCESSES),
        metavar="N",
        help="Run N worker processes under a supervisor that restarts them, renews their "
        "leases, and stops sync tasks at their timeout by replacing their process "
        f"(1 to {MAX_PROCESSES}; default: one process, no supervisor).",
    )
    parser.add_argument(
        "--max-tasks-per-child",
        type=positive_int,
        metavar="N",
        help="With --processes: replace a worker process after it has claimed N tasks "
        "(the replacement starts first; default: no limit).",
    )
    parser.add_argument(
        "--max-memory-per-child",
        type=megabytes,
        metavar="SIZE",
        help="With --processes: replace a worker process whose resident memory exceeds "
        "this size, checked every second: 512 or 512MB (MiB; Celery's option counts KiB), "
        "200000KiB, 2GiB (Linux; default: no limit).",
    )
    parser.add_argument("--supervisor", type=supervisor_link, help=argparse.SUPPRESS)

"""The statements' own timing, where the server keeps no statistics of them: MariaDB's
performance_schema is off by default (and on the shared server here), and SQLite has none.

A worker and the enqueuer of the ``mixed`` profile on MariaDB or SQLite get ``TIMING_ENV``
(the harness's UDP port, then the kinds: a JSON list of [kind, [substrings]]); each statement
Django runs whose text holds every substring of a kind is timed around the driver's call and
reported in one datagram (``app.STATEMENT_EVENT``: the kind's index, its seconds). The first
kind that matches wins. The benchmark project's AppConfig installs it at start.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from benchmarks.mixed import app

TIMING_ENV = "BENCH_MIXED_TIMING"

Kinds = list[tuple[str, list[str]]]


def env_value(port: int, kinds: Kinds) -> str:
    """What ``TIMING_ENV`` holds for a process that reports to ``port``."""
    return json.dumps({"port": port, "kinds": kinds})


class StatementTimer:
    """A Django execute wrapper that reports the statements of the kinds it was given."""

    def __init__(self, port: int, kinds: Kinds) -> None:
        self.address = ("127.0.0.1", port)
        self.kinds = kinds
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def kind(self, sql: str) -> int | None:
        for index, (_name, parts) in enumerate(self.kinds):
            if all(part in sql for part in parts):
                return index
        return None

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        index = self.kind(sql)
        if index is None:
            return execute(sql, params, many, context)
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - started
            self.socket.sendto(app.STATEMENT_EVENT.pack(index, took), self.address)


def install_from_env() -> None:
    """Time every connection's statements from now on, if ``TIMING_ENV`` says where to report."""
    value = os.environ.get(TIMING_ENV)
    if not value:
        return
    from django.db import connections
    from django.db.backends.signals import connection_created

    config = json.loads(value)
    timer = StatementTimer(int(config["port"]), [(k, list(p)) for k, p in config["kinds"]])

    def created(sender: Any, connection: Any, **kwargs: Any) -> None:
        if timer not in connection.execute_wrappers:
            connection.execute_wrappers.append(timer)

    connection_created.connect(created, weak=False, dispatch_uid="bench-mixed-timing")
    for connection in connections.all(initialized_only=True):
        created(None, connection)

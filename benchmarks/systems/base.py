"""What the harness needs to know about one system under test."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

REPO_ROOT = Path(__file__).resolve().parents[2]
SETTINGS_MODULE = "benchmarks.projects.settings"
CORE_PATH_ENV = "BENCH_CORE_PATH"
# Subprocesses start outside the checkout: a checkout on sys.path[0] would shadow the snapshot.
SUBPROCESS_CWD = Path(tempfile.gettempdir())

# How the enqueue side talks to the system: Django Tasks' ``aenqueue``, Celery's ``delay``
# through ``sync_to_async``, the plain psycopg loop, or a bare-SQL floor's one statement.
EnqueueKind = Literal["django-tasks", "celery", "raw-sql", "sql-floor"]
Service = Literal["postgresql", "mariadb", "redis"]


DEFAULT_ADDRESSES: dict[Service, tuple[str, int]] = {
    "postgresql": (os.environ.get("BENCH_PG_HOST", "127.0.0.1"), 5432),
    "mariadb": (os.environ.get("BENCH_MARIADB_HOST", "127.0.0.1"), 3306),
    "redis": (os.environ.get("BENCH_REDIS_HOST", "127.0.0.1"), 6379),
}
_ENV_NAMES: dict[Service, str] = {"postgresql": "PG", "mariadb": "MARIADB", "redis": "REDIS"}


@dataclass(frozen=True)
class Endpoints:
    """Where clients and workers reach each service; the delay proxies under ``--rtt``."""

    addresses: dict[Service, tuple[str, int]] = field(
        default_factory=lambda: dict(DEFAULT_ADDRESSES)
    )
    state_dir: str = "/tmp/django-sqltasks-bench"

    def host(self, service: Service) -> str:
        return self.addresses[service][0]

    def port(self, service: Service) -> int:
        return self.addresses[service][1]

    def as_env(self) -> dict[str, str]:
        env = {"BENCH_STATE_DIR": self.state_dir}
        for service, (host, port) in self.addresses.items():
            env[f"BENCH_{_ENV_NAMES[service]}_ADDR"] = f"{host}:{port}"
        return env

    @classmethod
    def from_env(cls) -> Endpoints:
        addresses = dict(DEFAULT_ADDRESSES)
        for service, key in _ENV_NAMES.items():
            if value := os.environ.get(f"BENCH_{key}_ADDR"):
                host, _, port = value.rpartition(":")
                addresses[service] = (host, int(port))
        return cls(addresses, os.environ.get("BENCH_STATE_DIR", "/tmp/django-sqltasks-bench"))


@dataclass(frozen=True)
class System:
    """One row of the comparison: a task system configured as its users would configure it."""

    name: str
    label: str
    # The package whose version the report shows.
    package: str
    enqueue_kind: EnqueueKind
    # Whether the Sleep task is ``async def`` + ``asyncio.sleep`` (True) or ``time.sleep`` (False).
    async_sleep: bool
    # Services the worker talks to; its connections to these ports are counted.
    services: tuple[Service, ...]
    # Worker command line, given the concurrency.
    worker_argv: Callable[[int], list[str]]
    # Django settings for this system, given the endpoints (empty for raw-sql).
    django_settings: Callable[[Endpoints], dict[str, Any]]
    # Connects ``hit`` to the worker-side "task finished" hook of the system.
    connect_completion: Callable[[Callable[[], None]], None]
    # Concurrency the worker really runs at (1 for single-threaded workers).
    effective_concurrency: Callable[[int], int] = lambda c: c
    # Some peers publish their figures on fewer tasks (RQ: 500); None means use -n.
    max_tasks: int | None = None
    redis_db: int | None = None
    # The database the system keeps its tables in, created if missing and flushed per run.
    database: tuple[str, str] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    supports_http: bool = True
    # Whether the backend has a bulk enqueue (``enqueue_many`` / ``aenqueue_many``).
    supports_bulk: bool = False
    # The only scenarios it runs (the bare-SQL floor: latency); None for every one it supports.
    only_scenarios: tuple[str, ...] | None = None
    # A bare-SQL system's module (enqueue kind "sql-floor"): its schema, reset and enqueue.
    sql_module: str = "benchmarks.floor"

    def runs(self, scenario: str) -> bool:
        """Whether the scenario applies to this system at all."""
        if self.only_scenarios is not None and scenario not in self.only_scenarios:
            return False
        return (scenario != "http" or self.supports_http) and (
            scenario != "bulk" or self.supports_bulk
        )

    def tasks_for(self, n: int) -> int:
        return min(n, self.max_tasks) if self.max_tasks else n


def django_env(system: System, endpoints: Endpoints) -> dict[str, str]:
    """Environment for any subprocess that runs with the system's Django settings."""
    env = dict(os.environ)
    env.update(endpoints.as_env())
    env["BENCH_SYSTEM"] = system.name
    env["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    # A snapshot of django_sqltasks (see benchmarks.snapshot) shadows the working tree's.
    paths = (os.environ.get(CORE_PATH_ENV, ""), str(REPO_ROOT), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("BENCH_MARKER_ADDR", None)
    return env


def manage(system: System, endpoints: Endpoints, *args: str) -> None:
    """Run ``django-admin <args>`` with the system's settings and fail loudly."""
    proc = subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=django_env(system, endpoints),
        cwd=SUBPROCESS_CWD,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{system.name}: django-admin {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
        )


def python_m(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


# Django's LOGGING for every system: "default" leaves it unset, as a new project has it (the
# "django" logger at INFO, its console handler only with DEBUG); "quiet" puts every logger at
# WARNING. The headline figures use the default: what users get.
LOGGING_ENV = "BENCH_LOGGING"
LOGGING_PROFILES = ("default", "quiet")
QUIET_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"django": {"level": "WARNING"}},
}


def common_settings(endpoints: Endpoints) -> dict[str, Any]:
    """Settings every Django-based system shares: same logging, no DEBUG, same connection reuse."""
    settings: dict[str, Any] = {
        "SECRET_KEY": "benchmarks-only",
        "DEBUG": False,
        "ALLOWED_HOSTS": ["*"],
        "USE_TZ": True,
        "ROOT_URLCONF": "benchmarks.projects.urls",
        "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
        "DATABASES": {"default": sqlite_database(endpoints, "unused")},
    }
    if os.environ.get(LOGGING_ENV) == "quiet":
        settings["LOGGING"] = QUIET_LOGGING
    return settings


def conn_max_age() -> int:
    """Persistent connections (60 s) in workers and agents; the web server sets 0 via the env."""
    return int(os.environ.get("BENCH_CONN_MAX_AGE", "60"))


# A run's own suffix for the databases it creates (set by ``run`` for every subprocess), so two
# runs on one server never share a database, and each drops its own at the end.
RUN_ENV = "BENCH_RUN"


def start_run() -> str:
    """Give this process and its subprocesses a suffix of their own for their databases (the
    time, and random digits for runs started in the same second on other machines)."""
    suffix = f"{time.strftime('%Y%m%dt%H%M%S', time.gmtime())}_{secrets.token_hex(2)}"
    os.environ[RUN_ENV] = suffix
    return suffix


def database_name(name: str) -> str:
    """``name`` with the run's suffix, where a run has set one."""
    run = os.environ.get(RUN_ENV)
    return f"{name}_{run}" if run else name


def postgres_name(name: str) -> str:
    """The PostgreSQL database a system uses: its own, or ``BENCH_PG_DATABASE`` for every
    system (one database of one's own on a server others use too)."""
    return os.environ.get("BENCH_PG_DATABASE") or database_name(name)


def mariadb_name(name: str) -> str:
    """The MariaDB database a system uses: its own, or ``BENCH_MARIADB_DATABASE`` for every
    system, as for PostgreSQL."""
    return os.environ.get("BENCH_MARIADB_DATABASE") or database_name(name)


def postgres_database(endpoints: Endpoints, name: str) -> dict[str, Any]:
    database: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": postgres_name(name),
        "USER": os.environ.get("BENCH_PG_USER", "postgres"),
        "PASSWORD": os.environ.get("BENCH_PG_PASSWORD", ""),
        "HOST": endpoints.host("postgresql"),
        "PORT": endpoints.port("postgresql"),
        "CONN_MAX_AGE": conn_max_age(),
    }
    # psycopg's prepared statements (docs/databases.md), where BENCH_PG_PREPARE_THRESHOLD
    # says; Django's default leaves them off.
    threshold = os.environ.get("BENCH_PG_PREPARE_THRESHOLD")
    if threshold:
        database["OPTIONS"] = {"prepare_threshold": int(threshold)}
    return database


def mariadb_database(endpoints: Endpoints, name: str) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": mariadb_name(name),
        "USER": os.environ.get("BENCH_MARIADB_USER", "root"),
        "PASSWORD": os.environ.get("BENCH_MARIADB_PASSWORD", ""),
        "HOST": endpoints.host("mariadb"),
        "PORT": endpoints.port("mariadb"),
        "CONN_MAX_AGE": conn_max_age(),
    }


def sqlite_database(endpoints: Endpoints, name: str) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(Path(endpoints.state_dir) / f"{name}.sqlite3"),
        "CONN_MAX_AGE": conn_max_age(),
    }


def redis_url(endpoints: Endpoints, db: int) -> str:
    return f"redis://{endpoints.host('redis')}:{endpoints.port('redis')}/{db}"

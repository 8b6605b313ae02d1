"""Create, migrate and reset the databases and Redis/Valkey db each system uses."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import psycopg
import redis

from benchmarks.systems.base import Endpoints, System, manage, mariadb_name, postgres_name

# The databases this process created, (service, name): ``drop_created`` drops them.
_created: list[tuple[str, str]] = []


def create_database(endpoints: Endpoints, service: str, name: str) -> None:
    """Create database ``name`` (with the run's suffix) on PostgreSQL or MariaDB if it does
    not exist."""
    if service == "postgresql":
        name = postgres_name(name)
        with _postgres(endpoints) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')
                _created.append((service, name))
    elif service == "mariadb":
        name = mariadb_name(name)
        conn = _mariadb(endpoints)
        try:
            if conn.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4"
            ):
                _created.append((service, name))
        finally:
            conn.close()


def drop_created(endpoints: Endpoints) -> list[str]:
    """Drop every database ``create_database`` created in this process; return their names."""
    dropped = []
    while _created:
        service, name = _created.pop()
        if service == "postgresql":
            with _postgres(endpoints) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            conn = _mariadb(endpoints)
            try:
                conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
            finally:
                conn.close()
        dropped.append(name)
    return dropped


def _postgres(endpoints: Endpoints) -> psycopg.Connection[tuple[Any, ...]]:
    from benchmarks.rawsql import server_conninfo

    return psycopg.connect(**server_conninfo(endpoints), autocommit=True)


def _mariadb(endpoints: Endpoints) -> Any:
    import MySQLdb

    return MySQLdb.connect(
        host=endpoints.host("mariadb"),
        port=endpoints.port("mariadb"),
        user=os.environ.get("BENCH_MARIADB_USER", "root"),
        password=os.environ.get("BENCH_MARIADB_PASSWORD", ""),
    )


def flush_redis(endpoints: Endpoints, db: int) -> None:
    client = redis.Redis(host=endpoints.host("redis"), port=endpoints.port("redis"), db=db)
    try:
        client.flushdb()
    finally:
        client.close()


def prepare(system: System, endpoints: Endpoints) -> None:
    """Make the system's database exist and be migrated; called once per invocation."""
    Path(endpoints.state_dir).mkdir(parents=True, exist_ok=True)
    if system.enqueue_kind == "raw-sql":
        from benchmarks import rawsql

        rawsql.create_schema(endpoints)
        return
    if system.enqueue_kind == "sql-floor":
        # Only the floor's runs need its module.
        importlib.import_module(system.sql_module).create_schema(endpoints)
        return
    if system.database is not None:
        create_database(endpoints, *system.database)
    manage(system, endpoints, "migrate", "--noinput", "-v", "0")


def reset(system: System, endpoints: Endpoints) -> None:
    """Empty every table and Redis db the system uses, so each run starts from nothing."""
    if system.enqueue_kind == "raw-sql":
        from benchmarks import rawsql

        rawsql.truncate(endpoints)
        return
    if system.enqueue_kind == "sql-floor":
        # Only the floor's runs need its module.
        importlib.import_module(system.sql_module).truncate(endpoints)
        return
    if system.database is not None:
        manage(system, endpoints, "flush", "--noinput", "-v", "0")
    if system.redis_db is not None:
        flush_redis(endpoints, system.redis_db)

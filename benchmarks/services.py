"""Create, migrate and reset the databases and Redis/Valkey db each system uses."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import psycopg
import redis

from benchmarks.systems.base import Endpoints, System, manage, postgres_name


def create_database(endpoints: Endpoints, service: str, name: str) -> None:
    """Create database ``name`` on PostgreSQL or MariaDB if it does not exist."""
    if service == "postgresql":
        name = postgres_name(name)
        with psycopg.connect(
            host=endpoints.host("postgresql"),
            port=endpoints.port("postgresql"),
            user=os.environ.get("BENCH_PG_USER", "postgres"),
            password=os.environ.get("BENCH_PG_PASSWORD", ""),
            dbname="postgres",
            autocommit=True,
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')
    elif service == "mariadb":
        import MySQLdb

        conn = MySQLdb.connect(
            host=endpoints.host("mariadb"),
            port=endpoints.port("mariadb"),
            user=os.environ.get("BENCH_MARIADB_USER", "root"),
            password=os.environ.get("BENCH_MARIADB_PASSWORD", ""),
        )
        try:
            conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()


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

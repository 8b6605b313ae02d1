"""What the report states first: the machine, the versions, the services."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

import psutil
import psycopg
import redis

from benchmarks.systems.base import Endpoints

PACKAGES = (
    "django",
    "django-sqltasks",
    "django-vtasks",
    "django-vcache",
    "celery",
    "redis",
    "rq",
    "django-rq",
    "django-tasks-rq",
    "django-tasks",
    "django-tasks-db",
    "psycopg",
    "mysqlclient",
    "uvicorn",
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _service_versions(endpoints: Endpoints) -> dict[str, str]:
    from benchmarks.rawsql import server_conninfo

    versions: dict[str, str] = {}
    try:
        with psycopg.connect(**server_conninfo(endpoints)) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            versions["PostgreSQL"] = str(row[0]) if row else "?"
    except psycopg.Error as e:
        versions["PostgreSQL"] = f"unavailable ({e.__class__.__name__})"
    try:
        import MySQLdb

        conn = MySQLdb.connect(
            host=endpoints.host("mariadb"), port=endpoints.port("mariadb"), user="root", password=""
        )
        cursor = conn.cursor()
        cursor.execute("SELECT VERSION()")
        versions["MariaDB"] = str(cursor.fetchone()[0])
        conn.close()
    except Exception as e:
        versions["MariaDB"] = f"unavailable ({e.__class__.__name__})"
    try:
        info = redis.Redis(host=endpoints.host("redis"), port=endpoints.port("redis")).info(
            "server"
        )
        name = "Valkey" if "valkey_version" in info else "Redis"
        versions[name] = str(info.get("valkey_version") or info["redis_version"])
    except redis.RedisError as e:
        versions["Redis"] = f"unavailable ({e.__class__.__name__})"
    import sqlite3

    versions["SQLite"] = sqlite3.sqlite_version
    return versions


def describe(endpoints: Endpoints) -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in PACKAGES},
        "services": _service_versions(endpoints),
    }

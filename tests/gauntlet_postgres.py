"""A private PostgreSQL server to restart at will, so no one else's connections are hurt."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any


def find_bindir() -> Path | None:
    """The newest PostgreSQL server binaries on this machine, or ``None``."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """``initdb`` in a temporary directory, then ``pg_ctl`` start/restart/stop on a free port.

    initdb refuses to run as root; as root, the server runs as the ``postgres`` user.
    """

    def __init__(self, bindir: Path, database: str = "sqltasks") -> None:
        self.bindir = bindir
        self.database = database
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sqltasks-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *args: str, timeout: float = 120) -> None:
        subprocess.run(
            [*self.as_user, *args],
            check=True,
            capture_output=True,
            timeout=timeout,
            cwd=self.dir,
        )

    def init(self) -> PrivatePostgres:
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        self.start()
        self._run(
            str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
            "-U", "postgres", self.database,
        )  # fmt: skip
        return self

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
            "-o", options, "-w", "-t", "60", action, *extra,
        )  # fmt: skip

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """Stop (fast: connections are dropped, transactions rolled back) and start again."""
        self._ctl("restart", "-m", "fast")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql``, run on a connection of its own."""
        import psycopg

        with psycopg.connect(self.url) as connection:
            return connection.execute(sql).fetchall()

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._ctl("stop", "-m", "immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

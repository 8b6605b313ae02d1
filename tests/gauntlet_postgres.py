"""A private PostgreSQL server to restart at will, so no one else's connections are hurt.

The fault tests restart it under running workers; the failover tests make a streaming standby of
it (``standby``), promote that and kill this one; scripts/soak.py and scripts/long_life.py run
their long loads on it; the ``mixed`` benchmark profile (benchmarks/mixed/) gives it autovacuum
at its defaults and pg_stat_statements. One server per ``PrivatePostgres``: ``initdb`` in a
temporary directory, ``pg_ctl`` start/restart/stop on a free port, the directory removed at the
stop. As a context manager it stops (and removes) the server however the block ends, Ctrl-C
included; pg_ctl starts the server in a session of its own, so the terminal's Ctrl-C reaches only
the program that started it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

# What the fault tests, the soak and the long-life script have always run with: a server that
# loses its data on a crash of the machine, which none of them needs.
DEFAULT_SETTINGS: Mapping[str, str] = {"fsync": "off"}
RUN_AS = "postgres"  # the unprivileged user the server runs as when this process is root


def find_bindir(version: int | None = None) -> Path | None:
    """The server binaries of PostgreSQL ``version`` (or the newest) on this machine, or None."""
    pattern = f"/usr/lib/postgresql/{version or '*'}/bin"
    for candidate in sorted(glob.glob(pattern), key=_major, reverse=True):
        if (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None or version is not None:
        return None
    return Path(pg_ctl).parent


def _major(bindir: str) -> int:
    part = Path(bindir).parent.name
    return int(part) if part.isdigit() else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_user(name: str = RUN_AS) -> None:
    """Create the system user ``name`` (no home, no shell) if this machine has none."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )


class PrivatePostgres:
    """``initdb`` in a temporary directory, then ``pg_ctl`` start/restart/stop on a free port.

    ``settings`` are written to the server's postgresql.conf after initdb (default: fsync off);
    every other setting is initdb's default, autovacuum on included. initdb refuses to run as
    root; as root, the server runs as the ``postgres`` user, created if missing.
    """

    def __init__(
        self,
        bindir: Path,
        database: str = "sqltasks",
        settings: Mapping[str, str] = DEFAULT_SETTINGS,
    ) -> None:
        self.bindir = bindir
        self.database = database
        self.settings = dict(settings)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sqltasks-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            ensure_user(RUN_AS)
            self.as_user = ["runuser", "-u", RUN_AS, "--"]
            shutil.chown(self.dir, RUN_AS, RUN_AS)

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
        """Create the cluster, start it and create ``database``; on a failure, remove it all."""
        try:
            self._run(
                str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                "--auth=trust", "--no-sync", "-E", "UTF8",
            )  # fmt: skip
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write("\n# PrivatePostgres\n")
                for name, value in self.settings.items():
                    quoted = value.replace("'", "''")
                    conf.write(f"{name} = '{quoted}'\n")
            self.start()
            self._run(
                str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                "-U", "postgres", self.database,
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
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

    def reconfigure(self, name: str, value: str) -> None:
        """``ALTER SYSTEM SET name = value``, then reload the configuration."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url, autocommit=True) as connection:
            statement = sql.SQL("ALTER SYSTEM SET {} = {}").format(
                sql.Identifier(name), sql.Literal(value)
            )
            connection.execute(statement)
            connection.execute("SELECT pg_reload_conf()")

    def postmaster_pid(self) -> int | None:
        """The server's main process, from its postmaster.pid; None when it is not running."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().split()[0])
        return None

    def standby(self, settings: Mapping[str, str] | None = None) -> PrivatePostgres:
        """A streaming standby of this running server: ``pg_basebackup -R`` of it, started on
        a port of its own, with ``settings`` appended to the copied postgresql.conf. On a
        failure, the standby is removed."""
        standby = PrivatePostgres(self.bindir, self.database, self.settings)
        try:
            standby._run(
                str(self.bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.port),
                "-U", "postgres", "-D", str(standby.data), "-R", "-X", "stream",
                "--no-sync", "-c", "fast",
            )  # fmt: skip
            with (standby.data / "postgresql.conf").open("a") as conf:
                conf.write("\n# PrivatePostgres standby\n")
                for name, value in (settings or {}).items():
                    quoted = value.replace("'", "''")
                    conf.write(f"{name} = '{quoted}'\n")
            standby.start()
        except BaseException:
            standby.stop()
            raise
        return standby

    def promote(self) -> None:
        """Promote this standby to a primary, and wait until it takes writes."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def kill(self) -> None:
        """SIGKILL the server and every process of it at once, as a crash of its machine's
        PostgreSQL would: no shutdown, no last WAL sent to a standby. (The kernel still closes
        the clients' sockets, which a machine that vanished from the network would not.)"""
        pid = self.postmaster_pid()
        if pid is not None:
            # pg_ctl starts the server in a session of its own: its group is all of it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop the server at once (no checkpoint: nothing is kept) and remove its directory."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._ctl("stop", "-m", "immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        return self.init()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

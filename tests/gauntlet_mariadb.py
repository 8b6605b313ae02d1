"""A private MariaDB server to restart at will, so no one else's connections are hurt: the
MariaDB twin of ``tests.gauntlet_postgres``."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.gauntlet_postgres import free_port

START_TIMEOUT = 60.0  # seconds for a started server to answer


def find_mariadbd() -> tuple[Path, Path] | None:
    """The MariaDB server and its ``mariadb-install-db`` on this machine, or ``None``."""
    server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/libexec")
    install = shutil.which("mariadb-install-db")
    return (Path(server), Path(install)) if server and install else None


class PrivateMariaDB:
    """``mariadb-install-db`` in a temporary directory, then the server on a free port,
    stopped (SIGTERM: a shutdown that ends every session) and started again at will. As root,
    the server runs as the ``mysql`` user."""

    def __init__(self, binaries: tuple[Path, Path], database: str = "sqltasks") -> None:
        self.server, self.install = binaries
        self.database = database
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sqltasks-maria-"))
        self.data = self.dir / "data"
        self.user: list[str] = []
        if os.geteuid() == 0:
            self.user = ["--user=mysql"]
            shutil.chown(self.dir, "mysql", "mysql")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{self.database}"

    def init(self) -> PrivateMariaDB:
        subprocess.run(
            [str(self.install), "--no-defaults", *self.user, f"--datadir={self.data}",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        self.start()
        self.query(f"CREATE DATABASE {self.database} CHARACTER SET utf8mb4", database="mysql")
        return self

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(self.server), "--no-defaults", *self.user, f"--datadir={self.data}",
             f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.dir}/sock",
             f"--pid-file={self.dir}/pid", f"--log-error={self.dir}/error.log",
             "--skip-log-bin", "--innodb-flush-log-at-trx-commit=0"],
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.query("SELECT 1", database="mysql")
                return
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
            time.sleep(0.1)  # setup, not a test's wait: the server is not up yet

    def restart(self) -> None:
        """Shut the server down (every session ended, transactions rolled back) and start it
        again."""
        assert self.process is not None
        self.process.terminate()
        self.process.wait(timeout=120)
        self.start()

    def query(self, sql: str, *, database: str | None = None) -> list[tuple[Any, ...]]:
        import MySQLdb

        connection = MySQLdb.connect(
            host="127.0.0.1", port=self.port, user="root", database=database or self.database
        )
        try:
            cursor = connection.cursor()
            cursor.execute(sql)
            rows = list(cursor.fetchall())
            connection.commit()
            return rows
        finally:
            connection.close()

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.kill()
            self.process.wait(timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)

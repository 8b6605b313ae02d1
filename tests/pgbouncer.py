"""A private PgBouncer in transaction pooling mode in front of the test's PostgreSQL server, on a
free port, with its own configuration in a temporary directory (tests/worker/test_pooler.py,
scripts/pooler_latency.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.gauntlet_postgres import free_port

READY_LINE = "process up:"  # what PgBouncer logs once it accepts connections
START_TIMEOUT = 30.0  # seconds for PgBouncer to say it is up
POOL_SIZE = 20  # server connections per database and user
MAX_CLIENTS = 500  # client connections it accepts


def find_pgbouncer() -> str | None:
    """The pgbouncer binary (Debian's package puts it in /usr/sbin), or ``None``."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


class PgBouncer:
    """``pgbouncer`` in transaction mode, forwarding every database name to ``host:port``.

    PgBouncer refuses to run as root; as root, it runs as the ``postgres`` user.
    """

    def __init__(
        self,
        binary: str,
        settings: Mapping[str, Any],
        pool_size: int = POOL_SIZE,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.binary = binary
        self.pool_size = pool_size  # server connections per database and user
        self.max_clients = max_clients
        self.host = str(settings.get("HOST") or "127.0.0.1")
        self.server_port = int(settings.get("PORT") or 5432)
        self.user = str(settings.get("USER") or "postgres")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sqltasks-pgbouncer-"))
        self.log = self.dir / "pgbouncer.log"
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lines: list[str] = []

    def start(self) -> PgBouncer:
        ini = self.dir / "pgbouncer.ini"
        users = self.dir / "userlist.txt"
        users.write_text(f'"{self.user}" ""\n')
        ini.write_text(
            "[databases]\n"
            f"* = host={self.host} port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            "unix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmax_client_conn = {self.max_clients}\n"
            "ignore_startup_parameters = extra_float_digits\n"
        )
        command = [self.binary, str(ini)]
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            for path in (ini, users):
                shutil.chown(path, "postgres", "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self._proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        ready = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(ready,), daemon=True)
        self._reader.start()
        if not ready.wait(START_TIMEOUT) or self._proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"PgBouncer did not start:\n{''.join(self._lines)}")
        return self

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def _read(self, ready: threading.Event) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        with self.log.open("w") as log:
            for line in self._proc.stdout:
                self._lines.append(line)
                log.write(line)
                if READY_LINE in line:
                    ready.set()
        ready.set()  # it exited: start() sees the exit status

    def stop(self) -> None:
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if self._reader is not None:
                self._reader.join(timeout=10)  # it reads to the end of the output
            assert proc.stdout is not None
            proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)

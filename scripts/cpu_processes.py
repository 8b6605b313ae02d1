"""CPU-bound tasks on one worker process against several (``tasks_worker --processes``).

Each task is a pure-Python loop (tests.tasks_processes.cpu), which holds the GIL: one process
runs them one at a time whatever its --concurrency, N processes run N at once. Usage:

    python scripts/cpu_processes.py [--tasks 40] [--loop 3000000] [--processes 2]

It uses the test settings (tests/settings.py) on a scratch SQLite file, or on DATABASE_URL,
and prints the wall time of each run (enqueue excluded) and the speed-up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--loop", type=int, default=3_000_000, help="iterations per task")
    parser.add_argument("--processes", type=int, default=2)
    options = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="cpu-processes-")
    env = dict(os.environ)
    env.setdefault("SQLTASKS_SQLITE_PATH", str(Path(scratch) / "db.sqlite3"))
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    manage = [sys.executable, "-m", "django"]
    subprocess.run([*manage, "migrate", "-v0"], env=env, cwd=ROOT, check=True)
    enqueue = (
        "import django; django.setup()\n"
        "from tests.tasks_processes import cpu\n"
        f"for _ in range({options.tasks}): cpu.enqueue({options.loop})\n"
    )
    runs = {
        "1 process, --concurrency 2": ["--concurrency", "2"],
        f"{options.processes} processes, --concurrency 1": [
            "--processes",
            str(options.processes),
            "--concurrency",
            "1",
        ],
    }
    seconds = {}
    for name, arguments in runs.items():
        subprocess.run([sys.executable, "-c", enqueue], env=env, cwd=ROOT, check=True)
        started = time.perf_counter()
        subprocess.run(
            [*manage, "tasks_worker", "--burst", "-v", "0", *arguments],
            env=env,
            cwd=ROOT,
            check=True,
        )
        seconds[name] = time.perf_counter() - started
        print(f"{name}: {options.tasks} tasks in {seconds[name]:.2f}s", flush=True)
    first, second = seconds.values()
    print(f"speed-up: {first / second:.2f}x")


if __name__ == "__main__":
    main()

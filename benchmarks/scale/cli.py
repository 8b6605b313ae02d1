"""``python -m benchmarks scale``: fill N finished tasks over 30 days, then time the admin's
pages, the claim (against the empty table first), the enqueue with and without the search
indexes, and a day's prune, and print the table.

It needs only this package, Django and the database's driver (not the peers of the side-by-side
suite), and runs on whatever schema the checkout's migrations build.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import snapshot

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "benchmarks" / "results" / "scale"
URLS = {
    "postgresql": "postgres://postgres@127.0.0.1:5432/sqltasks_scale",
    "mariadb": "mysql://root@127.0.0.1:3306/sqltasks_scale",
    "sqlite": f"sqlite:///{Path(tempfile.gettempdir()) / 'sqltasks_scale.sqlite3'}",
}
SMOKE_TASKS = 2000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__)
    parser.add_argument(
        "-n", "--tasks", type=int, default=1_000_000, help="finished tasks (1,000,000)"
    )
    parser.add_argument("--database", choices=sorted(URLS), default="postgresql")
    parser.add_argument(
        "--url", help="the database's URL (default: a database sqltasks_scale on localhost)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the database (default: drop it at the end)"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the tasks a kept database already holds, if it holds N (skip the fill)",
    )
    parser.add_argument(
        "--fill-only",
        action="store_true",
        help="fill, analyse and keep the database, measure nothing (then measure with --reuse)",
    )
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_TASKS} tasks (CI)")
    parser.add_argument("--out", type=Path, help=f"the JSON result (default {RESULTS}/...)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.tasks = min(args.tasks, SMOKE_TASKS)
    if args.tasks < 100:
        raise SystemExit("--tasks: must be at least 100")
    url = args.url or URLS[args.database]
    os.environ["SCALE_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.scale.settings"
    import django  # after the environment: the settings read it

    django.setup()
    from benchmarks.scale import run

    fill_record = RESULTS / f"fill-{args.database}-{args.tasks}.json"
    results = run.run(
        args.tasks,
        reuse=args.reuse,
        log=log,
        fill_record=fill_record,
        fill_only=args.fill_only,
        keep=args.keep or args.fill_only,
    )
    if results is None:
        log(
            f"filled and kept; measure with: python -m benchmarks scale -n {args.tasks} "
            f"--database {args.database} --reuse"
        )
        return 0
    results["meta"] |= {"command": " ".join(["python -m benchmarks scale", *argv])} | machine()
    print(run.markdown(results))
    out = args.out or RESULTS / f"{results['meta']['vendor']}-{args.tasks}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    log(f"result: {out}")
    if not args.keep:
        run.drop_database()
    return 0 if all(p["status"] in (None, 200) for p in results["pages"]) else 1


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """The date, the commit and the machine, for the table's heading."""
    commit = snapshot.commit(abbrev=12)
    cpu = "unknown"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 1024 / 1024:.1f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": f"{cpu}, {os.cpu_count()} cores{memory}, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}",
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def elapsed(start: float) -> str:
    return str(timedelta(seconds=round(time.perf_counter() - start)))

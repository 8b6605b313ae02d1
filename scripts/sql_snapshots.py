"""Write the SQL snapshots: every statement of ``django_sqltasks/sql/`` as each database
receives it, in ``sql/snapshots/<database>/`` (``tests/sql/snapshots.py`` renders them).

    python scripts/sql_snapshots.py          # write them (make sql-snapshots)
    python scripts/sql_snapshots.py --check  # exit 1, with a diff, if a committed file differs
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the SQL snapshots (sql/snapshots/).")
    parser.add_argument("--check", action="store_true", help="fail if a committed file differs")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    # The dialects read the models (the app registry); no database is opened.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from tests.sql.snapshots import COMMAND, SNAPSHOTS, differences, render, write

    rendered = render()
    if args.check:
        found = differences(rendered)
        if found:
            print("".join(found) + f"\nThe SQL snapshots are out of date: run {COMMAND}.")
            return 1
        return 0
    write(rendered)
    print(f"{len(rendered)} files in {SNAPSHOTS.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

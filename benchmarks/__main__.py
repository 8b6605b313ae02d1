from __future__ import annotations

import sys

if sys.argv[1:2] == ["scale"]:
    # The scale profile needs only this package and a database driver, not the peers that the
    # side-by-side suite (benchmarks.cli) imports.
    from benchmarks.scale.cli import main as scale

    sys.exit(scale(sys.argv[2:]))
if sys.argv[1:2] == ["mixed"]:
    # A profile of its own too (benchmarks/mixed/): this package, psycopg, psutil, matplotlib.
    from benchmarks.mixed.cli import main as mixed

    sys.exit(mixed(sys.argv[2:]))

from benchmarks.cli import main

sys.exit(main())

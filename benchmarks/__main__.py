from __future__ import annotations

import sys

if sys.argv[1:2] == ["scale"]:
    # The scale profile needs only this package and a database driver, not the peers that the
    # side-by-side suite (benchmarks.cli) imports.
    from benchmarks.scale.cli import main as scale

    sys.exit(scale(sys.argv[2:]))

from benchmarks.cli import main

sys.exit(main())

from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "benchmarks.projects"
    label = "bench"

    def ready(self) -> None:
        from benchmarks import marker
        from benchmarks.mixed import timing
        from benchmarks.systems import current_system

        timing.install_from_env()  # the mixed profile's statement timer (MariaDB, SQLite)

        # Only worker processes get BENCH_MARKER_ADDR; enqueuers and the web server do not.
        # Made here, in the worker's first process, so that forked work-horses share it.
        if counter := marker.CompletionCounter.from_env():
            if marker.count_method() == "signal":
                current_system().connect_completion(counter.hit)
            else:
                marker.install(counter)

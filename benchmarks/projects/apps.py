from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "benchmarks.projects"
    label = "bench"

    def ready(self) -> None:
        from benchmarks.marker import CompletionCounter
        from benchmarks.systems import current_system

        # Only worker processes get BENCH_MARKER_ADDR; enqueuers and the web server do not.
        if counter := CompletionCounter.from_env():
            current_system().connect_completion(counter.hit)

"""Django settings, built by the system named in ``BENCH_SYSTEM`` (see ``benchmarks.systems``)."""

from __future__ import annotations

from benchmarks.systems import current_system
from benchmarks.systems.base import Endpoints

globals().update(current_system().django_settings(Endpoints.from_env()))

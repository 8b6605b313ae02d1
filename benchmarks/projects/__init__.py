"""The tiny Django project every system runs in; ``BENCH_SYSTEM`` picks the configuration."""

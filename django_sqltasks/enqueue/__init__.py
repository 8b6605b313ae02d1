"""Validating and building the rows an enqueue writes, writing them on the caller's connection, and
the async coalescer. Loads with the backend, so it imports no models at the top (Django's app
registry may not be ready)."""

"""The embedded worker: a worker on a thread of the web server's process, for development and
small sites (opt-in; docs/worker.md, "The embedded worker").

It is the worker ``tasks_worker`` runs (``worker.Worker``): its lease and heartbeat, its claim,
retries, rescues and periodic tasks, on a thread of its own with its own event loop. Wrap the
project's application to use it:

- WSGI (``runserver``, gunicorn, uWSGI): ``application = embed_in_wsgi(get_wsgi_application())``
  starts it when the application is made, in the process that serves requests.
- ASGI (uvicorn, hypercorn, granian): ``application = embed_in_asgi(get_asgi_application())``
  starts it at the server's lifespan startup and stops it at its shutdown.

A stop lets running tasks finish for up to ``shutdown_timeout`` seconds (5 by default) and puts
back what is left, as a stopped worker does. This module loads no other part of the package
until a worker starts, so a ``wsgi.py`` may import it before Django is set up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

logger = logging.getLogger("django_sqltasks")

DEFAULT_CONCURRENCY = 2  # tasks at once: a web process's spare capacity, not a worker's
DEFAULT_SHUTDOWN_TIMEOUT = 5.0  # seconds running tasks get at a stop (a reload, Ctrl-C)
STOP_JOIN_MARGIN = 35.0  # seconds past the shutdown timeout to wait for outcome writes
# Seconds between attempts to start while the database cannot be used (down, or its tables not
# migrated yet), doubling from the first to the last: a web process may start before its
# database, and serves (and enqueues) meanwhile.
FIRST_RETRY = 0.5
MAX_RETRY = 30.0

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class EmbeddedWorker:
    """One ``Worker`` run on a thread of this process; ``start()`` and ``stop()`` it.

    The options are ``Worker``'s (``backend``, ``queue_names``, ``concurrency``,
    ``shutdown_timeout``, ...); by default every queue of the backend, two tasks at once.
    """

    def __init__(self, **options: Any) -> None:
        options.setdefault("queue_names", ["*"])
        options.setdefault("concurrency", DEFAULT_CONCURRENCY)
        options.setdefault("shutdown_timeout", DEFAULT_SHUTDOWN_TIMEOUT)
        self.options = options
        self.worker: Any = None  # the Worker, once started
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # set by stop(): no more attempts to start

    @property
    def running(self) -> bool:
        """Whether the worker's thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the worker on a thread of its own; a no-op if it runs already."""
        with self._lock:
            if self.running:
                return
            # The app registry: a worker loads the models, which exist once Django is set up,
            # by the time a server starts; the module itself is imported before that.
            from .worker import Worker

            self.worker = Worker(**self.options)
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._run, name="sqltasks-embedded-worker", daemon=True
            )
            self._thread.start()
        _stop_before_exit(self)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the worker as ``tasks_worker`` stops on SIGTERM and wait for its thread (up to
        ``timeout`` seconds; by default the shutdown timeout and time to write outcomes).
        Return whether it ended."""
        thread, worker = self._thread, self.worker
        if thread is None or worker is None:
            return True
        self._stopping.set()
        worker.stop()
        if timeout is None:
            timeout = (worker.shutdown_timeout or 0.0) + STOP_JOIN_MARGIN
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        # The app registry: as in start(), the worker's modules load once Django is set up.
        from django.db import connections

        try:
            if self._wait_for_database():
                self.worker.run()
        except Exception:  # the web server goes on without its worker, and says why
            logger.exception(
                "The embedded worker stopped on an error; tasks wait for another worker",
                extra={"action": "embedded_worker_error"},
            )
        finally:
            connections.close_all()

    def _wait_for_database(self) -> bool:
        """Check the database the worker will use until it passes, as ``tasks_worker
        --wait-for-database`` does but for as long as the process runs: a connection that
        fails, or tables not migrated yet, are tried again with backoff, each attempt logged.
        Return False if the worker was stopped first."""
        from django.db import InterfaceError, OperationalError, connections

        pause = FIRST_RETRY
        while not self._stopping.is_set():
            try:
                self.worker.check_database()
                return True
            except (OperationalError, InterfaceError, RuntimeError) as e:
                logger.warning(
                    "The embedded worker cannot start yet (%s); trying again in %.1fs",
                    " ".join(str(e).split()),
                    pause,
                    extra={"action": "embedded_worker_wait"},
                )
            connections.close_all()  # this thread's; the next attempt connects anew
            if self._stopping.wait(pause):
                break
            pause = min(pause * 2, MAX_RETRY)
        return False


def _stop_before_exit(embedded: EmbeddedWorker) -> None:
    """Stop the worker when the interpreter exits (Ctrl-C, runserver's reload).

    Before Python joins threads and shuts down ``concurrent.futures`` (whose executors the
    worker writes through), not after as an ``atexit`` function would: ``threading``'s own
    exit hook, which ``concurrent.futures`` uses too, runs ours first (they run last first).
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython has it (3.9+)
        import atexit  # only where threading has no exit hook

        atexit.register(embedded.stop)
        return
    try:
        register(embedded.stop)
    except RuntimeError:  # the interpreter is already shutting down
        embedded.stop()


class EmbeddedWSGI:
    """A WSGI application that runs an embedded worker in the process serving it."""

    def __init__(self, application: WSGIApp, worker: EmbeddedWorker) -> None:
        self.application = application
        self.worker = worker
        self._pid = os.getpid()
        worker.start()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if self._pid != os.getpid():
            # A server that forked after loading the application (gunicorn --preload): the
            # worker's thread stayed in the parent, so this process starts its own.
            self._pid = os.getpid()
            self.worker = EmbeddedWorker(**self.worker.options)
            self.worker.start()
        return self.application(environ, start_response)


class EmbeddedASGI:
    """An ASGI application that runs an embedded worker from the server's lifespan startup to
    its shutdown; every other scope goes to the wrapped application."""

    def __init__(self, application: ASGIApp, worker: EmbeddedWorker) -> None:
        self.application = application
        self.worker = worker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.application(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(self.worker.start)
                except Exception as e:
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(self.worker.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return


def embed_in_wsgi(application: WSGIApp, **options: Any) -> EmbeddedWSGI:
    """Return ``application`` with a worker running in its process (``EmbeddedWorker``'s
    options), started now."""
    return EmbeddedWSGI(application, EmbeddedWorker(**options))


def embed_in_asgi(application: ASGIApp, **options: Any) -> EmbeddedASGI:
    """Return ``application`` with a worker running from the server's lifespan startup to its
    shutdown (``EmbeddedWorker``'s options)."""
    return EmbeddedASGI(application, EmbeddedWorker(**options))

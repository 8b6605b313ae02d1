"""The supervisor's ``LISTEN``, relayed to its worker processes and shared with the other
machines' supervisors (PostgreSQL).

One connection listens for every process of ``tasks_worker --processes N`` (their own
connections only claim), and each notification wakes one process, not all of them: the one
with the fewest running tasks, and among equals the one woken last. A process whose claim
took all it asked for says so (``relayed.MORE``), and the relay wakes another, so a batch
enqueued at once (one notification) reaches as many processes as it needs, one claim after
another. Only the last claim of such a chain finds nothing.

Across machines, the supervisors of one backend and one set of queues form a ring
(``sql/wake_ring.py``): only the ring's head hears the enqueue's notifications. A supervisor
whose processes have no room for a claim passes the notification (or a "more") to the next
machine's slot, and the one that has room wakes one of its processes: an enqueue makes one
claim, on the first machine that can take the task, rather than one a machine. A machine that
dies leaves the ring with its session; another takes the head at its next check. The polls
are spread over the ring too: while it listens, a supervisor wakes one of its processes every
poll interval times the machines in the ring, jittered, so that the fleet polls about as
often as one worker would (each process's own poll, ``RELAYED_POLL_FACTOR`` times longer, is
the net beneath). The poll stays the safety net for any notification lost on the way.

Nothing here blocks the supervisor's loop: the connection opens on a thread, and its
statements are sent and read as its socket allows (``link``). It is the supervisor's: every
method and field belongs to the supervisor thread.
"""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import Future
from typing import Any

from django.db import connections

from ...sql import dialect_for, wake_ring
from ...sql.channels import CHANNEL
from ...sql.pg import connection_params
from ...sql.postgresql import PostgreSQLDialect
from .. import events
from ..native import RECONNECT_DELAY, LoopDatabase
from ..relayed import LISTENING, UNHEARD, wake_line
from .child import Child, Children
from .link import Link, LinkLost, open_link

logger = logging.getLogger("django_sqltasks")

CONNECT_TIMEOUT = 5  # seconds the connecting thread waits for the server
CHECK_EVERY = 1.0  # seconds, on average, between looks at the ring (its slots and its head)


def jittered(seconds: float) -> float:
    """``seconds`` give or take half: machines that started together do not keep in step."""
    return seconds * random.uniform(0.5, 1.5)


class Relay:
    """Listen on ``database`` (through ``listen_database``, reached without a pooler) and wake
    ``children``, which run ``queue_names`` (None: every queue) of ``backend_name`` with
    ``capacity`` tasks each at most, and poll every ``poll_interval`` seconds."""

    def __init__(
        self,
        database: str,
        listen_database: str | None,
        children: Children,
        *,
        backend_name: str = "default",
        queue_names: list[str] | None = None,
        capacity: int = 1,
        poll_interval: float = 1.0,
    ) -> None:
        self.database = database
        self.listen_database = listen_database or database
        self._children = children
        self._key = wake_ring.ring_key(backend_name, queue_names)
        self._queues = None if queue_names is None else frozenset(queue_names)
        self._capacity = max(1, capacity)
        self._poll_interval = poll_interval
        self._link: Link | None = None  # None while down
        self._opening: Future[Link] | None = None  # a connection being opened on its thread
        self._retry_at = 0.0  # monotonic time before which a lost connection stays down
        self._slots: list[int] = []  # the ring's slots held (this one's too), at the last check
        self._next_check = 0.0  # monotonic
        self._next_poll = 0.0  # monotonic
        self._last: Child | None = None  # the child woken last
        self._heard: list[tuple[str, str]] = []  # notifications not routed yet
        self._checking = False  # a look at the ring was sent and not answered yet
        self.woken = 0  # wake-ups sent to children
        self.passed = 0  # notifications passed on to the next machine

    @staticmethod
    def wanted(database: str, notify: bool) -> bool:
        """Whether a supervisor on ``database`` listens for its processes: PostgreSQL through
        psycopg 3, with NOTIFY on."""
        return (
            notify
            and dialect_for(connections[database]).wakeup == "notify"
            and (LoopDatabase.available(database))
        )

    @property
    def listening(self) -> bool:
        return self._link is not None

    def tick(self) -> None:
        """Open the connection if it is down and its retry is due (without waiting for it);
        wake the children that asked for another process; look at the ring and poll when
        due."""
        now = time.monotonic()
        if self._link is None:
            if self._opening is None and now >= self._retry_at:
                params = connection_params(self.listen_database)
                params.setdefault("connect_timeout", CONNECT_TIMEOUT)
                self._opening = open_link(params, self._key)
            elif self._opening is not None and self._opening.done():
                self._adopt()
        heard, self._heard = self._heard, []
        for channel, payload in heard:
            if channel == CHANNEL:
                self._route(payload or None, 0)
            else:
                hops, queue_name = wake_ring.read_payload(payload)
                self._route(queue_name, hops)
        more, self._children.more[:] = list(self._children.more), []
        for child in more:
            self._route(None, 0, besides=child)
        if self._link is None:
            return
        if now >= self._next_check and not self._checking:
            # One look at a time: a server slow to answer gets no queue of them.
            self._next_check, self._checking = now + jittered(CHECK_EVERY), True
            self._send(
                wake_ring.check_sql(self._key, self._link.slot, self._link.head), self._checked
            )
        if now >= self._next_poll:
            self._next_poll = now + jittered(self._poll_interval * max(1, len(self._slots)))
            polled = self._roomy()
            if polled is not None:
                polled.wake(wake_line(None))

    def started(self, child: Child) -> None:
        """Tell a new child whether the relay listens."""
        child.wake((LISTENING if self.listening else UNHEARD) + b"\n")

    def close(self) -> None:
        self._drop()
        opening, self._opening = self._opening, None
        if opening is not None:  # still connecting: close it when it is open
            opening.add_done_callback(_close_link)

    # Inside ------------------------------------------------------------------------------

    def _adopt(self) -> None:
        """Take the connection the thread opened, or schedule another try."""
        assert self._opening is not None
        opening, self._opening = self._opening, None
        try:
            link = opening.result()
        except Exception as e:
            self._retry_at = time.monotonic() + RECONNECT_DELAY
            logger.warning("Listening for new tasks failed (%s); the processes poll", e)
            return
        self._link, self._slots = link, [link.slot]
        self._children.watch(link.fd, self._readable)
        now = time.monotonic()
        self._next_check = now  # learn the ring's other slots at once
        self._next_poll = now + jittered(self._poll_interval)
        for child in self._children.all():
            # Each claims once now: a task enqueued while nobody listened is found.
            child.wake(LISTENING + b"\n")
        events.emit("relay_listening", database=self.database, slot=link.slot, head=link.head)
        logger.info(
            "Listening for new tasks: slot %d of the wake ring%s",
            link.slot,
            " (its head)" if link.head else "",
            extra={"action": "relay_listening", "slot": link.slot, "head": link.head},
        )

    def _readable(self) -> None:
        link = self._link
        if link is None:
            return
        try:
            notifications = link.read()
        except LinkLost as e:  # the server went away: the children poll until it is back
            logger.warning("Listening for new tasks failed (%s); the processes poll", e)
            self._drop()
            return
        # Routed at the next tick, once the supervisor has read its children's pipes: a task
        # that started meanwhile counts against its process's room.
        self._heard += notifications

    def _checked(self, results: list[Any]) -> None:
        """Take in the ring's slots, and the head lock if this supervisor just got it."""
        self._checking = False
        link = self._link
        if link is None or not results:
            return
        row = results[-1]
        head = row.get_value(0, 0) == b"t"
        slots = sorted({link.slot, *wake_ring.read_slots(row.get_value(0, 1).decode())})
        if slots != self._slots:
            self._slots = slots
            events.emit("ring_changed", database=self.database, slot=link.slot, slots=slots)
        if head and not link.head:
            link.head = True
            self._send(PostgreSQLDialect.listen_sql)
            logger.info(
                "Took the head of the wake ring: slot %d hears every enqueue",
                link.slot,
                extra={"action": "relay_head", "slot": link.slot},
            )
            events.emit("relay_head", database=self.database, slot=link.slot)
            # A task enqueued while the ring had no head: claim once now.
            self._route(None, 0)

    def _route(self, queue_name: str | None, hops: int, besides: Child | None = None) -> None:
        """Wake the child with room and the fewest running tasks (not ``besides``), taking
        turns; with none, pass the wake-up on to the next machine of the ring."""
        if queue_name is not None and self._queues is not None and queue_name not in self._queues:
            return  # no machine of this ring runs that queue
        child = self._roomy(besides)
        if child is None:
            self._pass(queue_name, hops)
            return
        if child.wake(wake_line(queue_name)):
            self.woken += 1
            events.emit("relay_woke", worker_id=child.worker_id, queue=queue_name, hops=hops)

    def _roomy(self, besides: Child | None = None) -> Child | None:
        """The child to wake: not retiring, with room for a claim (a quarter of its capacity
        free, as a process claims in batches, or nothing running); registered before not, the
        fewest running tasks first, and among equals the one woken last: wake-ups that come
        together then reach one process, whose claim takes their tasks together, rather than
        several whose claims race for them."""
        least = max(1, self._capacity // 4)
        children = [
            c
            for c in self._children.all()
            if not c.retiring
            and c is not besides
            and (not c.running or self._capacity - len(c.running) >= least)
        ]
        if not children:
            return None
        chosen = min(
            children, key=lambda c: (c.last_beat is None, len(c.running), c is not self._last)
        )
        self._last = chosen
        return chosen

    def _pass(self, queue_name: str | None, hops: int) -> None:
        """Pass a wake-up to the next slot of the ring, unless it went round already."""
        link, slots = self._link, self._slots
        if link is None or hops + 1 >= len(slots):
            return  # every machine is busy: each claims as its tasks end
        later = [s for s in slots if s > link.slot]
        to = later[0] if later else slots[0]
        if to == link.slot:
            return
        try:
            link.notify(
                wake_ring.slot_channel(self._key, to), wake_ring.pass_payload(hops + 1, queue_name)
            )
        except LinkLost as e:
            logger.warning("Listening for new tasks failed (%s); the processes poll", e)
            self._drop()
            return
        self.passed += 1
        events.emit("wake_passed", slot=link.slot, to=to, hops=hops + 1, queue=queue_name)

    def _send(self, sql: str, done: Any = None) -> None:
        link = self._link
        if link is None:
            return
        try:
            link.send(sql, done)
        except LinkLost as e:
            logger.warning("Listening for new tasks failed (%s); the processes poll", e)
            self._drop()

    def _drop(self) -> None:
        link, self._link = self._link, None
        if link is None:
            return
        self._retry_at = time.monotonic() + RECONNECT_DELAY
        self._slots, self._checking = [], False
        self._children.unwatch(link.fd)
        for child in self._children.all():
            child.wake(UNHEARD + b"\n")
        link.close()


def _close_link(opening: Future[Link]) -> None:
    if opening.exception() is None:
        opening.result().close()

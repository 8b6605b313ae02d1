"""A worker process's end of its supervisor's wake-ups (``worker/relayed.py``): the lines it reads,
what it tells the producer, and the "more" it sends back."""

from __future__ import annotations

import asyncio

from django_sqltasks.worker.relayed import (
    LISTENING,
    MORE,
    UNHEARD,
    RelayedWakeups,
    socket_pair,
    wake_line,
)


def test_the_supervisor_s_lines_wake_the_worker_and_say_whether_it_listens() -> None:
    async def scenario() -> tuple[list[str | None], list[bool], bytes]:
        ours, fd = socket_pair()
        woken: list[str | None] = []
        states: list[bool] = []
        got = asyncio.Event()

        def on_wake(queue_name: str | None) -> None:
            woken.append(queue_name)
            got.set()

        relay = RelayedWakeups(fd, on_wake)
        relay.start()
        states.append(relay.listening)
        for line in (LISTENING + b"\n", wake_line("emails") + wake_line(None)[:1]):
            got.clear()
            ours.send(line)
            await asyncio.wait_for(got.wait(), 5)
            states.append(relay.listening)
        got.clear()
        ours.send(b"\n" + UNHEARD + b"\n")  # the rest of the wake-up cut in two, then U
        await asyncio.wait_for(got.wait(), 5)
        await asyncio.sleep(0)
        states.append(relay.listening)
        relay.more()
        back = ours.recv(16)
        relay.stop()
        ours.close()
        return woken, states, back

    woken, states, back = asyncio.run(scenario())
    # L wakes it for anything (a task enqueued while nobody listened); W names the queue.
    assert woken == [None, "emails", None]
    assert states == [False, True, True, False]
    assert back == MORE + b"\n"

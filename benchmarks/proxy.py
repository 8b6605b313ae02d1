"""A userspace TCP delay proxy that adds a round-trip time between clients and a service.

Used where the kernel has no ``netem``. Each direction of each connection is a FIFO: a chunk read
at time t is written at t + rtt/2, in order, while later chunks keep being read, so pipelined
traffic is delayed, not serialised. Run: ``python -m benchmarks.proxy --listen 127.0.0.1:15432
--target 127.0.0.1:5432 --rtt-ms 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys

CHUNK = 65536  # bytes per read


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def release() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    releaser = asyncio.create_task(release())
    try:
        while data := await reader.read(CHUNK):
            queue.put_nowait((loop.time() + delay, data))
    except OSError:
        pass
    finally:
        queue.put_nowait((loop.time() + delay, b""))
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await releaser


async def _handle(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    target: tuple[str, int],
    delay: float,
) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    for w in (client_writer, server_writer):
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(
        _pipe(client_reader, server_writer, delay),
        _pipe(server_reader, client_writer, delay),
        return_exceptions=True,
    )
    for w in (client_writer, server_writer):
        w.close()


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host or "127.0.0.1", int(port)


async def serve(listen: tuple[str, int], target: tuple[str, int], rtt: float) -> None:
    delay = rtt / 2
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, target, delay), listen[0], listen[1], backlog=1024
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy")
    parser.add_argument("--listen", type=_address, required=True)
    parser.add_argument("--target", type=_address, required=True)
    parser.add_argument("--rtt-ms", type=float, required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.target, args.rtt_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())

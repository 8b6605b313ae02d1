"""A small bounded HTTP/1.1 load generator: fixed connections, fixed request count, keep-alive."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from benchmarks.metrics import percentile

REQUEST_TIMEOUT = 30.0  # seconds


@dataclass
class LoadResult:
    requests: int
    errors: int
    seconds: float
    latencies: list[float] = field(repr=False)

    @property
    def rps(self) -> float:
        return (self.requests - self.errors) / self.seconds

    def as_dict(self) -> dict[str, float]:
        ok = self.latencies or [float("nan")]
        return {
            "http_requests": self.requests,
            "http_errors": self.errors,
            "http_rps": self.rps,
            "http_p50_ms": percentile(ok, 50) * 1000,
            "http_p99_ms": percentile(ok, 99) * 1000,
        }


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> None:
    """Consume a response body sent with Content-Length or chunked transfer encoding."""
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)
    }
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return
    elif length := int(headers.get(b"content-length", b"0")):
        await reader.readexactly(length)


async def _connection(
    host: str, port: int, path: str, counter: list[int], total: int, result: LoadResult
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    request = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n".encode()
    try:
        while counter[0] < total:
            counter[0] += 1
            started = time.perf_counter()
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            status = int(head.split(b" ", 2)[1])
            await _read_body(reader, head)
            if status == 200:
                result.latencies.append(time.perf_counter() - started)
            else:
                result.errors += 1
    finally:
        writer.close()


async def run(host: str, port: int, path: str, total: int, connections: int) -> LoadResult:
    """Send ``total`` POSTs over ``connections`` keep-alive connections; stop when all answered."""
    result = LoadResult(requests=total, errors=0, seconds=0.0, latencies=[])
    counter = [0]
    started = time.perf_counter()
    outcomes = await asyncio.gather(
        *(_connection(host, port, path, counter, total, result) for _ in range(connections)),
        return_exceptions=True,
    )
    result.seconds = time.perf_counter() - started
    result.errors += total - result.errors - len(result.latencies)
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures and not result.latencies:
        raise RuntimeError(f"load generator failed: {failures[0]!r}") from failures[0]
    return result

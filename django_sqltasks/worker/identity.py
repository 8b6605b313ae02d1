"""Who a worker process is, beyond its host name and pid: what the worker table stores so that
a worker starting with an id in use can tell a dead holder from a live one.

A pid names a process only within its PID namespace, and a host name may be shared (containers
with host networking, replicas given one ``hostname:``). So a row also stores the kernel's boot
id, the PID namespace's inode, the process's start time (in clock ticks since boot, which a
reused pid does not share) and a random token of the process. A holder is judged dead only when
it ran under this kernel, in this PID namespace, and its pid is gone or now names another
process; anything else is a live worker the new one cannot see, and it is refused.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from functools import cache

# The kernel's id of this boot; the link naming a process's PID namespace (Linux only).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
SEPARATOR = " "


@dataclass(frozen=True)
class ProcessIdentity:
    """A worker process as the worker table stores it; "" where the system does not say."""

    boot_id: str
    pid_namespace: str  # the namespace's inode, such as "4026531836"
    started: str  # the process's start, in clock ticks after boot
    token: str  # random, drawn once per process

    def text(self) -> str:
        """The stored form: the four fields, space-separated ("-" for an unknown one)."""
        return SEPARATOR.join(value or "-" for value in self.fields())

    def fields(self) -> tuple[str, str, str, str]:
        return (self.boot_id, self.pid_namespace, self.started, self.token)

    @classmethod
    def parse(cls, text: str | None) -> ProcessIdentity | None:
        """The identity a row stores, or None for a row of a version that stored none."""
        parts = (text or "").split(SEPARATOR)
        if len(parts) != 4:
            return None
        boot_id, namespace, started, token = ("" if part == "-" else part for part in parts)
        return cls(boot_id, namespace, started, token)


def this_process() -> ProcessIdentity:
    """This process's identity (its token is drawn at the first call in this process)."""
    return _identity_of(os.getpid())  # by pid: a forked child is a process of its own


@cache
def _identity_of(pid: int) -> ProcessIdentity:
    return ProcessIdentity(
        boot_id=_read(BOOT_ID_PATH),
        pid_namespace=_namespace("self"),
        started=start_ticks("self"),
        token=uuid.uuid4().hex,
    )


def holder_is_gone(pid: int | None, hostname: str, stored: str | None) -> bool:
    """Whether the worker that wrote a row (``pid`` on ``hostname``, with the identity text
    ``stored``) is surely dead, so that its id may be taken over now."""
    if hostname != socket.gethostname()[:255] or pid is None:
        return False
    holder, me = ProcessIdentity.parse(stored), this_process()
    if holder is not None and me.boot_id and me.pid_namespace:
        if (holder.boot_id, holder.pid_namespace) != (me.boot_id, me.pid_namespace):
            # Another kernel (a host of the same name) or another PID namespace (a
            # container): its pid means nothing here, so it is taken to be alive.
            return False
        if pid == os.getpid():
            return True  # an earlier worker of this process (or this one)
        if not _exists(pid):
            return True
        return bool(holder.started) and start_ticks(str(pid)) != holder.started  # pid reused
    # A row of an earlier version, or a system that does not say: host name and pid.
    return pid == os.getpid() or not _exists(pid)


def describe_holder(stored: str | None) -> str:
    """What the refusal of an id says of its holder, beyond its pid and host."""
    holder, me = ProcessIdentity.parse(stored), this_process()
    if holder is None or not me.pid_namespace:
        return ""
    if holder.boot_id != me.boot_id:
        return " (under another kernel: a host of the same name?)"
    if holder.pid_namespace != me.pid_namespace:
        return " (in another PID namespace: a container of the same host name?)"
    return ""


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _namespace(pid: str) -> str:
    try:
        link = os.readlink(f"/proc/{pid}/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return ""
    return link.partition("[")[2].rstrip("]")


def start_ticks(pid: str) -> str:
    """When process ``pid`` started, in clock ticks after boot ("" where unknown)."""
    stat = _read(f"/proc/{pid}/stat")
    # Field 22, counted after the command, which is in parentheses and may hold spaces.
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""

"""The fairness scenario's tasks (django-sqltasks only): the same no-op, with a ``fair_key``
and without. A task of any key but the big one tells the harness when it finished."""

from __future__ import annotations

import json
import os
import socket
import time

from django.tasks import task

from benchmarks.fairness import ADDRESS_ENV, BIG

_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def _report(tenant: str) -> None:
    address = os.environ.get(ADDRESS_ENV)
    if address and tenant != BIG:
        host, _, port = address.rpartition(":")
        payload = {"t": time.time()}
        _socket.sendto(json.dumps(payload).encode(), (host, int(port)))


def _tenant(tenant: str) -> str:
    return tenant


@task(fair_key=_tenant)
def fair_noop(tenant: str) -> None:
    _report(tenant)


@task
def plain_noop(tenant: str) -> None:
    _report(tenant)

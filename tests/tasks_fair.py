"""Tasks for the fair queue tests: each appends its label to a log file."""

from __future__ import annotations

from pathlib import Path

from django_sqltasks.compat import task
from tests import events


def _tenant(path: str, tenant: str, label: str) -> str:
    return tenant


def _logged(path: str, tenant: str, label: str) -> str:
    with Path(path).open("a") as f:
        f.write(f"{tenant}:{label}\n")
    return label


@task(fair_key=_tenant)
def per_tenant(path: str, tenant: str, label: str) -> str:
    return _logged(path, tenant, label)


@task(fair_key=_tenant, concurrency_limit=2)
def per_tenant_two_at_once(path: str, tenant: str, label: str) -> str:
    return _logged(path, tenant, label)


@task(fair_key=_tenant, concurrency_key=_tenant, concurrency_limit=1)
def one_per_tenant(path: str, tenant: str, label: str) -> str:
    return _logged(path, tenant, label)


@task
def unfair(path: str, tenant: str, label: str) -> str:
    return _logged(path, tenant, label)


def undecorated(path: str, tenant: str, label: str) -> str:
    return label


def started(path: Path) -> list[str]:
    """The "tenant:label" of each task that ran, in the order they ran."""
    return path.read_text().split() if path.exists() else []


def _tenant_of_gated(path: str, tenant: str, label: str, gate: str | None = None) -> str:
    return tenant


@task(fair_key=_tenant_of_gated)
def gated(path: str, tenant: str, label: str, gate: str | None = None) -> str:
    """Tell the test it started, then wait at its ``gate`` (if any) before it logs."""
    events.note("start", label=label)
    if gate is not None:
        events.wait_at(gate)
    return _logged(path, tenant, label)

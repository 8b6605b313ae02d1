"""The tasks of the ``scale`` profile: the eight the history is made of (so that the admin's
task filter, which lists the declared tasks, offers them), and ``noop``, which times the
enqueue. None does anything: no worker runs them."""

from __future__ import annotations

from django_sqltasks.compat import task


@task()
def noop(address: str, order: int) -> None:
    """Do nothing: the enqueue is what is timed."""


@task()
def send_receipt(address: str, order: int) -> None: ...


@task()
def charge_card(address: str, order: int) -> None: ...


@task()
def render_invoice(address: str, order: int) -> None: ...


@task()
def sync_stock(address: str, order: int) -> None: ...


@task()
def notify_courier(address: str, order: int) -> None: ...


@task()
def refresh_search(address: str, order: int) -> None: ...


@task()
def export_report(address: str, order: int) -> None: ...


@task()
def resize_image(address: str, order: int) -> None: ...

"""Tasks whose outcomes are hard to store: each must fail alone, never wedge the worker."""

from __future__ import annotations

from django_sqltasks.compat import task


@task
def raise_surrogate() -> None:
    """Fail with a message holding a lone surrogate, as a file name that is not UTF-8 does."""
    name = b"report\xe9.txt".decode("utf-8", "surrogateescape")
    raise ValueError(f"unexpected file {name}")


@task
def raise_nul() -> None:
    raise ValueError("binary \x00 data")


@task
def raise_huge(size: int) -> None:
    raise ValueError("E" * size)


@task
def return_huge(size: int) -> str:
    return "x" * size

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


@task
def fork_and_return(path: str) -> int:
    """Fork a child that returns from the task too (a careless ``os.fork()``); the parent
    records the child's pid and waits for it."""
    import os

    pid = os.fork()
    if pid == 0:
        return -1  # the child returns: the worker's copy in it must end, not linger
    with open(path, "w") as f:
        f.write(str(pid))
    os.waitpid(pid, 0)
    return pid

"""What every command's ``--help`` and ``--version`` show, and how stored text is printed."""

from __future__ import annotations

import argparse
import unicodedata
from importlib.metadata import PackageNotFoundError, version

from django.core.management.base import DjangoHelpFormatter

from .. import __version__


class HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's option order, with the examples epilog printed as written."""


def package_version() -> str:
    """This package's version, as installed (``--version`` of Django commands shows Django's)."""
    try:
        return f"django-sqltasks {version('django-sqltasks')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return f"django-sqltasks {__version__}"


def terminal_safe(text: str) -> str:
    """``text`` with its control and format characters written as escapes (``\\x1b``), so a
    stored value (a task path, a queue name) cannot colour, move or clear the terminal."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch == " " or unicodedata.category(ch)[0] not in "CZ" else _escape(ch) for ch in text
    )


def _escape(ch: str) -> str:
    code = ord(ch)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )

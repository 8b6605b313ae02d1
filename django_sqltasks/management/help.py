"""What every command's ``--help`` and ``--version`` show."""

from __future__ import annotations

import argparse
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

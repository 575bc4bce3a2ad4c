"""Exit codes of the ``sql-lease`` commands and the one way they fail: a line on stderr, then exit."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from .render import as_given

EX_UNAVAILABLE = 69  # the database failed or could not be reached
EX_TEMPFAIL = 75  # held by another owner, or not held by the given one
EXIT_LEASE_LOST = 76  # exec: the lease was lost while the command ran
EX_CONFIG = 78  # a missing table, a refused role or privilege, bad configuration


def fail(code: int, message: str) -> NoReturn:
    """Print ``sql-lease: MESSAGE`` on stderr (URLs as the user gave them) and exit with ``code``."""
    click.echo(f"sql-lease: {as_given(message)}", err=True)
    sys.exit(code)

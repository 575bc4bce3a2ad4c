"""Exit codes of the ``sql-lease`` commands and the one way they fail: a line on stderr, then exit."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

EX_UNAVAILABLE = 69


EX_TEMPFAIL = 75


EXIT_LEASE_LOST = 76


EX_CONFIG = 78


def fail(code: int, message: str) -> NoReturn:
    click.echo(f"sql-lease: {message}", err=True)
    sys.exit(code)

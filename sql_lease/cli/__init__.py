"""The ``sql-lease`` command line: ``exec`` (flock(1) for a fleet), ``migrate``, ``check``, ``status``,
``list``, ``show``, ``acquire``, ``renew``, ``release``, ``transfer``, ``break``, ``sweep``.

Exit codes of ``sql-lease exec`` (the sysexits.h names where one fits):

    the command's own   the command ran; its exit status (128+N when killed by signal N)
    75  EX_TEMPFAIL     the lease is held by another owner (or --wait timed out)
    76  LEASE_LOST      the lease was lost while the command ran, or the command stayed stopped for a
                        whole TTL; the command and its process group were terminated
    69  EX_UNAVAILABLE  the database failed or could not be reached
    78  EX_CONFIG       the lease table is missing (run `sql-lease migrate`) or bad configuration
    126 / 127           the command could not be run / was not found (as in shells)

The package's modules: ``config`` (where the URL comes from), ``options`` (shared options),
``render`` (what is printed), ``exits`` and ``runner`` (exit codes, opening the provider),
one module per group of commands, ``exec_command`` (exec's lease: acquire, hold, release) and
``supervisor`` (exec's process group, terminal and signals; no lease logic).
"""

from __future__ import annotations

import logging

import click

from .exec_command import exec_
from .lease_commands import acquire, break_, release, renew, transfer
from .options import DURATION, Duration
from .render import tenure_ms as _held_ms
from .schema_commands import check, migrate
from .sweep_command import sweep
from .view_commands import list_, show, status

__all__ = ["DURATION", "Duration", "_held_ms", "cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sql-lease")
def cli() -> None:
    """Distributed leases on the SQL database you already run."""


for _command in (migrate, check, status, sweep, exec_, list_, show, break_, acquire, renew, release, transfer):
    cli.add_command(_command)


def main() -> None:
    """The ``sql-lease`` entry point."""
    logging.getLogger("sql_lease").addHandler(logging.NullHandler())  # the CLI prints its own messages
    logging.getLogger("sql_lease").propagate = False
    cli(prog_name="sql-lease")

"""``sql-lease`` run inside the test process (click's CliRunner), for tests of what a command prints
and exits with; a real process (tests/test_cli.py's ``run_cli``) only where the process itself is
under test: signals, terminals, ``exec``'s child, Python's start-up.

A run here is what a run of ``python -m sql_lease`` would be: the working directory ``cwd``, the
environment as given (``env`` replaces it whole, as subprocess's does), ``sql_lease`` logging silenced
as ``main()`` silences it, an exception that escapes printed as a traceback on stderr with exit code 1.
Nothing carries over between runs: each command opens and closes its provider in its own
``asyncio.run``; the working directory, environment and logger are put back afterwards.

``exec`` runs here only where it refuses its arguments or configuration (exit 2 or 78) before it
acquires anything: past that it installs signal handlers and starts a child, which want a real process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

from click.testing import CliRunner

from sql_lease.cli import cli


@contextlib.contextmanager
def patched_environ(env: Mapping[str, str] | None) -> Iterator[None]:
    """``os.environ`` is exactly ``env`` (None: left as it is) inside; put back afterwards."""
    before = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@contextlib.contextmanager
def _as_main(cwd: Path, env: Mapping[str, str] | None) -> Iterator[None]:
    """The working directory, environment and ``sql_lease`` logger of a fresh ``sql-lease`` process."""
    logger = logging.getLogger("sql_lease")
    handlers, propagate = list(logger.handlers), logger.propagate
    before_cwd = os.getcwd()
    try:
        with patched_environ(env):
            os.chdir(cwd)
            logger.addHandler(logging.NullHandler())
            logger.propagate = False
            yield
    finally:
        logger.handlers[:], logger.propagate = handlers, propagate
        os.chdir(before_cwd)


def invoke(
    args: list[str], cwd: Path, input: str | bytes | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sql-lease ARGS`` in this process, in ``cwd``, ``input`` on stdin (else an empty stdin, not a
    terminal); (args, exit code, stdout, stderr) as ``subprocess.run`` gives them."""
    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop()
        raise AssertionError("invoke() runs the command's own asyncio.run: call it from a synchronous test")
    with _as_main(cwd, env):
        result = CliRunner().invoke(cli, args, input=input, prog_name="sql-lease", catch_exceptions=True)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(*result.exc_info)[1:])
    return subprocess.CompletedProcess(["sql-lease", *args], result.exit_code, result.stdout, stderr)

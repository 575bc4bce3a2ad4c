"""Options shared by the commands: --url/--table/--schema, durations, --ttl, --owner, --json, --data."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

from ..contract import MAX_LIMIT, validate_ttl_ms
from .config import CONFIG_ENV, DEFAULT_TABLE, DEFAULT_URL, SYSTEM_CONFIG, URL_ENV, config_default, resolve_url
from .exits import fail
from .render import printable, span

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION = re.compile(rf"\s*(?:{_NUMBER}\s*(?:ms|s|m|h|d)\s*)+\Z|\s*{_NUMBER}\s*\Z")
_DURATION_PART = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d)?")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, None: 1.0}
_BARE_NUMBER = re.compile(rf"\s*{_NUMBER}\s*\Z")
BARE_SECONDS_NOTED = 1000
"""A bare --ttl (seconds) at least this large is noted on stderr: milliseconds, as in Python, were likely meant."""
MAX_DURATION_S = 10 * 365 * 86_400
"""Longest duration any option accepts: 10 years (87600h), in seconds."""


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as ``500ms``, ``30s``, ``5m``, ``1h``, ``2d``, ``1h30m`` (parts add up) or
    ``2.5`` (a bare number is seconds); value in seconds."""

    name = "duration"

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not _DURATION.match(str(value)):
            self._bad(f"{printable(value)!r} is not a duration like 500ms, 30s, 5m, 1h30m or 2d", param, ctx)
        seconds = sum(float(n) * _UNIT_SECONDS[unit or None] for n, unit in _DURATION_PART.findall(str(value)))
        if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
            self._bad(f"{printable(value)!r} is too long: at most 10 years (87600h)", param, ctx)
        if seconds <= 0 and not (self.allow_zero and seconds == 0):
            self._bad(f"{printable(value)!r} must be longer than zero", param, ctx)
        if (
            param is not None
            and param.name == "ttl"
            and seconds >= BARE_SECONDS_NOTED
            and _BARE_NUMBER.match(str(value))
        ):
            number = str(value).strip()
            click.echo(
                f"sql-lease: {param.opts[0]} {number} is read as seconds ({span(seconds)}); "
                f"write {number}ms for milliseconds",
                err=True,
            )
        return seconds

    def _bad(self, message: str, param: click.Parameter | None, ctx: click.Context | None) -> NoReturn:
        """On the command line: one line naming the option, exit 2; elsewhere click's BadParameter."""
        if ctx is None or param is None:
            self.fail(message, param, ctx)
        fail(2, f"{param.opts[0] if param.opts else param.name}: {message}")


DURATION = Duration()


url_option = click.option(
    "--url",
    default=None,
    is_eager=True,  # resolved first: a config file's table and schema are the other options' defaults
    callback=resolve_url,
    help=f"Database URL (postgresql://..., mysql://... or sqlite:///path). Else ${URL_ENV}, else `url` in the TOML "
    f"config file (${CONFIG_ENV}, else $XDG_CONFIG_HOME/sql-lease/config.toml, else "
    f"{SYSTEM_CONFIG}), else {DEFAULT_URL} in the working directory (said on stderr).",
)


table_option = click.option(
    "--table",
    "table_name",
    default=None,
    callback=config_default("table", DEFAULT_TABLE),
    help=f"Lease table name [default: the config file's `table`, else {DEFAULT_TABLE}].",
)


schema_option = click.option(
    "--schema",
    default=None,
    callback=config_default("schema", None),
    help="Schema (PostgreSQL) or database (MySQL) of the lease table [default: the config file's `schema`].",
)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


owner_required = click.option("--owner", required=True, help="Owner id of the lease.")


limit_option = click.option(
    "--limit",
    default=1,
    show_default=True,
    type=click.IntRange(1, MAX_LIMIT),
    help="A slot of a semaphore of this many slots: at most N holders of KEY at once; 1: a plain lease.",
)

ttl_option = click.option(
    "--ttl", default="30s", type=DURATION, show_default=True, help="Lease TTL (500ms, 30s, 5m, 1h30m, 2d)."
)


MAX_DATA_FILE_BYTES = 1 << 20
"""Most bytes ``--data @FILE`` / ``--data -`` read (the data itself is checked against 4096 bytes)."""


def _data_argument(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--data``'s JSON text: as given, read from the file after ``@``, or from stdin for ``-``;
    a file that cannot be read exits 2 naming it."""
    if value is None or ctx.resilient_parsing or not (value == "-" or value.startswith("@")):
        return value
    if value == "@":
        fail(2, "--data @: give a file name after @ (or - for stdin)")
    where = "stdin" if value == "-" else value[1:]
    try:
        if value == "-":
            raw = sys.stdin.buffer.read(MAX_DATA_FILE_BYTES + 1)
        else:
            with open(where, "rb") as f:
                raw = f.read(MAX_DATA_FILE_BYTES + 1)
        if len(raw) > MAX_DATA_FILE_BYTES:
            fail(2, f"--data {printable(value)}: more than {MAX_DATA_FILE_BYTES} bytes (lease data is at most 4096)")
        return raw.decode("utf-8")
    except OSError as exc:
        fail(2, f"--data {printable(value)}: {printable(where)} cannot be read: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(2, f"--data {printable(value)}: {printable(where)} is not UTF-8 text")


data_option = click.option(
    "--data",
    "data_json",
    default=None,
    callback=_data_argument,
    help="Lease data: a JSON object, e.g. '{\"job\": 42}', @FILE to read it from a file, or - for stdin "
    "(at most 4096 bytes).",
)


def parse_data(data_json: str | None) -> dict[str, Any] | None:
    """``--data`` parsed and checked as the providers check lease data; bad JSON or data exits 2."""
    import json

    from ..contract import encode_data

    if data_json is None:
        return None
    try:
        data = json.loads(data_json, object_pairs_hook=_unique_keys)
    except RecursionError:
        fail(2, "--data is nested too deep")
    except ValueError as exc:
        fail(2, f"--data is not valid JSON: {printable(str(exc))}")
    try:
        encode_data(data)
    except (TypeError, ValueError) as exc:
        fail(2, f"--data: {exc}")
    return data  # type: ignore[no-any-return]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict; ``ValueError`` naming a key given twice."""
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found:
            raise ValueError(f"the key {name!r} appears twice in one object")
        found[name] = value
    return found


def validated(check: Callable[[], object]) -> None:
    """Run a validator; its ``TypeError``/``ValueError`` is a usage error (exit 2)."""
    try:
        check()
    except (TypeError, ValueError) as exc:
        fail(2, str(exc))


def checked_ttl_ms(ttl: float) -> float:
    try:
        return validate_ttl_ms(ttl * 1000)
    except ValueError:
        fail(2, f"--ttl must be between 1ms and 365 days (8760h), got {ttl:g} s")

"""What the CLI prints: text safe for a terminal, durations, lease tables and JSON."""

from __future__ import annotations

import math
import sys
import unicodedata
from typing import Any

import click


def printable(text: object) -> str:
    """``text`` safe to print to a terminal: control characters (C0, DEL, C1), line and paragraph
    separators and invisible format characters (such as bidirectional overrides) are escaped as
    ``\\x1b``, ``\\r``, ``\\u2028``...; a backslash is doubled, so the escaping is unambiguous."""
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def as_given(text: str) -> str:
    """``text`` with the database URL of the current command shown as the user gave it: the
    library names it with its driver (``postgresql+asyncpg://``); the user typed ``postgresql://``.
    Passwords stay masked (both forms come from ``safe_url``)."""
    from ..sql.urls import safe_url, to_async_url

    ctx = click.get_current_context(silent=True)
    url = ctx.params.get("url") if ctx is not None else None
    if not isinstance(url, str):
        return text
    try:
        driver_form, given = safe_url(to_async_url(url)), safe_url(url)
    except ValueError:  # a URL that does not parse: no message names it
        return text
    return text.replace(driver_form, given) if driver_form != given else text


def expiry_words(remaining_ms: float | None) -> str:
    """``expires in 12s`` (whole seconds, rounded up), ``expires in 4m05s``, or ``expired``."""
    if remaining_ms is None:
        return "expiry unknown"
    if remaining_ms <= 0:
        return "expired"
    seconds = remaining_ms / 1000
    return f"expires in {math.ceil(seconds)}s" if seconds < 60 else f"expires in {span(seconds)}"


DATA_CELL_WIDTH = 60
"""Longest data cell in the ``list`` table, in characters (``--json`` and ``show`` print it whole)."""


def data_text(data: dict[str, Any] | None) -> str:
    """Lease data as compact JSON for people (non-ASCII kept, control characters escaped), or ``""``."""
    import json

    return "" if data is None else printable(json.dumps(data, ensure_ascii=False, separators=(",", ":")))


def expires_in(remaining_ms: float | None) -> str:
    """``29.5s``, ``4m05s``, ``2h03m``, ``3d04h``; ``expired 3.0s ago`` for a lease past its expiry."""
    if remaining_ms is None:
        return "?"
    seconds = remaining_ms / 1000
    if seconds <= 0:
        return f"expired {span(-seconds)} ago"
    return span(seconds)


def span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86_400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86_400}d{whole % 86_400 // 3600:02d}h"


def tenure_ms(lease: Any) -> float | None:
    """How long the tenure has lasted (ms; an expired one: until it expired) by the database's
    clock alone: ``expires_at`` minus ``acquired_at``, less the ``remaining_ms`` the database
    reported; None when the start is unknown."""
    if lease.acquired_at is None or lease.remaining_ms is None:
        return None
    held_ms: float = (lease.expires_at - lease.acquired_at).total_seconds() * 1000 - max(lease.remaining_ms, 0.0)
    return held_ms


def held_for(held_ms: float | None) -> str:
    """``12.5s``, ``4m05s``...; blank when unknown (a lease from before migration 0003)."""
    return "" if held_ms is None else span(max(held_ms, 0.0) / 1000)


def lease_json(lease: Any, read_row: bool = True) -> dict[str, Any]:
    """A lease for ``--json``; ``data``, ``acquired_at``, ``held_ms`` and ``released`` (kept by a
    minimum hold) only where the command read the row (list, show, transfer)."""
    fields = {
        "key": lease.key,
        "owner": lease.owner,
        "fence": lease.fence,
        "expires_at": lease.expires_at.isoformat(),
        "remaining_ms": round(lease.remaining_ms, 3) if lease.remaining_ms is not None else None,
        "expired": lease.remaining_ms is not None and lease.remaining_ms <= 0,
    }
    if not read_row:
        return fields
    held_ms = tenure_ms(lease)
    return {
        **fields,
        "data": lease.data,
        "acquired_at": lease.acquired_at.isoformat() if lease.acquired_at is not None else None,
        "held_ms": round(held_ms, 3) if held_ms is not None else None,
        "released": bool(getattr(lease, "released", False)),
    }


def print_json(value: object) -> None:
    import json

    click.echo(json.dumps(value, ensure_ascii=True, allow_nan=False))  # strict JSON: no NaN or Infinity


LIST_COLUMNS = ("KEY", "OWNER", "FENCE", "EXPIRES IN", "HELD FOR", "EXPIRES AT", "DATA")


def lease_cells(lease: Any, data_width: int | None = None) -> tuple[str, ...]:
    expires_at = lease.expires_at.isoformat(timespec="seconds")
    data = data_text(lease.data)
    if data_width is not None and len(data) > data_width:
        data = data[: data_width - 1] + "…"
    left = expires_in(lease.remaining_ms)
    if getattr(lease, "released", False) and lease.remaining_ms is not None and lease.remaining_ms > 0:
        left = f"released, kept {left}"  # by a minimum hold, until expires_at
    cells = printable(lease.key), printable(lease.owner), str(lease.fence), left
    return (*cells, held_for(tenure_ms(lease)), expires_at, data)


def rich_console() -> Any:
    """rich's console when rich is installed (the ``cli`` extra) and stdout is a terminal, else None."""
    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(highlight=False)


def render_leases(leases: list[Any], console: Any) -> None:
    """A table of ``leases``: rich on a terminal, else plain text aligned in columns."""
    rows = [lease_cells(lease, DATA_CELL_WIDTH) for lease in leases]
    if console is not None:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        table = Table(*LIST_COLUMNS, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))  # Text: no markup is interpreted
        console.print(table)
        return
    widths = [max([len(title)] + [len(row[i]) for row in rows]) for i, title in enumerate(LIST_COLUMNS)]
    for row in [LIST_COLUMNS, *rows]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def describe_lease(lease: Any) -> str:
    return (
        f"{printable(lease.key)}: held by {printable(lease.owner)} (fence {lease.fence}), "
        f"expires in {expires_in(lease.remaining_ms)} at {lease.expires_at.isoformat()}"
    )

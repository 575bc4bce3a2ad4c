"""`sql-lease list/show/break/acquire/renew/release/transfer/check` as scripts run them (issue 11)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from sql_lease.sql.migrate import HEAD_REVISION
from tests.support.cli import invoke
from tests.test_cli import CLI, run_cli, start_cli


@pytest.fixture(
    params=[
        "sqlite-default",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def db_args(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """None (the embedded SQLite default in the working directory, migrated here), or a PostgreSQL
    or MySQL URL and the test session's schema (MySQL: database)."""
    if request.param == "sqlite-default":
        assert invoke(["migrate"], tmp_path).returncode == 0
        return []
    url, schema = request.getfixturevalue("mysql_db" if request.param == "mysql" else "pg_schema")
    return ["--url", url, "--schema", schema]


@pytest.fixture
def ns() -> str:
    return f"op-{uuid.uuid4().hex[:8]}"


def test_scripted_lifecycle_exit_codes_and_fences(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key = f"{ns}:job"
    first = invoke(["acquire", key, "--owner", "a", "--ttl", "30s", *db_args], tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("fence=")
    fence = int(first.stdout.strip().removeprefix("fence="))

    refused = invoke(["acquire", key, "--owner", "b", "--ttl", "30s", *db_args], tmp_path)
    assert refused.returncode == 75 and "held by 'a'" in refused.stderr

    again = invoke(["acquire", key, "--owner", "a", "--json", *db_args], tmp_path)
    assert again.returncode == 0
    assert json.loads(again.stdout)["fence"] == fence  # the owner's retry keeps the fence

    renewed = invoke(["renew", key, "--owner", "a", "--ttl", "1m", "--json", *db_args], tmp_path)
    body = json.loads(renewed.stdout)
    assert renewed.returncode == 0 and body["renewed"] and body["fence"] == fence
    assert 50_000 < body["remaining_ms"] <= 60_000
    assert invoke(["renew", key, "--owner", "b", *db_args], tmp_path).returncode == 75

    moved = invoke(["transfer", key, "--from", "a", "--to", "b", "--ttl", "30s", *db_args], tmp_path)
    assert moved.returncode == 0, moved.stderr
    assert int(moved.stdout.strip().removeprefix("fence=")) > fence
    assert invoke(["transfer", key, "--from", "a", "--to", "c", *db_args], tmp_path).returncode == 75

    assert invoke(["release", key, "--owner", "a", *db_args], tmp_path).returncode == 75
    released = invoke(["release", key, "--owner", "b", "--json", *db_args], tmp_path)
    assert released.returncode == 0 and json.loads(released.stdout)["released"] is True
    assert invoke(["release", key, "--owner", "b", *db_args], tmp_path).returncode == 75


def _in_processes(cwd: Path, *commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """``commands`` as ``python -m sql_lease`` processes started together; their results in order."""
    procs = [start_cli(args, cwd) for args in commands]
    outputs = [p.communicate(timeout=60) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs, strict=True)]


def test_every_command_in_a_real_process(tmp_path: Path, ns: str) -> None:
    """Each command once as ``python -m sql_lease`` (the other tests here run it in process): the
    entry point, exit codes and output through real streams. Real processes elsewhere: break and
    list (the terminal and --watch tests below), migrate and exec (tests/test_cli.py)."""
    key = f"{ns}:smoke"
    assert invoke(["migrate"], tmp_path).returncode == 0
    checked, swept, acquired = _in_processes(tmp_path, ["check"], ["sweep"], ["acquire", key, "--owner", "a"])
    assert checked.returncode == 0 and "ok    schema" in checked.stdout, checked.stdout
    assert swept.returncode == 0 and swept.stdout.startswith("removed "), swept.stdout
    assert acquired.returncode == 0 and acquired.stdout.startswith("fence="), acquired.stderr
    renewed, status, shown = _in_processes(
        tmp_path, ["renew", key, "--owner", "a"], ["status", key], ["show", key, "--json"]
    )
    assert renewed.returncode == 0, renewed.stderr
    assert status.returncode == 0 and "held by a" in status.stdout
    assert json.loads(shown.stdout)["owner"] == "a"
    assert run_cli(["transfer", key, "--from", "a", "--to", "b"], tmp_path).returncode == 0
    refused = run_cli(["release", key, "--owner", "a"], tmp_path)
    assert refused.returncode == 75 and "is not held by 'a'" in refused.stderr, refused.stderr


def test_an_empty_list_names_its_prefix_escaped_once(db_args: list[str], tmp_path: Path, ns: str) -> None:
    """A prefix with a backslash and a control character, as the keys are printed: each escaped once."""
    empty = invoke(["list", "--prefix", f"{ns}:res\\0\x1b", *db_args], tmp_path)
    assert empty.returncode == 0, empty.stderr
    assert f"no leases starting with '{ns}:res\\\\0\\x1b'" in empty.stdout, empty.stdout


def test_list_json_and_plain(db_args: list[str], tmp_path: Path, ns: str) -> None:
    for suffix, owner in [("b", "bob"), ("a", "ann")]:
        assert invoke(["acquire", f"{ns}:{suffix}", "--owner", owner, *db_args], tmp_path).returncode == 0
    assert invoke(["acquire", f"{ns}:old", "--owner", "x", "--ttl", "1ms", *db_args], tmp_path).returncode == 0

    listed = invoke(["list", "--prefix", f"{ns}:", "--json", *db_args], tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["key"], r["owner"]) for r in rows] == [(f"{ns}:a", "ann"), (f"{ns}:b", "bob")]
    assert set(rows[0]) == {
        *("key", "owner", "fence", "expires_at", "remaining_ms", "expired", "data", "acquired_at", "held_ms"),
        "released",
    }
    assert rows[0]["expired"] is False and rows[0]["remaining_ms"] > 0 and rows[0]["held_ms"] >= 0

    with_expired = json.loads(invoke(["list", "--prefix", ns, "--all", "--json", *db_args], tmp_path).stdout)
    assert [r["key"] for r in with_expired] == [f"{ns}:a", f"{ns}:b", f"{ns}:old"]
    assert with_expired[2]["expired"] is True

    limited = invoke(["list", "--prefix", ns, "--limit", "1", "--json", *db_args], tmp_path)
    assert [r["key"] for r in json.loads(limited.stdout)] == [f"{ns}:a"]
    assert "--limit" in limited.stderr

    plain = invoke(["list", "--prefix", ns, *db_args], tmp_path)  # piped: plain aligned text
    lines = plain.stdout.splitlines()
    assert lines[0].split() == ["KEY", "OWNER", "FENCE", "EXPIRES", "IN", "HELD", "FOR", "EXPIRES", "AT", "DATA"]
    assert lines[1].split()[:2] == [f"{ns}:a", "ann"] and lines[2].split()[:2] == [f"{ns}:b", "bob"]
    assert lines[1].index("ann") == lines[0].index("OWNER")
    assert "no leases" in invoke(["list", "--prefix", f"{ns}:zz", *db_args], tmp_path).stdout


def _sync_provider(db_args: list[str], tmp_path: Path) -> Any:
    """The database of ``db_args`` (the CLI's options) as a synchronous provider."""
    from sql_lease import SyncSqlLeaseProvider

    if not db_args:
        return SyncSqlLeaseProvider(f"sqlite:///{tmp_path}/sql_lease.db")
    return SyncSqlLeaseProvider(db_args[1], schema=db_args[3])


def test_any_str_key_lists_exactly_in_json_and_escaped_in_text(db_args: list[str], tmp_path: Path, ns: str) -> None:
    keys = [f"{ns}:resource\x00thread", f"{ns}:resource\x01\x01thread", f"{ns}:resource\\x00thread", f"{ns}:\udcff"]
    with _sync_provider(db_args, tmp_path) as leases:
        for i, key in enumerate(keys):
            assert leases.acquire_lease(key, f"o{i}", 60_000).acquired
    listed = invoke(["list", "--prefix", ns, "--json", *db_args], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert {(row["key"], row["owner"]) for row in json.loads(listed.stdout)} == {
        (k, f"o{i}") for i, k in enumerate(keys)
    }
    narrowed = invoke(["list", "--prefix", f"{ns}:resource\\", "--json", *db_args], tmp_path)
    assert [row["key"] for row in json.loads(narrowed.stdout)] == [keys[2]]

    plain = invoke(["list", "--prefix", ns, *db_args], tmp_path).stdout
    cells = {line.split()[0]: line.split()[1] for line in plain.splitlines()[1:]}
    assert cells == {
        f"{ns}:resource\\x00thread": "o0",
        f"{ns}:resource\\x01\\x01thread": "o1",
        f"{ns}:resource\\\\x00thread": "o2",  # a backslash is doubled: the escaping is unambiguous
        f"{ns}:\\udcff": "o3",
    }
    # an argument that is not UTF-8 (the byte 0xff) reaches Python as a lone surrogate: a key like any other
    status = invoke(["status", keys[3], *db_args], tmp_path)
    assert status.returncode == 0 and status.stdout.startswith(f"{ns}:\\udcff: held by"), status.stdout


def test_list_watch_prints_one_json_array_per_refresh(db_args: list[str], tmp_path: Path, ns: str) -> None:
    assert invoke(["acquire", f"{ns}:w", "--owner", "o", *db_args], tmp_path).returncode == 0
    with subprocess.Popen(
        [*CLI, "list", "--prefix", ns, "--json", "--watch", "200ms", *db_args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            snapshots = [json.loads(proc.stdout.readline()) for _ in range(3)]
        finally:
            proc.kill()
    assert all([r["key"] for r in snap] == [f"{ns}:w"] for snap in snapshots)


def test_show(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key = f"{ns}:s"
    free = invoke(["show", key, "--json", *db_args], tmp_path)
    assert free.returncode == 1 and json.loads(free.stdout) is None
    assert invoke(["show", key, *db_args], tmp_path).stdout.strip().endswith("free")
    assert invoke(["acquire", key, "--owner", "o", *db_args], tmp_path).returncode == 0
    held = invoke(["show", key, "--json", *db_args], tmp_path)
    assert held.returncode == 0 and json.loads(held.stdout)["owner"] == "o"
    text = invoke(["show", key, *db_args], tmp_path)
    assert text.returncode == 0 and "owner:      o" in text.stdout and "held for:" in text.stdout


def test_break(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key = f"{ns}:stuck"
    fence = int(invoke(["acquire", key, "--owner", "dead", *db_args], tmp_path).stdout.strip().removeprefix("fence="))
    refused = invoke(["break", key, *db_args], tmp_path)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert invoke(["show", key, *db_args], tmp_path).returncode == 0  # still held

    broken = invoke(["break", key, "--yes", "--json", *db_args], tmp_path)
    assert broken.returncode == 0, broken.stderr
    assert (json.loads(broken.stdout)["owner"], json.loads(broken.stdout)["fence"]) == ("dead", fence)
    nothing = invoke(["break", key, "--yes", *db_args], tmp_path)
    assert nothing.returncode == 1 and "nothing to break" in nothing.stdout
    after = invoke(["acquire", key, "--owner", "next", *db_args], tmp_path)
    assert int(after.stdout.strip().removeprefix("fence=")) > fence


def test_break_with_a_fence_leaves_a_new_tenure_alone(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key = f"{ns}:tenure"
    old = int(invoke(["acquire", key, "--owner", "a", *db_args], tmp_path).stdout.strip().removeprefix("fence="))
    assert invoke(["release", key, "--owner", "a", *db_args], tmp_path).returncode == 0
    new = int(invoke(["acquire", key, "--owner", "b", *db_args], tmp_path).stdout.strip().removeprefix("fence="))
    stale = invoke(["break", key, "--yes", "--fence", str(old), *db_args], tmp_path)
    assert stale.returncode == 1 and "held by b" in stale.stderr and f"fence {new}" in stale.stderr, stale
    assert "Traceback" not in stale.stderr
    assert invoke(["show", key, *db_args], tmp_path).returncode == 0  # still b's
    for bad in ("0", "-3", "x", str(2**63)):
        refused = invoke(["break", key, "--yes", "--fence", bad, *db_args], tmp_path)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused
    broken = invoke(["break", key, "--yes", "--json", "--fence", str(new), *db_args], tmp_path)
    assert broken.returncode == 0 and json.loads(broken.stdout)["fence"] == new
    assert invoke(["show", key, *db_args], tmp_path).returncode == 1


def test_break_with_a_fence_no_tenure_had_says_so(db_args: list[str], tmp_path: Path, ns: str) -> None:
    """A mistyped --fence: the lease has not changed hands, so the refusal says which fence it has."""
    key = f"{ns}:typo"
    fence = int(invoke(["acquire", key, "--owner", "a", *db_args], tmp_path).stdout.strip().removeprefix("fence="))
    refused = invoke(["break", key, "--fence", str(fence + 76), "--yes", *db_args], tmp_path)
    assert refused.returncode == 1 and "changed hands" not in refused.stderr, refused.stderr
    assert f"no tenure with fence {fence + 76}" in refused.stderr and f"(fence {fence})" in refused.stderr
    assert invoke(["show", key, *db_args], tmp_path).returncode == 0


def test_lease_data(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key = f"{ns}:d"
    data = {"host": "build-3", "pid": 4242, "job": "nightly-report", "note": "ü" * 70}
    taken = invoke(["acquire", key, "--owner", "a", "--data", json.dumps(data), *db_args], tmp_path)
    assert taken.returncode == 0, taken.stderr
    (row,) = json.loads(invoke(["list", "--prefix", ns, "--json", *db_args], tmp_path).stdout)
    assert row["data"] == data
    text = invoke(["show", key, *db_args], tmp_path).stdout
    assert 'data:       {"host":"build-3","pid":4242,' in text and "ü" * 70 in text  # show prints it whole
    header, line = invoke(["list", "--prefix", ns, *db_args], tmp_path).stdout.splitlines()
    cell = line[header.index("DATA") :]
    assert cell.startswith('{"host":"build-3"') and cell.endswith("…") and len(cell) == 60

    moved = invoke(["transfer", key, "--from", "a", "--to", "b", "--data", '{"job": 2}', "--json", *db_args], tmp_path)
    assert moved.returncode == 0 and json.loads(moved.stdout)["data"] == {"job": 2}
    refused = invoke(["acquire", f"{key}2", "--owner", "c", "--data", '{"job": ', *db_args], tmp_path)
    assert refused.returncode == 2 and "--data is not valid JSON" in refused.stderr, refused.stderr
    refused = invoke(["transfer", key, "--from", "b", "--to", "c", "--data", '{"x": NaN}', *db_args], tmp_path)
    assert refused.returncode == 2 and "NaN" in refused.stderr, refused.stderr
    after = json.loads(invoke(["list", "--prefix", ns, "--json", *db_args], tmp_path).stdout)
    assert [(r["key"], r["owner"], r["data"]) for r in after] == [(key, "b", {"job": 2})]  # nothing written


def _run_on_terminal(args: list[str], cwd: Path, answer: bytes) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as stdin/stdout, type ``answer``; (exit code, output)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    output = b""
    sent = False
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
        if not sent and b"[y/N]" in output:
            os.write(controller, answer)
            sent = True
    os.close(controller)
    return proc.wait(timeout=60), output.decode(errors="replace")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty behaviour checked on Linux")
def test_break_on_a_terminal_with_a_fence_finds_any_slot_of_a_semaphore(tmp_path: Path, ns: str) -> None:
    """`acquire --limit 2` twice makes a semaphore; `break --fence` of the newer slot on a terminal
    shows that holder, breaks it alone on "y"; answering "n" to the whole semaphore exits 1."""
    key = f"{ns}:sem"
    fences = []
    for owner in ("a", "b"):
        done = invoke(["acquire", key, "--owner", owner, "--limit", "2", "--json"], tmp_path)
        assert done.returncode == 0, done.stderr
        fences.append(json.loads(done.stdout)["fence"])
    full = invoke(["acquire", key, "--owner", "c", "--limit", "2"], tmp_path)
    assert full.returncode == 75 and "2 of 2 slots held: 'a', 'b'" in full.stderr, full.stderr
    code, output = _run_on_terminal(["break", key], tmp_path, b"n\n")
    assert code == 1 and "Break all 2?" in output and "not broken" in output, output
    code, output = _run_on_terminal(["break", key, "--fence", str(fences[1])], tmp_path, b"y\n")
    assert code == 0 and "held by b" in output and f"fence {fences[1]}" in output, output
    holders = json.loads(invoke(["list", "--json"], tmp_path).stdout)
    assert [(lease["key"], lease["owner"]) for lease in holders] == [(key, "a")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty behaviour checked on Linux")
def test_break_asks_on_a_terminal(tmp_path: Path, ns: str) -> None:
    key = f"{ns}:ask"
    assert invoke(["migrate"], tmp_path).returncode == 0
    assert invoke(["acquire", key, "--owner", "dead"], tmp_path).returncode == 0
    code, output = _run_on_terminal(["break", key], tmp_path, b"n\n")
    assert code == 1 and "held by dead" in output and "not broken" in output
    code, output = _run_on_terminal(["break", key], tmp_path, b"y\n")
    assert code == 0 and "broke" in output
    assert invoke(["show", key], tmp_path).returncode == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty behaviour checked on Linux")
def test_break_on_a_terminal_breaks_the_tenure_it_showed(tmp_path: Path, ns: str) -> None:
    """The lease changes hands while the prompt waits: the answer "y" breaks nothing."""
    key = f"{ns}:shown"
    assert invoke(["migrate"], tmp_path).returncode == 0
    assert invoke(["acquire", key, "--owner", "dead"], tmp_path).returncode == 0
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([*CLI, "break", key], cwd=tmp_path, stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    output = b""
    while b"[y/N]" not in output:
        chunk = os.read(controller, 4096)
        assert chunk, output
        output += chunk
    assert b"held by dead" in output
    assert invoke(["transfer", key, "--from", "dead", "--to", "alive"], tmp_path).returncode == 0
    os.write(controller, b"y\n")
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert proc.wait(timeout=60) == 1
    assert b"changed hands" in output and b"held by alive" in output
    shown = invoke(["show", key], tmp_path)
    assert shown.returncode == 0 and "alive" in shown.stdout


def test_control_characters_are_escaped(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key, owner = f"{ns}:\x1b[2Jkey", "evil\x1b]0;title\x07\r\nforged\u2028"
    assert invoke(["acquire", key, "--owner", owner, *db_args], tmp_path).returncode == 0
    refused = invoke(["acquire", key, "--owner", "other", *db_args], tmp_path)
    for result in (
        invoke(["list", "--prefix", ns, *db_args], tmp_path),
        invoke(["show", key, *db_args], tmp_path),
        refused,
        invoke(["list", "--prefix", ns, "--json", *db_args], tmp_path),
        invoke(["break", key, "--yes", *db_args], tmp_path),
    ):
        printed = result.stdout + result.stderr
        assert "\x1b" not in printed and "\x07" not in printed and "\r" not in printed and "\u2028" not in printed
        assert "forged" in printed
    listed = invoke(["list", "--prefix", ns, "--json", *db_args], tmp_path)
    assert json.loads(listed.stdout) == []  # broken above
    assert json.loads(invoke(["acquire", key, "--owner", owner, "--json", *db_args], tmp_path).stdout)["owner"] == owner


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    assert invoke(["acquire", "k", "--owner", "o", "--ttl", "0s"], tmp_path).returncode == 2
    assert invoke(["acquire", "", "--owner", "o"], tmp_path).returncode == 2
    assert invoke(["acquire", "k"], tmp_path).returncode == 2  # --owner is required
    assert invoke(["list", "--limit", "0"], tmp_path).returncode == 2
    assert invoke(["list", "--prefix", "x" * 600], tmp_path).returncode == 2
    assert invoke(["show", "k" * 600], tmp_path).returncode == 2


def test_database_failure_and_missing_table_codes(tmp_path: Path) -> None:
    down = invoke(["acquire", "k", "--owner", "o", "--url", "postgresql://u:hunter2@127.0.0.1:1/db"], tmp_path)
    assert down.returncode == 69 and "hunter2" not in down.stderr
    missing = invoke(["list", "--url", f"sqlite:///{tmp_path}/none.db"], tmp_path)
    assert missing.returncode == 78 and "sql-lease migrate" in missing.stderr


def test_check_on_sqlite(tmp_path: Path) -> None:
    fresh = invoke(["check", "--url", f"sqlite:///{tmp_path}/none.db"], tmp_path)
    assert fresh.returncode == 78 and "sql-lease migrate" in fresh.stdout
    assert invoke(["migrate"], tmp_path).returncode == 0
    good = invoke(["check", "--json"], tmp_path)
    assert good.returncode == 0, good.stdout
    checks = {c["name"]: c for c in json.loads(good.stdout)}
    assert checks["database"]["ok"] and checks["schema"]["ok"] and checks["privileges"]["ok"]
    assert checks["clock"]["ok"] is None and "clock" in checks["clock"]["detail"]


@pytest.mark.postgres
def test_check_on_postgres(pg_schema: tuple[str, str], fresh_pg_schema: str, tmp_path: Path) -> None:
    url, schema = pg_schema
    good = invoke(["check", "--url", url, "--schema", schema], tmp_path)
    assert good.returncode == 0, good.stdout
    assert "ok    privileges" in good.stdout and "at revision" in good.stdout and "clock" in good.stdout
    missing = invoke(["check", "--url", url, "--schema", fresh_pg_schema], tmp_path)
    assert missing.returncode == 78
    assert f"sql-lease migrate --url {url} --schema {fresh_pg_schema}" in missing.stdout


@pytest.mark.postgres
def test_check_names_missing_grants(pg_schema: tuple[str, str], tmp_path: Path) -> None:
    url, schema = pg_schema
    role = f"sql_lease_check_{uuid.uuid4().hex[:8]}"
    admin = ["psql", url.replace("postgresql+asyncpg://", "postgresql://"), "-q", "-v", "ON_ERROR_STOP=1", "-c"]
    subprocess.run(
        [
            *admin,
            f'CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA "{schema}" TO {role}; '
            f'GRANT SELECT, INSERT ON "{schema}".sql_leases TO {role};',
        ],
        check=True,
        capture_output=True,
    )
    try:
        from sqlalchemy.engine import make_url

        role_url = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
        result = invoke(["check", "--url", role_url, "--schema", schema], tmp_path)
        assert result.returncode == 78, result.stdout
        assert (
            "FAIL  privileges" in result.stdout and "UPDATE" in result.stdout and "USAGE on sequence" in result.stdout
        )
    finally:
        subprocess.run([*admin, f"DROP OWNED BY {role}; DROP ROLE {role};"], check=False, capture_output=True)


def test_data_with_a_duplicate_key_is_refused(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key = f"{ns}:dup"
    for bad in ('{"job": 1, "job": 2}', '{"a": {"b": 1, "b": 1}}', '{"a": ' + "[" * 3000 + "]" * 3000 + "}"):
        refused = invoke(["acquire", key, "--owner", "a", "--data", bad, *db_args], tmp_path)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "appears twice" in invoke(["acquire", key, "--owner", "a", "--data", '{"j":1,"j":1}'], tmp_path).stderr
    assert invoke(["show", key, *db_args], tmp_path).returncode == 1  # nothing acquired


def test_release_renew_transfer_scoped_to_a_fence(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key = f"{ns}:fenced"
    old = int(invoke(["acquire", key, "--owner", "run", *db_args], tmp_path).stdout.strip().removeprefix("fence="))
    assert invoke(["break", key, "--yes", "--fence", str(old), *db_args], tmp_path).returncode == 0
    new = int(invoke(["acquire", key, "--owner", "run", *db_args], tmp_path).stdout.strip().removeprefix("fence="))
    for command in (["renew", key, "--owner", "run"], ["release", key, "--owner", "run"]):
        stale = invoke([*command, "--fence", str(old), *db_args], tmp_path)
        assert stale.returncode == 75 and f"with fence {old}" in stale.stderr, stale
    stale = invoke(["transfer", key, "--from", "run", "--to", "next", "--fence", str(old), *db_args], tmp_path)
    assert stale.returncode == 75, stale
    assert json.loads(invoke(["show", key, "--json", *db_args], tmp_path).stdout)["fence"] == new
    for bad in ("0", "-3", "x", str(2**63)):
        refused = invoke(["release", key, "--owner", "run", "--fence", bad, *db_args], tmp_path)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused
    renewed = invoke(["renew", key, "--owner", "run", "--fence", str(new), *db_args], tmp_path)
    assert renewed.returncode == 0, renewed.stderr
    moved = invoke(["transfer", key, "--from", "run", "--to", "next", "--fence", str(new), *db_args], tmp_path)
    assert moved.returncode == 0, moved.stderr
    after = int(moved.stdout.strip().removeprefix("fence="))
    assert invoke(["release", key, "--owner", "next", "--fence", str(after), *db_args], tmp_path).returncode == 0


def test_a_release_with_a_minimum_hold_shows_as_kept(db_args: list[str], tmp_path: Path, ns: str) -> None:
    key = f"{ns}:kept"
    assert invoke(["acquire", key, "--owner", "cron", *db_args], tmp_path).returncode == 0
    assert invoke(["release", key, "--owner", "cron", "--min-hold", "1h", *db_args], tmp_path).returncode == 0
    shown = json.loads(invoke(["show", key, "--json", *db_args], tmp_path).stdout)
    assert shown["released"] is True and 3_500_000 < shown["remaining_ms"] <= 3_600_000
    text = invoke(["show", key, *db_args], tmp_path).stdout
    assert "released, kept 59m" in text, text
    status = invoke(["status", key, *db_args], tmp_path).stdout
    assert f"{key}: released by cron" in status and "kept until" in status, status
    listed = invoke(["list", "--prefix", key, *db_args], tmp_path).stdout
    assert "released, kept" in listed, listed
    assert invoke(["acquire", key, "--owner", "other", *db_args], tmp_path).returncode == 75
    assert invoke(["release", key, "--owner", "cron", "--min-hold", "-1s", *db_args], tmp_path).returncode == 2


@pytest.mark.mysql
def test_check_on_mysql(mysql_db: tuple[str, str], tmp_path: Path) -> None:
    url, database = mysql_db
    good = invoke(["check", "--url", url, "--schema", database], tmp_path)
    assert good.returncode == 0, good.stdout
    assert "ok    privileges  user root@" in good.stdout and f"at revision {HEAD_REVISION} (head)" in good.stdout, (
        good.stdout
    )
    assert "MariaDB" in good.stdout or "MySQL" in good.stdout


@pytest.mark.mysql
def test_check_names_missing_mysql_grants(tmp_path: Path) -> None:
    """A least-privilege user (the grants of docs/operations.md) passes ``check``, its revision
    unknown to it (no SELECT on the version table), and runs semaphores (EXECUTE on migration 0009's
    procedures); without UPDATE on the lease table, DELETE on the fence counter or EXECUTE on a slot
    procedure, the privileges line fails naming what is missing, and a semaphore acquire is a LeaseConfigError."""
    from sqlalchemy.engine import make_url

    from sql_lease import LeaseConfigError, SyncSqlLeaseProvider
    from tests.conftest import MYSQL_URL, mysql_execute

    database, user = f"sql_lease_c_{uuid.uuid4().hex[:8]}", f"lease_check_{uuid.uuid4().hex[:8]}"
    mysql_execute(MYSQL_URL, f"CREATE DATABASE `{database}`", f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-{user}'")
    try:
        assert invoke(["migrate", "--url", MYSQL_URL, "--schema", database], tmp_path).returncode == 0
        mysql_execute(
            MYSQL_URL,
            *(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.`{table}` TO '{user}'@'%'"
                for table in ("sql_leases", "sql_leases_fence", "sql_leases_fences", "sql_leases_slots")
            ),
            *(
                f"GRANT EXECUTE ON PROCEDURE `{database}`.`{procedure}` TO '{user}'@'%'"
                for procedure in ("sql_leases_slot_acquire", "sql_leases_slot_release")
            ),
        )
        as_user = make_url(MYSQL_URL).set(username=user, password=f"pw-{user}", database=database)
        args = ["check", "--url", as_user.render_as_string(hide_password=False)]
        good = invoke(args, tmp_path)
        assert good.returncode == 0, good.stdout
        assert f"ok    privileges  user {user}@% has SELECT, INSERT, UPDATE, DELETE on `sql_leases`" in good.stdout
        assert "info  schema      lease table sql_leases exists; its revision is unknown to this user" in good.stdout
        assert "and EXECUTE on the slot procedures" in good.stdout, good.stdout
        with SyncSqlLeaseProvider(as_user.render_as_string(hide_password=False)) as provider:
            assert provider.acquire_lease("sem", "a", 60_000, limit=2).acquired
            assert provider.release_lease("sem", "a")
        mysql_execute(
            MYSQL_URL,
            f"REVOKE UPDATE ON `{database}`.`sql_leases` FROM '{user}'@'%'",
            f"REVOKE DELETE ON `{database}`.`sql_leases_fence` FROM '{user}'@'%'",
            f"REVOKE EXECUTE ON PROCEDURE `{database}`.`sql_leases_slot_acquire` FROM '{user}'@'%'",
        )
        lacking = invoke(args, tmp_path)
        assert lacking.returncode == 78, lacking.stdout
        assert "FAIL  privileges" in lacking.stdout
        assert "lacks UPDATE on `sql_leases`; DELETE on `sql_leases_fence`; EXECUTE on procedure " in lacking.stdout
        assert "`sql_leases_slot_acquire`" in lacking.stdout and "_slot_release`" not in lacking.stdout, lacking.stdout
        denied = pytest.raises(LeaseConfigError, match="privilege")
        with SyncSqlLeaseProvider(as_user.render_as_string(hide_password=False)) as provider, denied:
            provider.acquire_lease("sem", "a", 60_000, limit=2)
        assert f"pw-{user}" not in lacking.stdout + lacking.stderr
    finally:
        mysql_execute(MYSQL_URL, f"DROP USER IF EXISTS '{user}'@'%'", f"DROP DATABASE IF EXISTS `{database}`")

"""`sql-lease` as a user runs it: exec (flock(1) for a fleet), migrate, status, sweep."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sql_lease import SqlLeaseProvider
from sql_lease.sql.migrate import HEAD_REVISION
from tests.support.cli import invoke

CLI = [sys.executable, "-m", "sql_lease"]


def run_cli(args: list[str], cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=60, **kwargs)


def start_cli(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def process_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.fixture(
    params=[
        "sqlite-default",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def db_args(request: pytest.FixtureRequest) -> list[str]:
    """Extra CLI arguments: none (the embedded SQLite default in the working directory), or a
    PostgreSQL or MySQL URL and the test session's schema (MySQL: database)."""
    if request.param == "sqlite-default":
        return []
    url, schema = request.getfixturevalue("mysql_db" if request.param == "mysql" else "pg_schema")
    return ["--url", url, "--schema", schema]


@pytest.mark.slow
def test_two_concurrent_execs_one_runs_one_is_refused(db_args: list[str], tmp_path: Path) -> None:
    key = f"job-{uuid.uuid4().hex[:8]}"
    started, go = tmp_path / "started", tmp_path / "go"
    first = start_cli(
        [
            "exec",
            key,
            *db_args,
            "--owner",
            "first",
            "--",
            "sh",
            "-c",
            f'touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; echo "fence=$SQL_LEASE_FENCE"; exit 3',
        ],
        tmp_path,
    )
    wait_for(started)
    second = run_cli(["exec", key, *db_args, "--", "touch", str(tmp_path / "second-ran")], tmp_path)
    assert second.returncode == 75, second.stderr
    assert "held by 'first'" in second.stderr
    assert not (tmp_path / "second-ran").exists()
    status = invoke(["status", key, *db_args], tmp_path)
    assert status.returncode == 0 and "held by first" in status.stdout
    go.touch()
    out, err = first.communicate(timeout=30)
    assert first.returncode == 3, err
    assert out.strip().startswith("fence=") and int(out.strip()[6:]) > 0
    # released on exit: the next run gets it at once
    third = run_cli(["exec", key, *db_args, "--", "true"], tmp_path)
    assert third.returncode == 0, third.stderr
    assert invoke(["status", key, *db_args], tmp_path).returncode == 1
    if not db_args:
        assert (tmp_path / "sql_lease.db").exists()  # the embedded default, created on first use


def test_exec_passes_exit_status_and_lease_environment(tmp_path: Path) -> None:
    done = run_cli(
        ["exec", "k", "--owner", "me", "--", "sh", "-c", 'echo "$SQL_LEASE_KEY $SQL_LEASE_OWNER"; exit 7'], tmp_path
    )
    assert done.returncode == 7
    assert done.stdout.strip() == "k me"


def test_exec_reports_signal_death_like_a_shell(tmp_path: Path) -> None:
    done = run_cli(["exec", "k", "--", "sh", "-c", "kill -TERM $$"], tmp_path)
    assert done.returncode == 128 + signal.SIGTERM


def test_exec_missing_command(tmp_path: Path) -> None:
    done = run_cli(["exec", "k", "--", "no-such-command-xyz"], tmp_path)
    assert done.returncode == 127 and "not found" in done.stderr
    assert invoke(["status", "k"], tmp_path).returncode == 1  # the lease was released


def test_exec_rejects_bad_arguments(tmp_path: Path) -> None:
    assert invoke(["exec", "k", "--ttl", "soon", "--", "true"], tmp_path).returncode == 2
    assert invoke(["exec", "k", "--ttl", "0s", "--", "true"], tmp_path).returncode == 2
    assert invoke(["exec", "", "--", "true"], tmp_path).returncode == 2
    assert invoke(["exec", "k", "--timeout", "1s", "--", "true"], tmp_path).returncode == 2
    assert not (tmp_path / "sql_lease.db").exists()  # nothing was created


@pytest.mark.slow
def test_exec_wait_takes_over_after_the_holder_exits(tmp_path: Path) -> None:
    # The holder works until the test says so (a fixed sleep raced a slow interpreter start).
    script = f"touch {tmp_path}/s; i=0; while [ ! -e {tmp_path}/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"
    first = start_cli(["exec", "w", "--owner", "first", "--", "sh", "-c", script], tmp_path)
    patient = None
    try:
        wait_for(tmp_path / "s")
        impatient = run_cli(["exec", "w", "--wait", "--timeout", "200ms", "--", "true"], tmp_path)
        assert impatient.returncode == 75 and "held by 'first'" in impatient.stderr
        patient = start_cli(["exec", "w", "--wait", "--timeout", "20s", "--", "echo", "got it"], tmp_path)
        (tmp_path / "go").touch()
        out, _ = patient.communicate(timeout=30)
        assert patient.returncode == 0 and out.strip() == "got it"
        first.communicate(timeout=10)
        assert first.returncode == 0
    finally:
        for proc in (first, patient):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.mark.slow
def test_exec_terminates_the_command_when_the_lease_is_lost(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sql_lease.db"
    proc = start_cli(
        [
            "exec",
            "lost",
            "--ttl",
            "3s",
            "--owner",
            "victim",
            "--kill-after",
            "2s",
            "--allow-kill-after-beyond-ttl",  # longer than TTL/10: the trap gets time to run
            "--",
            "sh",
            "-c",
            f"touch {tmp_path}/s; trap 'touch {tmp_path}/got-term; exit 0' TERM; while true; do sleep 0.05; done",
        ],
        tmp_path,
    )
    wait_for(tmp_path / "s")

    async def steal() -> bool:
        async with SqlLeaseProvider(url) as provider:
            return await provider.transfer_lease("lost", "victim", "thief", 60_000)

    assert asyncio.run(steal())
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 76, err
    assert "lost" in err
    assert (tmp_path / "got-term").exists()


@pytest.mark.slow
def test_sigterm_to_exec_is_forwarded_and_the_lease_released(tmp_path: Path) -> None:
    proc = start_cli(
        ["exec", "sig", "--", "sh", "-c", f"trap 'exit 9' TERM; touch {tmp_path}/s; while true; do sleep 0.05; done"],
        tmp_path,
    )
    wait_for(tmp_path / "s")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == 9
    assert invoke(["status", "sig"], tmp_path).returncode == 1


@pytest.mark.postgres
def test_postgres_is_never_migrated_implicitly(pg_url: str, fresh_pg_schema: str, tmp_path: Path) -> None:
    args = ["--url", pg_url, "--schema", fresh_pg_schema]
    done = run_cli(["exec", "k", *args, "--", "true"], tmp_path)
    assert done.returncode == 78 and "sql-lease migrate" in done.stderr
    migrated = invoke(["migrate", *args], tmp_path)
    assert migrated.returncode == 0 and f"revision {HEAD_REVISION}" in migrated.stdout
    assert invoke(["migrate", *args], tmp_path).returncode == 0  # idempotent
    assert run_cli(["exec", "k", *args, "--", "true"], tmp_path).returncode == 0


def test_migrate_sql_prints_ddl_without_password(tmp_path: Path) -> None:
    done = invoke(["migrate", "--sql", "--url", "postgresql://deploy:hunter2@db.example/app"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "CREATE TABLE sql_leases" in done.stdout and "hunter2" not in done.stdout + done.stderr


def test_unreachable_database_exit_code_hides_password(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run_cli(["exec", "k", "--url", f"postgresql://u:hunter2@127.0.0.1:{port}/db", "--", "true"], tmp_path)
    assert done.returncode == 69
    assert "hunter2" not in done.stdout + done.stderr


@pytest.mark.slow
def test_sweep_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sql_lease.db"

    async def setup() -> None:
        async with SqlLeaseProvider(url) as provider:
            await provider.migrate()
            for i in range(5):
                await provider.acquire_lease(f"old{i}", "o", 1)
            await provider.acquire_lease("live", "o", 60_000)

    asyncio.run(setup())
    time.sleep(0.05)
    done = invoke(["sweep", "--url", url, "--batch-size", "2"], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "removed 5 expired lease(s)"
    assert invoke(["status", "live", "--url", url], tmp_path).returncode == 0


def test_version_and_help(tmp_path: Path) -> None:
    assert invoke(["--version"], tmp_path).returncode == 0
    help_text = invoke(["exec", "--help"], tmp_path).stdout
    assert "flock(1) for a fleet" in help_text and "75" in help_text


def test_env_url_is_used(tmp_path: Path) -> None:
    env = dict(os.environ, SQL_LEASE_URL=f"sqlite:///{tmp_path}/from_env.db")
    done = subprocess.run([*CLI, "exec", "k", "--", "true"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "from_env.db").exists() and not (tmp_path / "sql_lease.db").exists()


def test_exec_requires_the_double_dash(tmp_path: Path) -> None:
    done = invoke(["exec", "k", "ls", "-la"], tmp_path)
    assert done.returncode == 2 and "put -- before the command" in done.stderr
    passthrough = run_cli(["exec", "k", "--", "echo", "--ttl", "5s"], tmp_path)
    assert passthrough.returncode == 0 and passthrough.stdout.strip() == "--ttl 5s"


def test_exec_rejects_out_of_range_ttl_before_touching_the_database(tmp_path: Path) -> None:
    done = invoke(["exec", "k", "--ttl", "9000h", "--", "true"], tmp_path)
    assert done.returncode == 2 and "365 days" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "sql_lease.db").exists()
    sweep = invoke(["sweep", "--grace", "100000h"], tmp_path)
    assert sweep.returncode == 2 and "Traceback" not in sweep.stderr


def test_exec_unrunnable_files_exit_126(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x7fELF not really")
    junk.chmod(0o755)
    bad_interpreter = tmp_path / "script"
    bad_interpreter.write_text("#!/no/such/interpreter\n")
    bad_interpreter.chmod(0o755)
    for program in (junk, bad_interpreter):
        done = run_cli(["exec", "k", "--", str(program)], tmp_path)
        assert done.returncode == 126, done.stderr
        assert "Traceback" not in done.stderr


def test_conflict_exit_code_is_configurable(tmp_path: Path) -> None:
    script = f"touch {tmp_path}/s; i=0; while [ ! -e {tmp_path}/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"
    holder = start_cli(["exec", "c", "--", "sh", "-c", script], tmp_path)
    try:
        wait_for(tmp_path / "s")
        done = run_cli(["exec", "c", "--conflict-exit-code", "3", "--", "true"], tmp_path)
        (tmp_path / "go").touch()
        holder.communicate(timeout=20)
        assert done.returncode == 3
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()


@pytest.mark.slow
def test_lost_lease_kills_the_whole_process_group(tmp_path: Path) -> None:
    """A command that ignores SIGTERM, and its children, are killed within TTL/10 of the loss."""
    url = f"sqlite:///{tmp_path}/sql_lease.db"
    script = (
        f"trap '' TERM; (trap '' TERM; echo $$ > /dev/null; sleep 60) & echo $! > {tmp_path}/child; "
        f"touch {tmp_path}/s; wait"
    )
    proc = start_cli(["exec", "grp", "--ttl", "2s", "--owner", "victim", "--", "sh", "-c", script], tmp_path)
    wait_for(tmp_path / "s")
    child = int((tmp_path / "child").read_text())

    async def steal() -> bool:
        async with SqlLeaseProvider(url) as provider:
            return await provider.transfer_lease("grp", "victim", "thief", 60_000)

    assert asyncio.run(steal())
    started = time.monotonic()
    proc.communicate(timeout=30)
    assert proc.returncode == 76
    assert time.monotonic() - started < 5  # renew interval (0.67 s) + kill-after (0.2 s) + slack
    time.sleep(0.2)
    assert not process_alive(child)


@pytest.mark.slow
def test_exec_wait_then_run_longer_than_the_ttl(tmp_path: Path) -> None:
    """Regression: after --wait, the lease was reported lost at once (exit 76)."""
    first = start_cli(["exec", "w2", "--", "sh", "-c", f"touch {tmp_path}/s; sleep 1.5"], tmp_path)
    wait_for(tmp_path / "s")
    second = run_cli(["exec", "w2", "--wait", "--ttl", "1s", "--", "sleep", "1.5"], tmp_path)
    first.communicate(timeout=20)
    assert second.returncode == 0, second.stderr


# -- migrate: configuration errors exit 78, and it says what it did (issue 21, item 3) ---------------


def _one_clean_line(stderr: str, *secrets: str) -> None:
    assert stderr.count("\n") == 1 and stderr.startswith("sql-lease: "), stderr
    assert "Traceback" not in stderr and "sqlalche.me" not in stderr, stderr
    for secret in secrets:
        assert secret not in stderr


@pytest.mark.postgres
@pytest.mark.parametrize("extra", [[], ["--fences-only"]])
def test_migrate_refused_database_or_role_exits_78(pg_url: str, extra: list[str], tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    base = make_url(pg_url)
    no_db = base.set(database="sql_lease_no_such_db").render_as_string(hide_password=False)
    no_role = base.set(username="sql_lease_no_role", password="hunter2").render_as_string(hide_password=False)
    for url, words in ((no_db, "database does not exist"), (no_role, 'role "sql_lease_no_role" does not exist')):
        done = invoke(["migrate", *extra, "--url", url], tmp_path)
        assert done.returncode == 78, done.stderr
        assert words in done.stderr
        _one_clean_line(done.stderr, "hunter2")


@pytest.mark.parametrize("extra", [[], ["--fences-only"]])
def test_migrate_of_an_unopenable_sqlite_file_exits_78(extra: list[str], tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    done = invoke(["migrate", *extra, "--url", f"sqlite:///{tmp_path}/dir.db"], tmp_path)
    assert done.returncode == 78, done.stderr
    assert "is not a file" in done.stderr and "dir.db" in done.stderr
    _one_clean_line(done.stderr)


def test_migrate_says_what_it_did(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/said.db"
    created = invoke(["migrate", "--url", url], tmp_path)
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith(f"created sql_leases at revision {HEAD_REVISION} on "), created.stdout
    again = invoke(["migrate", "--url", url], tmp_path)
    assert again.stdout.startswith(f"sql_leases already at revision {HEAD_REVISION} on "), again.stdout
    old = f"sqlite:///{tmp_path}/old.db"
    alembic = str(Path(sys.executable).with_name("alembic"))
    repo = Path(__file__).resolve().parent.parent
    stepped = subprocess.run([alembic, "-x", f"url={old}", "upgrade", "0002"], cwd=repo, capture_output=True, text=True)
    assert stepped.returncode == 0, stepped.stderr
    upgraded = invoke(["migrate", "--url", old, "--table", "sql_leases"], tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.startswith(f"migrated sql_leases from revision 0002 to {HEAD_REVISION} on "), upgraded.stdout


# -- issue 21, item 9: compound durations, --data from a file or stdin ----------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1h30m", 5400.0),
        ("2d", 172_800.0),
        ("1m30s", 90.0),
        ("1d12h", 129_600.0),
        ("1.5h", 5400.0),
        ("2m500ms", 120.5),
        ("30", 30.0),
        (" 5m ", 300.0),
        ("1h 30m", 5400.0),
        ("500ms", 0.5),
    ],
)
def test_durations_accept_units_in_sequence_and_days(text: str, seconds: float) -> None:
    from sql_lease.cli import DURATION

    assert DURATION.convert(text, None, None) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1x", "h", "1h30", "30m1h2", "", "1hh", "-1h", "1 d x"])
def test_bad_durations_are_refused(text: str) -> None:
    import click

    from sql_lease.cli import DURATION

    with pytest.raises(click.BadParameter):
        DURATION.convert(text, None, None)


def test_compound_durations_on_the_command_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/d.db"
    done = invoke(["acquire", "k", "--url", url, "--owner", "o", "--ttl", "1h30m", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    import json

    remaining = json.loads(done.stdout)["remaining_ms"]
    assert 5390_000 < remaining <= 5400_000
    assert invoke(["acquire", "k", "--url", url, "--owner", "o", "--ttl", "2d"], tmp_path).returncode == 0
    bad = invoke(["acquire", "k", "--url", url, "--owner", "o", "--ttl", "1h30"], tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("sql-lease: --ttl: '1h30' is not a duration") and bad.stderr.count("\n") == 1


def test_a_bare_number_of_a_thousand_seconds_or_more_is_noted(tmp_path: Path) -> None:
    """`--ttl 30000` (milliseconds meant, as the Python API takes) is 8h20m: still taken as seconds,
    with one line on stderr saying so; a number with a unit, or a small one, says nothing."""
    url = f"sqlite:///{tmp_path}/ttl.db"
    noted = invoke(["acquire", "k", "--url", url, "--owner", "o", "--ttl", "30000", "--json"], tmp_path)
    assert noted.returncode == 0 and 29_990_000 < json.loads(noted.stdout)["remaining_ms"] <= 30_000_000
    assert noted.stderr == "sql-lease: --ttl 30000 is read as seconds (8h20m); write 30000ms for milliseconds\n"
    for quiet in ("30", "30000s", "30000ms", "1h"):
        done = invoke(["acquire", f"k{quiet}", "--url", url, "--owner", "o", "--ttl", quiet], tmp_path)
        assert done.returncode == 0 and done.stderr == "", (quiet, done.stderr)


def test_data_from_a_file_or_stdin(tmp_path: Path) -> None:
    import json

    url = f"sqlite:///{tmp_path}/data.db"
    (tmp_path / "job.json").write_text('{"job": 42, "from": "file"}')
    done = invoke(["acquire", "a", "--url", url, "--owner", "o", "--data", f"@{tmp_path}/job.json"], tmp_path)
    assert done.returncode == 0, done.stderr
    shown = invoke(["show", "a", "--url", url, "--json"], tmp_path)
    assert json.loads(shown.stdout)["data"] == {"job": 42, "from": "file"}
    piped = invoke(["acquire", "b", "--url", url, "--owner", "o", "--data", "-"], tmp_path, input='{"from": "stdin"}')
    assert piped.returncode == 0, piped.stderr
    assert json.loads(invoke(["show", "b", "--url", url, "--json"], tmp_path).stdout)["data"] == {"from": "stdin"}
    moved = invoke(
        ["transfer", "b", "--url", url, "--from", "o", "--to", "p", "--data", f"@{tmp_path}/job.json"], tmp_path
    )
    assert moved.returncode == 0, moved.stderr
    assert json.loads(invoke(["show", "b", "--url", url, "--json"], tmp_path).stdout)["data"]["from"] == "file"
    # bad input: a missing file, a directory, bad JSON in the file, too much data: exit 2, one line
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "big.json").write_text(json.dumps({"x": "y" * 10_000}))
    for arg, words in (
        (f"@{tmp_path}/missing.json", "missing.json"),
        (f"@{tmp_path}", "cannot be read"),
        (f"@{tmp_path}/bad.json", "not valid JSON"),
        (f"@{tmp_path}/big.json", "4096"),
        ("@", "a file name after @"),
    ):
        refused = invoke(["acquire", "c", "--url", url, "--owner", "o", "--data", arg], tmp_path)
        assert refused.returncode == 2, (arg, refused.stderr)
        assert words in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr


def test_check_of_an_unopenable_sqlite_file_is_one_clean_line(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    done = invoke(["check", "--url", f"sqlite:///{tmp_path}/dir.db"], tmp_path)
    assert done.returncode == 78, done.stdout + done.stderr
    assert "sqlalche.me" not in done.stdout and "\\n" not in done.stdout and "Traceback" not in done.stderr


@pytest.mark.postgres
def test_check_of_a_refused_database_or_role_exits_78_without_sqlalchemy_text(pg_url: str, tmp_path: Path) -> None:
    from sqlalchemy.engine import make_url

    base = make_url(pg_url)
    for url in (
        base.set(database="sql_lease_no_such_db").render_as_string(hide_password=False),
        base.set(username="sql_lease_no_role", password="hunter2").render_as_string(hide_password=False),
    ):
        done = invoke(["check", "--url", url], tmp_path)
        assert done.returncode == 78, done.stdout + done.stderr
        assert "does not exist" in done.stdout
        assert "sqlalche.me" not in done.stdout and "\\n" not in done.stdout and "hunter2" not in done.stdout


@pytest.mark.mysql
def test_mysql_bad_urls_exit_78_or_69_with_the_password_masked(mysql_user: tuple[str, str], tmp_path: Path) -> None:
    """A refused password, an unknown database or an unknown host: exit 78 (configuration); a server
    that does not answer: 69. Every command says so in one line, the password masked."""
    import socket

    from sqlalchemy.engine import make_url

    from tests.conftest import MYSQL_URL

    user, password = mysql_user
    base = make_url(MYSQL_URL).set(username=user, password=password)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    cases = [
        (base.set(password="hunter2"), 78, "refused the role or its password", "hunter2"),
        (base.set(database=f"{user}_nope"), 78, "database does not exist", password),
        (base.set(host="sql-lease-no-such-host.invalid"), 78, "host", password),
        (base.set(host="127.0.0.1", port=free_port), 69, "failed", password),
    ]
    commands = [["list"], ["exec", "k", "--", "true"], ["migrate"], ["migrate", "--fences-only"], ["check"]]
    runs = []  # exec in a real process (all at once), the other commands in this one
    for url, code, words, secret in cases:
        given = url.render_as_string(hide_password=False)
        for command in commands:
            args = [command[0], "--url", given, *command[1:]]
            runs.append(
                (command, given, code, words, secret, start_cli(args, tmp_path) if command[0] == "exec" else args)
            )
    for command, given, code, words, secret, run in runs:
        if isinstance(run, list):
            done = invoke(run, tmp_path)
            returncode, out, err = done.returncode, done.stdout, done.stderr
        else:
            out, err = run.communicate(timeout=60)
            returncode = run.returncode
        said = out if command == ["check"] else err  # check prints its lines on stdout
        assert returncode == code, (given, command, out, err)
        assert words in said and ":***@" in said, (given, command, said)
        assert secret not in out + err and "sqlalche.me" not in said and "Traceback" not in err, (command, out, err)
        if command != ["check"]:
            _one_clean_line(err, secret)


def test_a_bad_url_in_a_config_file_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('url = "nonsense"\n')
    env = dict(os.environ, SQL_LEASE_CONFIG=str(config))
    env.pop("SQL_LEASE_URL", None)
    for args in (["list"], ["migrate"]):
        done = invoke(args, tmp_path, env=env)
        assert done.returncode == 78 and str(config) in done.stderr and done.stderr.count("\n") == 1, done.stderr


# -- issue 22: polish from a new-user trial ----------------------------------------------------------


def _plain(url: str) -> str:
    """``url`` as a user types it: ``postgresql://``, no driver name."""
    return url.replace("postgresql+asyncpg://", "postgresql://").replace("postgresql+psycopg://", "postgresql://")


@pytest.mark.postgres
def test_concurrent_migrates_each_say_what_they_did(pg_url: str, fresh_pg_schema: str, tmp_path: Path) -> None:
    """Three `migrate` runs on an empty schema, all past their first look before any holds the
    migration lock: one created the table, the other two found it at head."""
    import asyncpg

    async def main() -> list[subprocess.CompletedProcess[str]]:
        lock = await asyncpg.connect(_plain(pg_url))
        try:
            await lock.execute("SELECT pg_advisory_lock(hashtext('sql_lease migrate'))")
            args = ["migrate", "--url", _plain(pg_url), "--schema", fresh_pg_schema]
            procs = [start_cli(args, tmp_path) for _ in range(3)]
            deadline = time.monotonic() + 30
            waiting = 0
            while waiting < 3 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
                waiting = await lock.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                await asyncio.sleep(0.05)
            assert waiting >= 3, [p.poll() for p in procs]
        finally:
            await lock.execute("SELECT pg_advisory_unlock(hashtext('sql_lease migrate'))")
            await lock.close()
        results = []
        for proc in procs:
            out, err = await asyncio.to_thread(proc.communicate, timeout=60)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return results

    results = asyncio.run(main())
    assert all(done.returncode == 0 for done in results), [done.stderr for done in results]
    said = sorted(done.stdout.split(" on ")[0] for done in results)
    table = f"{fresh_pg_schema}.sql_leases"
    assert said == [
        f"created {table} at revision {HEAD_REVISION}",
        f"{table} already at revision {HEAD_REVISION}",
        f"{table} already at revision {HEAD_REVISION}",
    ], said


def test_concurrent_migrates_on_sqlite_create_the_table_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/race.db"
    procs = [start_cli(["migrate", "--url", url], tmp_path) for _ in range(3)]
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outs
    created = [out for out, _ in outs if out.startswith("created ")]
    assert len(created) == 1, outs


@pytest.mark.postgres
def test_messages_show_the_url_as_the_user_gave_it(pg_url: str, fresh_pg_schema: str, tmp_path: Path) -> None:
    url = _plain(pg_url)
    migrated = invoke(["migrate", "--url", url, "--schema", fresh_pg_schema], tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.rstrip().endswith(f" on {url}"), migrated.stdout
    missing = invoke(["status", "k", "--url", url, "--schema", fresh_pg_schema + "_none"], tmp_path)
    assert missing.returncode == 78 and f" {url}" in missing.stderr and "+asyncpg" not in missing.stderr
    refused = invoke(["show", "k", "--url", "postgresql://u:hunter2@127.0.0.1:1/db"], tmp_path)
    assert refused.returncode == 69, refused.stderr
    assert "postgresql://u:***@127.0.0.1:1/db" in refused.stderr and "+asyncpg" not in refused.stderr
    assert "hunter2" not in refused.stderr


def test_sqlite_messages_show_the_url_as_the_user_gave_it(tmp_path: Path) -> None:
    done = invoke(["migrate", "--url", "sqlite:///given.db"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(" on sqlite:///given.db"), done.stdout


def test_the_cli_package_imports_no_sql_internals_and_the_supervisor_no_leases() -> None:
    """Issue 22, item 3: no arrow upward from the CLI into the statements or the error mapping, and
    exec's process supervisor knows nothing of leases or databases."""
    import ast

    package = Path(__file__).resolve().parent.parent / "sql_lease" / "cli"
    assert (package / "supervisor.py").is_file()
    for module in package.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom):
                imported.add("." * node.level + (node.module or ""))
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        assert not imported & {"..sql.statements", "..sql.translate", "sql_lease.sql.statements"}, module.name
        if module.name == "supervisor.py":
            assert all(name in (".render",) or not name.startswith(".") for name in imported), imported

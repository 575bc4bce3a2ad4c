"""Where the CLI finds its database (issue 21, item 1): --url, else $SQL_LEASE_URL, else a TOML
config file ($SQL_LEASE_CONFIG, else $XDG_CONFIG_HOME/sql-lease/config.toml or
~/.config/sql-lease/config.toml, else /etc/sql-lease/config.toml), else the local SQLite file,
said on stderr. The system file is pointed into the test's directory (never the real /etc)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sql_lease import SqlLeaseProvider
from sql_lease.sql.migrate import HEAD_REVISION
from tests.support.cli import invoke, patched_environ

CLI = [sys.executable, "-m", "sql_lease"]
SYSTEM_CONFIG_ENV = "_SQL_LEASE_TEST_SYSTEM_CONFIG"


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment as cron gives it: no SQL_LEASE_*, HOME in the test's directory, no
    XDG_CONFIG_HOME, and the system config file at tmp/etc/sql-lease/config.toml."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQL_LEASE_", "XDG_"))}
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    env.update(HOME=str(tmp_path / "home"), **{SYSTEM_CONFIG_ENV: str(tmp_path / "etc/sql-lease/config.toml")})
    return env


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``sql-lease ARGS`` with exactly the environment ``env``: exec in a real process, the others in this one."""
    if args[0] == "exec":
        return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    return invoke(args, cwd, env=env)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def url_check(cwd: Path, env: dict[str, str], *args: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    """What `sql-lease check --json` says about where the URL came from."""
    done = run(["check", "--json", *args], cwd, env)
    assert done.returncode in (0, 69, 78), done.stderr
    checks = json.loads(done.stdout)
    (url,) = [c["detail"] for c in checks if c["name"] == "url"]
    return url, done


def test_without_any_setting_the_local_default_is_said_on_stderr(tmp_path: Path, home: dict[str, str]) -> None:
    work = tmp_path / "work"
    done = run(["exec", "k", "--", "true"], work, home)
    assert done.returncode == 0, done.stderr
    db = work / "sql_lease.db"
    assert db.exists()
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(db) in done.stderr and "only processes on this machine" in done.stderr
    quiet = run(["exec", "k", "--quiet", "--", "true"], work, home)
    assert quiet.returncode == 0 and quiet.stderr == ""
    detail, _ = url_check(work, home)
    assert str(db) in detail and "default" in detail


@pytest.mark.parametrize("args", [["migrate"], ["check"], ["exec", "k", "--quiet", "--", "true"]])
def test_an_empty_url_variable_exits_78_and_never_falls_back(
    args: list[str], tmp_path: Path, home: dict[str, str]
) -> None:
    """``SQL_LEASE_URL=`` (a secret that did not arrive) is a mistake, not "no URL": a deploy's
    migrate and check, and a fleet's exec, must not pass on a local SQLite file instead."""
    work = tmp_path / "work"
    done = run(args, work, {**home, "SQL_LEASE_URL": ""})
    assert done.returncode == 78, (done.stdout, done.stderr)
    assert "$SQL_LEASE_URL is set but empty" in done.stderr
    assert not (work / "sql_lease.db").exists()


def test_a_given_url_says_nothing_about_the_default(tmp_path: Path, home: dict[str, str]) -> None:
    done = run(["exec", "k", "--url", f"sqlite:///{tmp_path}/given.db", "--", "true"], tmp_path / "work", home)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_precedence_of_url_env_and_config_files(tmp_path: Path, home: dict[str, str]) -> None:
    work = tmp_path / "work"
    system = write(tmp_path / "etc/sql-lease/config.toml", f'url = "sqlite:///{tmp_path}/system.db"\n')
    detail, _ = url_check(work, home)
    assert "system.db" in detail and str(system) in detail
    user = write(tmp_path / "home/.config/sql-lease/config.toml", f'url = "sqlite:///{tmp_path}/user.db"\n')
    detail, _ = url_check(work, home)
    assert "user.db" in detail and str(user) in detail
    xdg = write(tmp_path / "xdg/sql-lease/config.toml", f'url = "sqlite:///{tmp_path}/xdg.db"\n')
    env = dict(home, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    detail, _ = url_check(work, env)
    assert "xdg.db" in detail and str(xdg) in detail
    named = write(tmp_path / "named.toml", f'url = "sqlite:///{tmp_path}/named.db"\n')
    env[SQL_LEASE_CONFIG] = str(named)
    detail, _ = url_check(work, env)
    assert "named.db" in detail and str(named) in detail
    env["SQL_LEASE_URL"] = f"sqlite:///{tmp_path}/env.db"
    detail, _ = url_check(work, env)
    assert "env.db" in detail and "$SQL_LEASE_URL" in detail
    detail, _ = url_check(work, env, "--url", f"sqlite:///{tmp_path}/option.db")
    assert "option.db" in detail and "--url" in detail
    # the file the config named is the one used, and no local default is created or announced
    done = run(["exec", "k", "--", "true"], work, dict(home, SQL_LEASE_CONFIG=str(named)))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "named.db").exists() and not (work / "sql_lease.db").exists()


SQL_LEASE_CONFIG = "SQL_LEASE_CONFIG"


def test_table_and_schema_come_with_the_config_files_url(tmp_path: Path, home: dict[str, str]) -> None:
    work = tmp_path / "work"
    url = f"sqlite:///{tmp_path}/t.db"
    config = write(tmp_path / "c.toml", f'url = "{url}"\ntable = "cron_leases"\n')
    env = dict(home, SQL_LEASE_CONFIG=str(config))
    migrated = run(["migrate"], work, env)
    assert migrated.returncode == 0 and f"created cron_leases at revision {HEAD_REVISION}" in migrated.stdout, (
        migrated.stderr
    )
    assert run(["acquire", "job", "--owner", "a"], work, env).returncode == 0
    shown = run(["show", "job", "--json", "--url", url, "--table", "cron_leases"], work, home)
    assert shown.returncode == 0 and json.loads(shown.stdout)["owner"] == "a", shown.stdout + shown.stderr
    # --table on the command line wins over the file's
    assert run(["show", "job", "--table", "sql_leases"], work, env).returncode == 78


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('url = "sqlite:///x.db"\nport = 5432\n', "unknown key 'port'"),
        ("url = sqlite:///x.db\n", "not valid TOML"),
        ("url = 5\n", "'url' must be a string"),
        ("[database]\nurl = 'x'\n", "unknown key 'database'"),
    ],
)
def test_a_bad_config_file_exits_78_naming_it(text: str, words: str, tmp_path: Path, home: dict[str, str]) -> None:
    config = write(tmp_path / "home/.config/sql-lease/config.toml", text)
    done = invoke(["exec", "k", "--", "true"], tmp_path / "work", env=home)  # refused before it runs anything
    assert done.returncode == 78, done.stderr
    assert str(config) in done.stderr and words in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "work/sql_lease.db").exists()


def test_an_unreadable_or_missing_named_config_file_exits_78(tmp_path: Path, home: dict[str, str]) -> None:
    work = tmp_path / "work"
    (tmp_path / "a-directory.toml").mkdir()
    for path in (tmp_path / "a-directory.toml", tmp_path / "missing.toml"):
        done = run(["list"], work, dict(home, SQL_LEASE_CONFIG=str(path)))
        assert done.returncode == 78, done.stderr
        assert str(path) in done.stderr and done.stderr.count("\n") == 1, done.stderr
    dangling = tmp_path / "etc/sql-lease/config.toml"
    dangling.parent.mkdir(parents=True)
    dangling.symlink_to(tmp_path / "nowhere.toml")
    done = run(["list"], work, home)
    assert done.returncode == 78 and str(dangling) in done.stderr, done.stderr


def test_a_config_file_password_is_never_printed(tmp_path: Path, home: dict[str, str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = write(tmp_path / "c.toml", f'url = "postgresql://u:hunter2@127.0.0.1:{port}/db"\n')
    env = dict(home, SQL_LEASE_CONFIG=str(config))
    detail, done = url_check(tmp_path / "work", env)
    assert "hunter2" not in done.stdout + done.stderr and str(config) in detail
    refused = run(["list"], tmp_path / "work", env)
    assert refused.returncode == 69 and "hunter2" not in refused.stdout + refused.stderr


def test_the_python_api_reads_no_config_file(tmp_path: Path, home: dict[str, str]) -> None:
    config = write(tmp_path / "c.toml", "this is not toml\n")

    async def main() -> None:
        async with SqlLeaseProvider(f"sqlite:///{tmp_path}/api.db") as provider:
            await provider.migrate()

    with patched_environ(dict(home, SQL_LEASE_CONFIG=str(config))):
        asyncio.run(main())


def test_check_on_the_default_warns_naming_the_config_files_tried(tmp_path: Path, home: dict[str, str]) -> None:
    work = tmp_path / "work"
    assert run(["migrate"], work, home).returncode == 0
    done = run(["check"], work, home)
    assert done.returncode == 0, done.stdout + done.stderr  # the default is fine on a laptop
    (line,) = [line for line in done.stdout.splitlines() if " url " in f" {line} "]
    assert line.startswith("warn "), done.stdout
    assert str(tmp_path / "home/.config/sql-lease/config.toml") in line
    assert str(tmp_path / "etc/sql-lease/config.toml") in line
    checks = json.loads(run(["check", "--json"], work, home).stdout)
    (url,) = [c for c in checks if c["name"] == "url"]
    assert url["ok"] is None and url["warning"] is True

"""The CLI and semaphores (issue 25): ``sql-lease exec KEY --limit N`` runs at most N commands at
once across processes (checked by the commands' own start/stop log), and ``list``/``show``/``status``
show every holder of a key held as a semaphore."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sql_lease import InMemoryLeaseProvider, SqlLeaseProvider
from sql_lease.cli import cli
from tests.test_cli import run_cli, start_cli

# A child that logs its own start and stop (wall clock, one line each) around a pause.
CHILD = (
    "import os, sys, time; log = sys.argv[1]; "
    "open(log, 'a').write(f'start {os.getpid()} {time.time():.6f}\\n'); time.sleep(float(sys.argv[2])); "
    "open(log, 'a').write(f'stop {os.getpid()} {time.time():.6f}\\n')"
)


def most_at_once(log: Path) -> tuple[int, int]:
    """The most children running at once by their log, and how many ran."""
    events = []
    for line in log.read_text().splitlines():
        kind, _, at = line.split()
        events.append((float(at), 0 if kind == "stop" else 1))  # at the same instant a stop comes first
    running = most = 0
    for _, starting in sorted(events):
        running += 1 if starting else -1
        most = max(most, running)
    return most, sum(starting for _, starting in events)


@pytest.mark.slow
def test_exec_with_a_limit_runs_at_most_that_many_commands_at_once(tmp_path: Path) -> None:
    key, log = f"sem-{uuid.uuid4().hex[:8]}", tmp_path / "runs.log"

    assert run_cli(["migrate"], tmp_path).returncode == 0
    command = [sys.executable, "-c", CHILD, str(log), "0.8"]
    options = ["--limit", "2", "--wait", "--timeout", "60s", "--ttl", "10s"]
    runs = [start_cli(["exec", key, *options, "--", *command], tmp_path) for _ in range(5)]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    most, ran = most_at_once(log)
    assert ran == 5 and most == 2, log.read_text()
    assert run_cli(["status", key], tmp_path).returncode == 1  # every slot let go


def test_exec_with_a_limit_is_refused_when_every_slot_is_held(tmp_path: Path) -> None:
    key = f"sem-{uuid.uuid4().hex[:8]}"
    assert run_cli(["migrate"], tmp_path).returncode == 0
    url = f"sqlite:///{tmp_path}/sql_lease.db"
    seed(url, key, ["a", "b"], limit=2)
    refused = run_cli(["exec", key, "--limit", "2", "--", "touch", str(tmp_path / "ran")], tmp_path)
    assert refused.returncode == 75 and "held by 'a'" in refused.stderr, refused.stderr
    assert "2 of 2 slots held: 'a', 'b'" in refused.stderr, refused.stderr
    waited = run_cli(["exec", key, "--limit", "2", "--wait", "--timeout", "0.3s", "--", "true"], tmp_path)
    assert waited.returncode == 75 and "2 of 2 slots held: 'a', 'b'" in waited.stderr, waited.stderr
    ran = run_cli(["exec", key, "--limit", "3", "--", "sh", "-c", 'echo "fence=$SQL_LEASE_FENCE"'], tmp_path)
    assert ran.returncode == 0 and int(ran.stdout.strip().removeprefix("fence=")) > 0, ran.stderr
    plain = run_cli(["exec", key, "--", "true"], tmp_path)  # a plain run of a semaphore key
    assert plain.returncode == 75
    assert (
        "held as a semaphore: 2 slots held: 'a', 'b' (without --limit the key is free only when no slot is held)"
        in plain.stderr
    )


def test_a_limit_refused_by_a_plain_lease_names_no_slots(tmp_path: Path) -> None:
    """A plain lease on the key refuses `--limit 3`: the refusal names its holder, not "1 of 3 slots"."""
    key = f"sem-{uuid.uuid4().hex[:8]}"
    assert run_cli(["acquire", key, "--owner", "p"], tmp_path).returncode == 0
    for command in (["acquire", key, "--owner", "q"], ["exec", key]):
        tail = ["--", "true"] if command[0] == "exec" else []
        refused = run_cli([*command, "--limit", "3", *tail], tmp_path)
        assert refused.returncode == 75 and "held by 'p'" in refused.stderr, refused.stderr
        assert "slots held" not in refused.stderr, refused.stderr
        assert "a plain lease holds the key: no slot is free until it ends" in refused.stderr, refused.stderr


@pytest.mark.parametrize("limit", ["0", "10001", "x"])
def test_exec_refuses_a_bad_limit(tmp_path: Path, limit: str) -> None:
    refused = run_cli(["exec", "k", "--limit", limit, "--", "touch", str(tmp_path / "ran")], tmp_path)
    assert refused.returncode == 2 and "--limit" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "sql_lease.db").exists()


# -- list, show and status: every holder ----------------------------------------------------


def seed(url: str, key: str, owners: list[str], limit: int) -> None:
    async def main() -> None:
        async with SqlLeaseProvider(url) as provider:
            for owner in owners:
                assert (await provider.acquire_lease(key, owner, 600_000, limit=limit, data={"o": owner})).acquired

    asyncio.run(main())


class OpenMemory(InMemoryLeaseProvider):
    """The in-memory provider as the CLI opens one (an async context manager)."""

    async def __aenter__(self) -> OpenMemory:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None


@pytest.fixture(params=["memory", "sqlite"])
def url_with_holders(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The URL of a database where key "sem" has the holders a, b, c (a semaphore of 3) and "plain"
    a plain lease of p; memory: the commands open one in-memory provider instead."""
    url = f"sqlite:///{tmp_path}/leases.db"
    if request.param == "memory":
        memory = OpenMemory()
        for owner in ("a", "b", "c"):
            asyncio.run(memory.acquire_lease("sem", owner, 600_000, limit=3, data={"o": owner}))
        asyncio.run(memory.acquire_lease("plain", "p", 600_000))
        monkeypatch.setattr("sql_lease.cli.view_commands.open_provider", lambda *args, **kwargs: memory)
        monkeypatch.setattr("sql_lease.cli.lease_commands.open_provider", lambda *args, **kwargs: memory)
        return url

    async def migrate() -> None:
        async with SqlLeaseProvider(url) as provider:
            await provider.migrate()
            await provider.acquire_lease("plain", "p", 600_000)

    asyncio.run(migrate())
    seed(url, "sem", ["a", "b", "c"], limit=3)
    return url


def invoke(args: list[str]) -> Any:
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_list_shows_every_holder(url_with_holders: str) -> None:
    rows = json.loads(invoke(["list", "--json", "--url", url_with_holders]).stdout)
    assert [(r["key"], r["owner"]) for r in rows] == [("plain", "p"), ("sem", "a"), ("sem", "b"), ("sem", "c")]
    assert [r["data"] for r in rows[1:]] == [{"o": "a"}, {"o": "b"}, {"o": "c"}]
    fences = [r["fence"] for r in rows[1:]]
    assert fences == sorted(set(fences))
    table = invoke(["list", "--prefix", "sem", "--url", url_with_holders]).stdout.splitlines()
    assert [line.split()[:2] for line in table[1:]] == [["sem", "a"], ["sem", "b"], ["sem", "c"]]
    assert len(json.loads(invoke(["list", "--json", "--limit", "2", "--url", url_with_holders]).stdout)) == 2


def test_show_and_status_show_every_holder(url_with_holders: str) -> None:
    shown = invoke(["show", "sem", "--json", "--url", url_with_holders])
    assert shown.exit_code == 0
    value = json.loads(shown.stdout)
    assert value["owner"] == "a" and [h["owner"] for h in value["holders"]] == ["a", "b", "c"]
    assert [h["data"] for h in value["holders"]] == [{"o": "a"}, {"o": "b"}, {"o": "c"}]
    plain = json.loads(invoke(["show", "plain", "--json", "--url", url_with_holders]).stdout)
    assert plain["owner"] == "p" and [h["owner"] for h in plain["holders"]] == ["p"]

    text = invoke(["show", "sem", "--url", url_with_holders]).stdout
    assert text.startswith("sem: 3 holders (a semaphore), oldest tenure first\n")
    assert [line.split()[1] for line in text.splitlines() if line.startswith("owner:")] == ["a", "b", "c"]
    assert "holders" not in invoke(["show", "plain", "--url", url_with_holders]).stdout

    status = invoke(["status", "sem", "--url", url_with_holders])
    assert status.exit_code == 0 and "held by a (fence" in status.stdout and "and 2 more holders" in status.stdout
    free = invoke(["show", "nothing", "--json", "--url", url_with_holders])
    assert free.exit_code == 1 and json.loads(free.stdout) is None


def test_break_names_every_holder_of_a_semaphore_it_broke(url_with_holders: str) -> None:
    broken = invoke(["break", "sem", "--yes", "--url", url_with_holders])
    assert broken.exit_code == 0
    assert broken.stdout.startswith("broke sem, a semaphore: 3 holders: a (fence "), broken.stdout
    assert [part.split()[0] for part in broken.stdout.split(": ", 2)[2].split("), ")] == ["a", "b", "c"]
    assert invoke(["show", "sem", "--url", url_with_holders]).exit_code == 1
    assert invoke(["show", "plain", "--url", url_with_holders]).exit_code == 0  # another key: left alone


def test_break_json_lists_every_holder_of_a_semaphore(url_with_holders: str) -> None:
    before = json.loads(invoke(["show", "sem", "--json", "--url", url_with_holders]).stdout)["holders"]
    broken = invoke(["break", "sem", "--yes", "--json", "--url", url_with_holders])
    assert broken.exit_code == 0
    value = json.loads(broken.stdout)
    assert value["owner"] == "a" and [(h["owner"], h["fence"]) for h in value["holders"]] == [
        (h["owner"], h["fence"]) for h in before
    ]
    plain = json.loads(invoke(["break", "plain", "--yes", "--json", "--url", url_with_holders]).stdout)
    assert plain["owner"] == "p" and [h["owner"] for h in plain["holders"]] == ["p"]


def test_transfer_of_a_slot_prints_the_new_holders_fence(url_with_holders: str) -> None:
    before = {
        h["owner"]: h["fence"]
        for h in json.loads(invoke(["show", "sem", "--json", "--url", url_with_holders]).stdout)["holders"]
    }
    moved = invoke(["transfer", "sem", "--from", "b", "--to", "d", "--json", "--url", url_with_holders])
    assert moved.exit_code == 0, moved.stderr
    value = json.loads(moved.stdout)
    assert value["owner"] == "d" and value["fence"] > max(before.values())
    holders = json.loads(invoke(["show", "sem", "--json", "--url", url_with_holders]).stdout)["holders"]
    assert sorted(h["owner"] for h in holders) == ["a", "c", "d"]
    text = invoke(["transfer", "sem", "--from", "c", "--to", "e", "--url", url_with_holders])
    assert text.exit_code == 0 and "fence" in text.stdout, text.stderr


def test_transfer_to_an_owner_holding_a_slot_says_so(url_with_holders: str) -> None:
    refused = invoke(["transfer", "sem", "--from", "b", "--to", "a", "--url", url_with_holders])
    assert refused.exit_code == 75
    assert "'a' already holds a slot of semaphore 'sem'" in refused.stderr, refused.stderr

"""Leases through a PostgreSQL failover: Patroni + etcd clusters these tests start themselves
(tests/support/patroni.py), reached through a multi-host URL with ``target_session_attrs=read-write``.

Load: worker processes (tests/support/failover_worker.py) acquire, renew, transfer and release on
a few keys and log every answer with the database's fence and expiry. Checks, from those logs:
no two owners of a key overlap by the database's clock, fences strictly increase per key, no
acknowledged acquire or renewal is lost (a refusal before the acknowledged expiry), every error
is a ``LeaseBackendError`` inside the outage, and every process goes on without a restart.

Every load test prints one ``FAILOVER`` line (operations, errors, outage seconds, violations);
``pytest -s -m failover`` shows them (README, "High availability / failover").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sql_lease import LeaseBackendError, SqlLeaseProvider, SyncSqlLeaseProvider
from tests.conftest import run_in_own_loop
from tests.support.patroni import PatroniCluster, patroni_cluster, wait_for

pytestmark = [pytest.mark.failover, pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).with_name("support") / "failover_worker.py"
WORKERS = 3
TTL_MS = 5_000
OP_TIMEOUT_S = 2.0
# Errors may still end this long after Patroni reports the new primary (operations then in flight).
SETTLE_S = OP_TIMEOUT_S + 8.0
EPSILON_S = 0.002


async def migrate(url: str) -> None:
    async with SqlLeaseProvider(url) as provider:
        await provider.migrate()


@pytest.fixture(scope="class")
def two_nodes() -> Iterator[PatroniCluster]:
    """A primary and a synchronous standby (``synchronous_mode: true``), migrated."""
    with patroni_cluster(nodes=2) as cluster:
        run_in_own_loop(lambda: migrate(cluster.url))
        yield cluster


@pytest.fixture
def cluster(two_nodes: PatroniCluster) -> PatroniCluster:
    """The class's cluster with every node running again (a test before may have killed one)."""
    for node in two_nodes.nodes:
        if node.process is None:
            two_nodes.start_node(node.name)
    two_nodes.wait_healthy()
    return two_nodes


# -- the load and its checks ----------------------------------------------------------------------


@dataclass
class Load:
    """Worker processes running against ``url`` until :meth:`stop`; their logs in ``directory``."""

    url: str
    directory: Path
    prefix: str = field(default_factory=lambda: f"load-{uuid.uuid4().hex[:6]}")
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        for worker in range(WORKERS):
            self.processes.append(
                subprocess.Popen(
                    [
                        *(sys.executable, str(WORKER), "--url", self.url, "--prefix", self.prefix),
                        *("--worker", str(worker), "--log", str(self.log(worker)), "--ttl-ms", str(TTL_MS)),
                        *("--op-timeout-s", str(OP_TIMEOUT_S)),
                    ],
                    cwd=REPO,
                    stderr=subprocess.PIPE,
                )
            )

    def log(self, worker: int) -> Path:
        return self.directory / f"worker{worker}.jsonl"

    def records(self, worker: int) -> list[dict[str, Any]]:
        if not self.log(worker).exists():
            return []
        lines = self.log(worker).read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def answered_since(self, since: float, count: int) -> bool:
        """True once every worker has ``count`` answered operations that started after ``since``."""
        for worker in range(WORKERS):
            assert self.processes[worker].poll() is None, f"worker {worker} died: {self.stderr(worker)}"
            answered = [r for r in self.records(worker) if "error" not in r and r["op"] != "violation"]
            if sum(r["t0"] > since for r in answered) < count:
                return False
        return True

    def stderr(self, worker: int) -> str:
        process = self.processes[worker]
        if process.poll() is None:
            return "(running)"
        return (process.stderr.read() if process.stderr else b"").decode(errors="replace")[-2000:]

    def stop(self) -> list[str]:
        """SIGTERM every worker and wait for it (killed after 30 s); the stderr of each that failed."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        failed = []
        for process in self.processes:
            try:
                _, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                _, err = process.communicate()
            if process.returncode != 0:
                failed.append((err or b"").decode(errors="replace")[-2000:])
        return failed

    def all_records(self) -> list[dict[str, Any]]:
        return [record for worker in range(WORKERS) for record in self.records(worker)]


@dataclass
class Tenure:
    """One owner's hold of one key under one fence: ``start`` by the database's clock (``now()``
    of the statement that began it: its transaction's start), ``answered_at`` when that owner was
    told (process clock), ``acknowledged_until`` (the latest expiry it was told) and
    ``given_up_at`` (when it called release or transfer, process clock)."""

    owner: str | None = None
    start: float | None = None
    answered_at: float = float("inf")
    acknowledged_until: float = 0.0
    given_up_at: float = float("inf")

    @property
    def gave_up(self) -> bool:
        return self.given_up_at < self.acknowledged_until


@dataclass
class Verdict:
    operations: int
    errors: list[dict[str, Any]]
    violations: list[str]
    tenures: int
    outage_s: float

    def report(self, scenario: str, **extra: Any) -> None:
        more = "".join(f" {name}={value}" for name, value in extra.items())
        print(
            f"\nFAILOVER scenario={scenario} operations={self.operations} errors={len(self.errors)} "
            f"outage_s={self.outage_s:.1f} violations={len(self.violations)} tenures={self.tenures}{more}",
            flush=True,
        )


def judge(records: list[dict[str, Any]]) -> Verdict:
    """The checks of the module docstring over the workers' records."""
    ttl_s = TTL_MS / 1000
    violations = [f"{r['key']} {r['owner']}: {r['what']}" for r in records if r["op"] == "violation"]
    answers = [r for r in records if r["op"] != "violation"]
    tenures: dict[tuple[str, int], Tenure] = defaultdict(Tenure)

    def owned(r: dict[str, Any], fence: int) -> Tenure:
        tenure = tenures[(r["key"], fence)]
        if tenure.owner not in (None, r["owner"]):
            violations.append(f"{r['key']} fence {fence} given to {tenure.owner} and {r['owner']}")
        tenure.owner = r["owner"]
        return tenure

    for r in answers:
        if r["op"] in ("release", "transfer") and r.get("tenure") is not None:
            tenure = tenures[(r["key"], r["tenure"])]
            tenure.given_up_at = min(tenure.given_up_at, r["t0"])
        if "error" in r or not r.get("ok") or "fence" not in r:
            continue
        if r["op"] == "read" and r["holder"] != r["owner"]:
            continue
        tenure = owned(r, r["fence"])
        tenure.acknowledged_until = max(tenure.acknowledged_until, r["expires"])
        if r["op"] in ("acquire", "read"):
            start = r["expires"] - ttl_s
            tenure.start = start if tenure.start is None else min(tenure.start, start)
            tenure.answered_at = min(tenure.answered_at, r["t1"])
    by_key: dict[str, list[tuple[int, Tenure]]] = defaultdict(list)
    for (key, fence), tenure in tenures.items():
        if tenure.owner is not None and tenure.start is not None:
            by_key[key].append((fence, tenure))
    for key, fenced in by_key.items():
        fenced.sort(key=lambda item: item[0])
        _check_overlaps(key, fenced, violations)
        _check_fence_order(key, fenced, violations)
    return Verdict(
        operations=len(answers),
        errors=[r for r in answers if "error" in r],
        violations=violations,
        tenures=sum(len(fenced) for fenced in by_key.values()),
        outage_s=_longest_silence(answers),
    )


def _check_overlaps(key: str, fenced: list[tuple[int, Tenure]], violations: list[str]) -> None:
    """A tenure must begin after every earlier one ended: by the database's clock after an expiry
    (the database compares ``now()`` with it), by the processes' clock after a release or transfer
    (a statement's ``now()`` is its transaction's start, which can precede a release it waited for)."""
    expired_until, given_up_at = float("-inf"), float("-inf")
    for fence, tenure in fenced:
        assert tenure.start is not None
        if tenure.start < expired_until - EPSILON_S:
            violations.append(
                f"{key}: fence {fence} of {tenure.owner} began {expired_until - tenure.start:.3f} s before "
                "an earlier owner's acknowledged expiry"
            )
        if tenure.answered_at < given_up_at - EPSILON_S:
            violations.append(
                f"{key}: fence {fence} of {tenure.owner} was acknowledged {given_up_at - tenure.answered_at:.3f} s "
                "before an earlier owner gave the lease up"
            )
        if tenure.gave_up:
            given_up_at = max(given_up_at, tenure.given_up_at)
        else:
            expired_until = max(expired_until, tenure.acknowledged_until)


def _check_fence_order(key: str, fenced: list[tuple[int, Tenure]], violations: list[str]) -> None:
    """No tenure may begin, by the database's clock, after a tenure with a larger fence was acknowledged."""
    earliest_larger = float("inf")
    for fence, tenure in reversed(fenced):
        assert tenure.start is not None
        if tenure.start > earliest_larger + EPSILON_S:
            violations.append(f"{key}: fence {fence} of {tenure.owner} began after a larger fence was acknowledged")
        earliest_larger = min(earliest_larger, tenure.answered_at)


def _longest_silence(answers: list[dict[str, Any]]) -> float:
    """The longest time any worker went without a successful answer, in seconds."""
    by_owner: dict[str, list[float]] = defaultdict(list)
    for r in answers:
        if "error" not in r:
            by_owner[r["owner"].rsplit("-", 1)[1]].append(r["t1"])
    gaps = [b - a for times in map(sorted, by_owner.values()) for a, b in itertools.pairwise(times)]
    return max(gaps, default=0.0)


async def answered(call: Any, timeout_s: float = 60.0) -> Any:
    """``await call()`` again after each ``LeaseBackendError`` (a pooled connection to a server
    that is gone fails once) until it answers or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except LeaseBackendError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def run_fault_under_load(cluster: PatroniCluster, directory: Path, fault: str) -> Verdict:
    """Workers on ``cluster.url``; once each has answered, ``fault`` (``kill`` or ``switchover``)
    the primary; once each has answered again after the new primary, stop and judge. A lease taken
    before the fault must keep its owner and fence."""
    load = Load(cluster.url, directory)
    async with SqlLeaseProvider(cluster.url, operation_timeout_s=OP_TIMEOUT_S) as provider:
        kept_key = f"{load.prefix}:acknowledged"
        before = await provider.acquire_lease(kept_key, "keeper", 120_000)
        assert before.acquired
        load.start()
        try:
            await asyncio.to_thread(wait_for, lambda: load.answered_since(0, 30), 90, "the load")
            old = cluster.wait_healthy()
            fault_at = time.time()
            if fault == "kill":
                await asyncio.to_thread(cluster.kill_node, old)
                cluster.former_primary = old
            else:
                standby = next(node.name for node in cluster.nodes if node.name != old)
                await asyncio.to_thread(cluster.switchover, old, standby)
            await asyncio.to_thread(cluster.wait_leader_other_than, old)
            recovered_at = time.time()
            await asyncio.to_thread(
                wait_for, lambda: load.answered_since(recovered_at, 30), 90, "every worker to answer again"
            )
        finally:
            failed = load.stop()
        assert not failed, failed
        after = await answered(lambda: provider.get_lease(kept_key))
        assert after is not None and (after.owner, after.fence) == ("keeper", before.fence)
    verdict = judge(load.all_records())
    outside = [e for e in verdict.errors if e["t1"] < fault_at or e["t0"] > recovered_at + SETTLE_S]
    assert {e["kind"] for e in verdict.errors} <= {"LeaseBackendError"}, verdict.errors[:5]
    assert not outside, outside[:5]
    assert verdict.violations == []
    assert verdict.tenures >= 20  # the load ran and was judged
    verdict.report(fault, detect_s=f"{recovered_at - fault_at:.1f}")
    return verdict


def _acquired(key: str, owner: str, fence: int, start: float) -> dict[str, Any]:
    expires = start + TTL_MS / 1000
    return {"op": "acquire", "key": key, "owner": owner, "t0": start, "t1": start, "ok": True, "fence": fence} | {
        "expires": expires,
        "holder": owner,
    }


def _released(key: str, owner: str, fence: int, at: float) -> dict[str, Any]:
    return {"op": "release", "key": key, "owner": owner, "tenure": fence, "t0": at, "t1": at, "ok": True}


def test_the_judge_finds_overlaps_fences_that_go_back_and_shared_fences() -> None:
    clean = [_acquired("k", "a-1", 1, 100.0), _released("k", "a-1", 1, 101.0), _acquired("k", "b-2", 2, 101.5)]
    assert judge(clean).violations == []
    assert judge(clean).tenures == 2
    overlap = [_acquired("k", "a-1", 1, 100.0), _acquired("k", "b-2", 2, 103.0)]
    assert "before an earlier owner's acknowledged expiry" in " ".join(judge(overlap).violations)
    early = [_acquired("k", "a-1", 1, 100.0), _acquired("k", "b-2", 2, 101.0), _released("k", "a-1", 1, 102.0)]
    assert "before an earlier owner gave the lease up" in " ".join(judge(early).violations)
    waited = [_acquired("k", "a-1", 1, 100.0), _released("k", "a-1", 1, 101.0), _acquired("k", "b-2", 2, 100.99)]
    waited[-1]["t1"] = 101.01  # began (now()) before the release it waited for, answered after it
    assert judge(waited).violations == []
    back = [_acquired("k", "a-1", 5, 100.0), _acquired("k", "b-2", 4, 110.0)]
    assert "began after a larger fence was acknowledged" in " ".join(judge(back).violations)
    shared = [_acquired("k", "a-1", 3, 100.0), _acquired("k", "b-2", 3, 110.0)]
    assert "given to a-1 and b-2" in " ".join(judge(shared).violations)
    lost = [{"op": "violation", "key": "k", "owner": "a-1", "what": "renew refused 2.00 s early"}]
    assert judge(lost).violations == ["k a-1: renew refused 2.00 s early"]


class TestTwoNodes:
    """Primary + synchronous standby (``synchronous_mode: true``)."""

    async def test_kill_the_primary_under_load(self, cluster: PatroniCluster, tmp_path: Path) -> None:
        await run_fault_under_load(cluster, tmp_path, "kill")

    async def test_switchover_under_load(self, cluster: PatroniCluster, tmp_path: Path) -> None:
        await run_fault_under_load(cluster, tmp_path, "switchover")

    async def test_hold_keeps_a_lease_through_a_short_failover_and_gives_up_a_long_one_in_time(
        self, cluster: PatroniCluster
    ) -> None:
        prefix = f"hold-{uuid.uuid4().hex[:6]}"
        long_key, short_key = f"{prefix}:long", f"{prefix}:short"
        async with (
            SqlLeaseProvider(cluster.url, operation_timeout_s=OP_TIMEOUT_S) as provider,
            SqlLeaseProvider(cluster.url, operation_timeout_s=OP_TIMEOUT_S) as rival_provider,
            provider.hold(long_key, "long-holder", ttl_ms=45_000, renew_every_ms=1_000, on_lost="flag") as kept,
            provider.hold(short_key, "short-holder", ttl_ms=3_000, on_lost="flag") as short,
        ):

            async def declared_lost() -> float:
                await short.lost.wait()
                return time.time()

            async def rival_takes_it() -> Any:
                while True:
                    with contextlib.suppress(LeaseBackendError):
                        taken = await rival_provider.acquire_lease(short_key, "rival", 30_000)
                        if taken.acquired:
                            return taken
                    await asyncio.sleep(0.1)

            loss, rival = asyncio.create_task(declared_lost()), asyncio.create_task(rival_takes_it())
            old = cluster.wait_healthy()
            await asyncio.to_thread(cluster.kill_node, old)
            killed_at = time.time()
            cluster.former_primary = old
            await asyncio.to_thread(cluster.wait_leader_other_than, old)
            taken = await asyncio.wait_for(rival, 90)
            assert loss.done(), "the rival took the lease before its holder declared it lost"
            rival_start = taken.expires_at.timestamp() - 30
            assert await loss < rival_start
            await asyncio.to_thread(
                wait_for, lambda: kept.expires_at.timestamp() > killed_at + 45, 60, "a renewal after the failover"
            )
            assert not kept.lost.is_set()
            info = await answered(lambda: rival_provider.get_lease(long_key))
            assert info is not None and (info.owner, info.fence) == ("long-holder", kept.fence)
            print(f"\nFAILOVER scenario=hold lost_before_rival_s={rival_start - await loss:.1f}", flush=True)

    async def test_a_client_of_the_old_primary_alone_gets_a_read_only_error(self, cluster: PatroniCluster) -> None:
        former = cluster.former_primary
        if former is None or cluster.leader() == former:  # run on its own: make a former primary
            former = cluster.wait_healthy()
            await asyncio.to_thread(cluster.kill_node, former)
            await asyncio.to_thread(cluster.wait_leader_other_than, former)
            cluster.start_node(former)
            await asyncio.to_thread(cluster.wait_healthy)
        assert cluster.roles()[former] in ("replica", "sync_standby")
        key = f"old-primary:{uuid.uuid4().hex[:6]}"
        async with SqlLeaseProvider(cluster.url) as provider:
            assert (await provider.acquire_lease(key, "owner", 60_000)).acquired
        async with SqlLeaseProvider(cluster.node_url(former), operation_timeout_s=OP_TIMEOUT_S) as stale:
            assert await stale.get_lease_owner(key) == "owner"  # reads are answered, and true
            for write in (
                lambda: stale.acquire_lease(key, "other", 60_000),
                lambda: stale.acquire_lease(key, "owner", 60_000),
                lambda: stale.renew_lease(key, "owner", 60_000),
                lambda: stale.transfer_lease(key, "owner", "other", 60_000),
                lambda: stale.release_lease(key, "owner"),
            ):
                with pytest.raises(LeaseBackendError, match="read-only"):
                    await write()
        with (
            SyncSqlLeaseProvider(cluster.node_url(former), operation_timeout_s=OP_TIMEOUT_S) as sync_stale,
            pytest.raises(LeaseBackendError, match="read-only"),
        ):
            sync_stale.renew_lease(key, "owner", 60_000)
        async with SqlLeaseProvider(cluster.url) as provider:
            assert await provider.get_lease_owner(key) == "owner"

    @pytest.mark.parametrize("form", ["libpq", "sqlalchemy"])
    def test_both_url_forms_follow_the_primary_in_every_entry_point(self, cluster: PatroniCluster, form: str) -> None:
        leader = cluster.wait_healthy()
        ordered = sorted(cluster.nodes, key=lambda node: node.name == leader)  # a standby first
        hosts = [f"127.0.0.1:{node.pg_port}" for node in ordered]
        auth = cluster.url.split("//", 1)[1].split("@", 1)[0]
        if form == "libpq":
            url = f"postgresql://{auth}@{','.join(hosts)}/postgres?target_session_attrs=read-write"
        else:
            url = (
                f"postgresql://{auth}@/postgres?{'&'.join('host=' + h for h in hosts)}&target_session_attrs=read-write"
            )
        table = f"multihost_{form}"
        cli = [sys.executable, "-m", "sql_lease"]
        migrated = subprocess.run([*cli, "migrate", "--url", url, "--table", table], capture_output=True, text=True)
        assert migrated.returncode == 0, migrated.stderr
        assert auth.split(":")[1] not in migrated.stdout + migrated.stderr
        with SyncSqlLeaseProvider(url, table_name=table) as sync_provider:
            assert sync_provider.acquire_lease("k", "sync-owner", 60_000).acquired

        async def async_face() -> str | None:
            async with SqlLeaseProvider(url, table_name=table) as provider:
                assert not (await provider.acquire_lease("k", "async-owner", 60_000)).acquired
                return await provider.get_lease_owner("k")

        assert run_in_own_loop(async_face) == "sync-owner"
        status = subprocess.run([*cli, "status", "k", "--url", url, "--table", table], capture_output=True, text=True)
        assert status.returncode == 0 and "sync-owner" in status.stdout, status.stderr


@pytest.fixture(scope="class")
def three_nodes_strict() -> Iterator[PatroniCluster]:
    """Three nodes with ``synchronous_mode_strict: true`` (two could not lose one), migrated."""
    with patroni_cluster(nodes=3, strict=True) as cluster:
        run_in_own_loop(lambda: migrate(cluster.url))
        yield cluster


class TestStrictMode:
    async def test_with_no_sync_standby_left_every_write_fails_in_time_and_a_blocked_acquire_is_kept(
        self, three_nodes_strict: PatroniCluster
    ) -> None:
        cluster = three_nodes_strict
        leader = cluster.wait_healthy()
        prefix = f"strict-{uuid.uuid4().hex[:6]}"
        async with (
            SqlLeaseProvider(cluster.url, operation_timeout_s=OP_TIMEOUT_S, durable_release=True) as provider,
            SqlLeaseProvider(cluster.url, operation_timeout_s=OP_TIMEOUT_S) as lazy_releases,
        ):
            for name in ("renewed", "released", "transferred", "released-lazily"):
                assert (await provider.acquire_lease(f"{prefix}:{name}", "owner", 120_000)).acquired
            standbys = [node.name for node in cluster.nodes if node.name != leader]
            for name in standbys:
                await asyncio.to_thread(cluster.kill_node, name)

            async def timed(call: Any) -> tuple[BaseException | None, float]:
                started = time.monotonic()
                try:
                    await call
                except BaseException as exc:
                    return exc, time.monotonic() - started
                return None, time.monotonic() - started

            outcomes = await asyncio.gather(
                timed(provider.acquire_lease(f"{prefix}:blocked", "blocked-owner", 120_000)),
                timed(provider.renew_lease(f"{prefix}:renewed", "owner", 120_000)),
                timed(provider.release_lease(f"{prefix}:released", "owner")),
                timed(provider.transfer_lease(f"{prefix}:transferred", "owner", "next", 120_000)),
            )
            for error, elapsed in outcomes:
                assert isinstance(error, LeaseBackendError), error
                assert elapsed < OP_TIMEOUT_S * 2
            # without durable_release a release does not wait for the standby (docs/failover.md)
            assert await lazy_releases.release_lease(f"{prefix}:released-lazily", "owner")
            cluster.start_node(standbys[0])
            await asyncio.to_thread(cluster.wait_healthy, 120.0, 2)
            found = await answered(lambda: provider.get_lease(f"{prefix}:blocked"))
            assert found is not None and found.owner == "blocked-owner"
            again = await provider.acquire_lease(f"{prefix}:blocked", "blocked-owner", 120_000)
            assert again.acquired and again.fence == found.fence
            refused = await provider.acquire_lease(f"{prefix}:blocked", "rival", 120_000)
            assert not refused.acquired and refused.owner == "blocked-owner"
        print(f"\nFAILOVER scenario=strict operations={len(outcomes)} errors={len(outcomes)} violations=0", flush=True)

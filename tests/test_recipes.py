"""The framework recipes of examples/ against the real PostgreSQL: Django (ATOMIC_REQUESTS does not
swallow the lease), Flask, Celery workers, APScheduler in several processes, a cron script; and the
URLs applications already have, on both faces."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from sql_lease import SqlLeaseProvider, SyncSqlLeaseProvider

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
DJANGO_DIR = EXAMPLES / "django_app"
REDIS_URL = "redis://127.0.0.1:6379/15"  # db 15: apart from everything else on this Redis


def plain_url(pg_url: str) -> str:
    """``pg_url`` as ``postgresql://...`` (no driver), with the password."""
    return make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def env(pg_schema: tuple[str, str]) -> dict[str, str]:
    """Environment of the example processes: the test database, the session's lease schema."""
    url, schema = pg_schema
    return {
        **os.environ,
        "DATABASE_URL": plain_url(url),
        "SQL_LEASE_SCHEMA": schema,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }


def run(
    args: list[str], env: dict[str, str], cwd: Path = REPO, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done


def start_all(commands: list[list[str]], env: dict[str, str], cwd: Path = REPO) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        for command in commands
    ]


def finish_all(processes: list[subprocess.Popen[str]], timeout: float = 30) -> list[str]:
    """Wait for each process; all must exit 0. Returns their outputs."""
    outputs = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=timeout)
            assert process.returncode == 0, f"{process.args} exited {process.returncode}\n{stdout}\n{stderr}"
            outputs.append(stdout)
    finally:
        stop_all(processes)
    return outputs


def stop_all(processes: list[subprocess.Popen[str]], grace_s: float = 10) -> None:
    """SIGTERM each process (its own session) still running, SIGKILL it after ``grace_s``."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.communicate(timeout=max(0.1, deadline - time.monotonic()))  # and close its pipes
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


# -- Django ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def django_env(env: dict[str, str]) -> dict[str, str]:
    """The example project's environment, its tables migrated into the session's schema."""
    django_env = {**env, "DJANGO_DB_SCHEMA": env["SQL_LEASE_SCHEMA"], "DJANGO_SETTINGS_MODULE": "leasesite.settings"}
    run([sys.executable, "manage.py", "migrate", "--verbosity=0"], django_env, cwd=DJANGO_DIR)
    return django_env


def test_django_url_from_settings(django_env: dict[str, str]) -> None:
    script = textwrap.dedent(
        """
        import json, django
        django.setup()
        from django.conf import settings
        from sql_lease.django import sql_lease_url_from_django
        from reports.leases import leases
        out = {"url": sql_lease_url_from_django(), "owner": leases.get_lease_owner("nobody-has-this")}
        settings.DATABASES["other"] = {"ENGINE": "django.db.backends.postgresql", "NAME": "d b", "USER": "u@x",
            "PASSWORD": "p@ss:/", "HOST": "/var/run/postgresql", "PORT": "5433",
            "OPTIONS": {"sslmode": "require", "isolation_level": 1, "pool": True}}
        settings.DATABASES["lite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": "rel/db.sqlite3"}
        settings.DATABASES["mem"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
        out["other"] = sql_lease_url_from_django("other")
        out["lite"] = sql_lease_url_from_django("lite")
        for alias in ("mem", "missing"):
            try:
                sql_lease_url_from_django(alias)
            except (ValueError, KeyError) as exc:
                out[alias] = type(exc).__name__
        print(json.dumps(out))
        """
    )
    out = json.loads(run([sys.executable, "-c", script], django_env, cwd=DJANGO_DIR).stdout)
    assert out["owner"] is None  # the provider built from the URL works
    expected = make_url(django_env["DATABASE_URL"])
    got = make_url(out["url"])
    assert (got.host, got.port, got.database, got.username) == (
        expected.host,
        expected.port,
        expected.database,
        expected.username,
    )
    assert got.query["options"] == f"-c search_path={django_env['SQL_LEASE_SCHEMA']}"
    other = make_url(out["other"])
    assert (other.username, other.password, other.database, other.port) == ("u@x", "p@ss:/", "d b", 5433)
    assert dict(other.query) == {"sslmode": "require", "host": "/var/run/postgresql"}  # no Django-only options
    assert out["lite"] == "sqlite:///" + str(DJANGO_DIR / "rel" / "db.sqlite3")
    assert (out["mem"], out["missing"]) == ("ValueError", "KeyError")


DJANGO_VIEW_SCRIPT = """
import json, sys
import django
django.setup()
from django.conf import settings
from django.db import connection
from django.db.models.signals import post_save
from django.test import Client
from sql_lease import SyncSqlLeaseProvider
from sql_lease.django import sql_lease_url_from_django
from reports.models import Claim

thread = sys.argv[1]
key = f"thread:{thread}"
outside = SyncSqlLeaseProvider(sql_lease_url_from_django())  # connections of its own
out = {}

def fail_after_the_write(sender, instance, **kwargs):
    out["in_request_transaction"] = connection.in_atomic_block
    out["claims_inside"] = Claim.objects.filter(thread_id=thread).count()
    out["owner_seen_by_others_inside"] = outside.get_lease_owner(key)  # committed already
    raise RuntimeError("the view fails after the acquire and the write")

client = Client()
post_save.connect(fail_after_the_write, sender=Claim)
try:
    client.post(f"/threads/{thread}/claim", {"run": "run-a"})
except RuntimeError as exc:
    out["raised"] = str(exc)
post_save.disconnect(fail_after_the_write, sender=Claim)
out["claims_after"] = Claim.objects.filter(thread_id=thread).count()
out["owner_after"] = outside.get_lease_owner(key)
out["fence_after"] = outside.get_lease(key).fence

busy = client.post(f"/threads/{thread}/claim", {"run": "run-b"})
out["busy"] = [busy.status_code, busy.json()]
retry = client.post(f"/threads/{thread}/claim", {"run": "run-a"})
out["retry"] = [retry.status_code, retry.json()]
out["claims_after_retry"] = Claim.objects.filter(thread_id=thread).count()
release = client.post(f"/threads/{thread}/release", {"run": "run-a"})
out["release"] = [release.status_code, release.json()]
out["owner_end"] = outside.get_lease_owner(key)
print(json.dumps(out))
"""


def test_django_view_lease_survives_atomic_request_rollback(django_env: dict[str, str]) -> None:
    thread = uuid.uuid4().hex[:12]
    out = json.loads(run([sys.executable, "-c", DJANGO_VIEW_SCRIPT, thread], django_env, cwd=DJANGO_DIR).stdout)
    assert out["in_request_transaction"] is True  # ATOMIC_REQUESTS: the write ran in the request's transaction
    assert out["claims_inside"] == 1
    assert out["owner_seen_by_others_inside"] == "run-a"  # the acquire had committed on its own
    assert out["raised"] == "the view fails after the acquire and the write"
    assert out["claims_after"] == 0  # Django rolled its transaction back...
    assert out["owner_after"] == "run-a"  # ...and the lease is still held
    status, body = out["busy"]  # another run is told who holds the thread
    assert (status, body["holder"], body["fence"]) == (409, "run-a", out["fence_after"])
    assert 0 < body["retry_after_ms"] <= 30_000
    assert out["retry"] == [200, {"owner": "run-a", "fence": out["fence_after"]}]  # idempotent for the same run
    assert out["claims_after_retry"] == 1
    assert out["release"] == [200, {"released": True}]
    assert out["owner_end"] is None


def test_django_management_command_runs_once_at_a_time(django_env: dict[str, str]) -> None:
    command = [sys.executable, "manage.py", "nightly_report", "--work-seconds", "2"]
    outputs = finish_all(start_all([command, command], django_env, cwd=DJANGO_DIR))
    lines = sorted(out.strip() for out in outputs)
    assert lines[0].startswith("report ") and " written with fence " in lines[0], lines
    assert lines[1] == "skipped: another process holds the nightly-report lease", lines
    again = run(command[:3], django_env, cwd=DJANGO_DIR).stdout  # the lease was released: runs again
    assert " written with fence " in again


# -- Flask -------------------------------------------------------------------------------------


def test_flask_routes_work_to_the_holder(pg_schema: tuple[str, str]) -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        from flask_app import create_app
    finally:
        sys.path.remove(str(EXAMPLES))
    url, schema = pg_schema
    web1 = create_app(plain_url(url), schema=schema, instance_id="web-1")
    web2 = create_app(plain_url(url), schema=schema, instance_id="web-2")
    thread = uuid.uuid4().hex[:12]
    try:
        first = web1.test_client().post(f"/threads/{thread}/messages", data="hello")
        assert first.status_code == 200
        fence = first.json["fence"]
        assert first.json == {"handled_by": "web-1", "fence": fence}
        second = web2.test_client().post(f"/threads/{thread}/messages", data="again")
        assert second.status_code == 409
        assert second.json["holder"] == "web-1" and second.json["fence"] == fence
        assert 0 < second.json["retry_after_ms"] <= 30_000
        assert web1.test_client().post(f"/threads/{thread}/messages", data="more").json == {
            "handled_by": "web-1",
            "fence": fence,
        }
        assert web1.test_client().delete(f"/threads/{thread}/lease").json == {"released": True}
        third = web2.test_client().post(f"/threads/{thread}/messages", data="now me")
        assert third.status_code == 200 and third.json["handled_by"] == "web-2" and third.json["fence"] > fence
    finally:
        web1.extensions["sql_lease"].close()
        web2.extensions["sql_lease"].close()


# -- Celery ------------------------------------------------------------------------------------


@pytest.fixture
def celery_workers(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[Any, str, Path]]:
    """Two Celery worker processes (solo pool) on a queue of their own; (client app, queue, run log)."""
    from celery import Celery

    uid = uuid.uuid4().hex[:8]
    queue = f"sql_lease_recipes_{uid}"
    log = tmp_path / "celery_runs.txt"
    worker_env = {**env, "CELERY_BROKER_URL": REDIS_URL, "CELERY_QUEUE": queue, "RECIPE_RUN_LOG": str(log)}
    names = [f"w{i}-{uid}@recipes" for i in (1, 2)]
    quiet = ["-Q", queue, "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING"]
    workers = start_all(
        [
            [sys.executable, "-m", "celery", "-A", "examples.celery_app", "worker", "--pool=solo", "-n", name, *quiet]
            for name in names
        ],
        worker_env,
    )
    client = Celery("recipes-client", broker=REDIS_URL, backend=REDIS_URL)
    try:
        deadline = time.monotonic() + 20
        while True:
            replies = client.control.ping(destination=names, timeout=0.5)
            if len(replies) == len(names):
                break
            dead = [w for w in workers if w.poll() is not None]
            assert not dead, dead[0].communicate()
            assert time.monotonic() < deadline, "the Celery workers did not start"
        yield client, queue, log
    finally:
        stop_all(workers)
        client.close()
        import redis

        redis.Redis.from_url(REDIS_URL).delete(queue)


def test_celery_task_runs_once_at_a_time_across_workers(celery_workers: tuple[Any, str, Path]) -> None:
    client, queue, log = celery_workers
    n = 12
    results = []
    for _ in range(n):  # a task every 0.1 s, each run 0.3 s: some run, those sent meanwhile skip
        results.append(client.send_task("examples.celery_app.rebuild_index", kwargs={"work_seconds": 0.3}, queue=queue))
        time.sleep(0.1)
    answers = [result.get(timeout=20) for result in results]
    for result in results:
        result.forget()
    fences = [a for a in answers if a != "skipped"]
    skips = answers.count("skipped")
    runs = sorted(tuple(float(x) for x in line.split()[1:]) for line in log.read_text().splitlines())
    assert len(runs) == len(fences) and len(runs) + skips == n
    assert len(runs) >= 2 and skips >= 1, answers  # two workers: one ran while the other skipped
    for (_, end, fence), (start, _, next_fence) in itertools.pairwise(runs):
        assert start >= end, runs  # no two runs overlapped
        assert next_fence > fence


# -- APScheduler -------------------------------------------------------------------------------


def test_apscheduler_each_slot_runs_once_across_processes(env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "slots.txt"
    command = [sys.executable, str(EXAMPLES / "apscheduler_jobs.py"), "--url", env["DATABASE_URL"], "--seconds", "4"]
    finish_all(start_all([command] * 3, {**env, "RECIPE_RUN_LOG": str(log)}))
    runs = [line.split() for line in log.read_text().splitlines()]
    per_slot = Counter(slot for slot, _ in runs)
    assert len(per_slot) >= 3, per_slot  # a run every second for about 4 s
    assert set(per_slot.values()) == {1}, per_slot  # each scheduled run happened exactly once


# -- cron --------------------------------------------------------------------------------------


def test_cron_script_one_runs_one_skips(env: dict[str, str]) -> None:
    command = [sys.executable, str(EXAMPLES / "cron_job.py"), "--url", env["DATABASE_URL"], "--work-seconds", "2"]
    outputs = sorted(out.strip() for out in finish_all(start_all([command, command], env)))
    assert outputs[0].startswith("cleanup running with fence "), outputs
    assert outputs[1] == "cleanup skipped: another host is running it", outputs


# -- URLs people already have ------------------------------------------------------------------

URL_FORMS = ["postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"]


def url_form(pg_url: str, form: str) -> str:
    return form + plain_url(pg_url).removeprefix("postgresql://")


@pytest.mark.parametrize("form", URL_FORMS)
def test_url_forms_sync_face(pg_schema: tuple[str, str], form: str) -> None:
    url, schema = pg_schema
    key = f"url:{uuid.uuid4().hex}"
    with SyncSqlLeaseProvider(url_form(url, form), schema=schema) as leases:
        assert leases.acquire_lease(key, "me", ttl_ms=10_000).acquired
        assert leases.get_lease_owner(key) == "me"
        assert leases.release_lease(key, "me")


@pytest.mark.parametrize("form", URL_FORMS)
async def test_url_forms_async_face(pg_schema: tuple[str, str], form: str) -> None:
    url, schema = pg_schema
    key = f"url:{uuid.uuid4().hex}"
    async with SqlLeaseProvider(url_form(url, form), schema=schema) as leases:
        assert (await leases.acquire_lease(key, "me", ttl_ms=10_000)).acquired
        assert await leases.get_lease_owner(key) == "me"
        assert await leases.release_lease(key, "me")


async def test_url_of_an_existing_psycopg2_engine(pg_schema: tuple[str, str]) -> None:
    """An application on psycopg2 passes its engine's URL; each face uses its own driver."""
    from sqlalchemy import create_engine, text

    url, schema = pg_schema
    engine = create_engine(url_form(url, "postgresql+psycopg2://"))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1  # the application's psycopg2 engine works
        key = f"url:{uuid.uuid4().hex}"
        with SyncSqlLeaseProvider(engine.url, schema=schema) as sync_leases:
            assert sync_leases.acquire_lease(key, "sync", ttl_ms=10_000).acquired
            async with SqlLeaseProvider(engine.url, schema=schema) as async_leases:
                assert await async_leases.get_lease_owner(key) == "sync"
                assert not (await async_leases.acquire_lease(key, "async", ttl_ms=10_000)).acquired
            assert sync_leases.release_lease(key, "sync")
    finally:
        engine.dispose()

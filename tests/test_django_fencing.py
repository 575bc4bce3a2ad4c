"""Fenced writes with Django's ORM (issue 15): ``sql_lease.django.check_held``/``accept_fence`` on
Django's own connection inside ``transaction.atomic()``, on PostgreSQL and SQLite.

Django's settings can be configured once per process, so each backend runs one script in a
subprocess (the example project's ``reports`` app, migrated into the test database) and reports
what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from sql_lease import SyncSqlLeaseProvider

pytest.importorskip("django")

REPO = Path(__file__).resolve().parent.parent
DJANGO_DIR = REPO / "examples" / "django_app"

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import django
    from django.conf import settings

    lease_url, schema, db = sys.argv[1], sys.argv[2] or None, json.loads(sys.argv[3])
    settings.configure(
        DATABASES={"default": db}, INSTALLED_APPS=["reports"], USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from reports.models import Claim
    from sql_lease import LeaseLostError, StaleFenceError, SyncSqlLeaseProvider
    from sql_lease.django import accept_fence, check_held

    call_command("migrate", verbosity=0)
    run = sys.argv[4]
    leases = SyncSqlLeaseProvider(lease_url, schema=schema)
    other = SyncSqlLeaseProvider(lease_url, schema=schema)
    out = {}

    def claims(thread):
        return sorted(Claim.objects.filter(thread_id=thread).values_list("run_id", "fence"))

    def guarded(thread, key, owner, fence, write_first=True):
        "An ORM write guarded by check_held; the name of the error it raised, or None."
        try:
            with transaction.atomic():
                if write_first:
                    Claim.objects.create(thread_id=thread, run_id=owner, fence=fence)
                check_held(key, owner, fence, schema=schema)
                if not write_first:
                    Claim.objects.create(thread_id=thread, run_id=owner, fence=fence)
        except LeaseLostError as exc:
            return [type(exc).__name__, exc.key, exc.owner]
        return None

    # 1. held with that fence: commits. A key with % in it: no interpolation anywhere.
    key = f"invoice:50%s%%:{run}"
    held = leases.acquire_lease(key, "a", 60_000)
    out["held"] = guarded(f"t1-{run}", key, "a", held.fence, write_first=False)
    out["held_claims"] = claims(f"t1-{run}")

    # 2. a wrong fence, a wrong owner: LeaseLostError, the ORM write rolled back.
    out["wrong_fence"] = guarded(f"t2-{run}", key, "a", held.fence + 1)
    out["wrong_owner"] = guarded(f"t2-{run}", key, "b", held.fence)
    out["wrong_claims"] = claims(f"t2-{run}")

    # 2b. any str is a key: the error names the key as given, not its stored form.
    odd = f"odd\\x00\\x01{run}\\ud800"
    odd_held = leases.acquire_lease(odd, "a", 60_000)
    out["odd_held"] = guarded(f"t2b-{run}", odd, "a", odd_held.fence, write_first=False)
    out["odd_wrong_fence"] = guarded(f"t2b-{run}", odd, "a", odd_held.fence + 1)
    out["odd_key"] = odd

    # 3. a stalled holder after a takeover: refused and rolled back; the new holder's write commits.
    short = f"report:{run}"
    stalled = leases.acquire_lease(short, "a", 200)
    time.sleep(0.5)
    taken = other.acquire_lease(short, "b", 60_000)
    out["takeover"] = [taken.acquired, taken.fence > stalled.fence]
    out["stalled"] = guarded(f"t3-{run}", short, "a", stalled.fence)
    out["new_holder"] = guarded(f"t3-{run}", short, "b", taken.fence)
    out["takeover_claims"] = [list(c) for c in claims(f"t3-{run}")]
    out["taken_fence"] = taken.fence

    # 4. a takeover attempted while a guarded transaction is open waits for it.
    waiting = f"wait:{run}"
    result = {}
    with transaction.atomic():
        first = leases.acquire_lease(waiting, "a", 1500)  # checked at once: seconds, on a loaded machine
        check_held(waiting, "a", first.fence, schema=schema)
        Claim.objects.create(thread_id=f"t4-{run}", run_id="a", fence=first.fence)
        time.sleep(1.6)  # the lease expires meanwhile
        thread = threading.Thread(target=lambda: result.update(lease=other.acquire_lease(waiting, "b", 60_000)))
        thread.start()
        time.sleep(0.5)
        out["takeover_waited"] = thread.is_alive()
    thread.join(10)
    late = result["lease"]
    out["late_takeover"] = [late.acquired, late.owner, late.fence > first.fence]
    out["wait_claims"] = len(claims(f"t4-{run}"))

    # 5. outside atomic: RuntimeError, nothing run.
    for name, call in (("check_held", lambda: check_held(key, "a", held.fence, schema=schema)),
                       ("accept_fence", lambda: accept_fence("bucket", 1, schema=schema))):
        try:
            call()
            out["outside_" + name] = None
        except RuntimeError as exc:
            out["outside_" + name] = str(exc)

    # 6. accept_fence: keeps the highest, accepts an equal one, refuses a stale one (rolled back).
    resource = f"bucket:{run}"
    accepted = []
    for fence in (5, 5, 3, 7):
        try:
            with transaction.atomic():
                Claim.objects.create(thread_id=f"t6-{run}", run_id="w", fence=fence)
                accepted.append(accept_fence(resource, fence, schema=schema))
        except StaleFenceError as exc:
            accepted.append(["StaleFenceError", exc.fence, exc.accepted])
    out["accepted"] = accepted
    out["accept_claims"] = sorted(f for _, f in claims(f"t6-{run}"))
    out["autocommit_after"] = connection.get_autocommit()
    leases.close()
    other.close()
    print(json.dumps(out))
    """
)


def run_script(lease_url: str, schema: str | None, django_db: dict[str, Any]) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(DJANGO_DIR), os.environ.get("PYTHONPATH")])),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    args = [sys.executable, "-c", SCRIPT, lease_url, schema or "", json.dumps(django_db), uuid.uuid4().hex[:10]]
    done = subprocess.run(args, env=env, cwd=DJANGO_DIR, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def check(out: dict[str, Any]) -> None:
    assert out["held"] is None and len(out["held_claims"]) == 1  # the guarded write committed
    assert out["wrong_fence"][0] == "LeaseLostError" and out["wrong_owner"][0] == "LeaseLostError"
    assert out["wrong_claims"] == []  # rolled back
    assert out["odd_held"] is None
    assert out["odd_wrong_fence"] == ["LeaseLostError", out["odd_key"], "a"]  # the key as given
    assert out["takeover"] == [True, True]
    assert out["stalled"][0] == "LeaseLostError" and out["stalled"][2] == "a"
    assert out["new_holder"] is None
    assert out["takeover_claims"] == [["b", out["taken_fence"]]]  # nothing of the stalled holder's
    assert out["takeover_waited"] is True  # the takeover waited for the guarded transaction...
    assert out["late_takeover"] == [True, "b", True]  # ...then proceeded with a larger fence
    assert out["wait_claims"] == 1
    for name in ("check_held", "accept_fence"):
        assert "transaction.atomic" in out["outside_" + name], out["outside_" + name]
    assert out["accepted"] == [5, 5, ["StaleFenceError", 3, 5], 7]
    assert out["accept_claims"] == [5, 5, 7]  # the stale writer's write was rolled back
    assert out["autocommit_after"] is True


@pytest.mark.postgres
def test_django_fenced_writes_on_postgres(pg_schema: tuple[str, str]) -> None:
    url, schema = pg_schema
    plain = make_url(url).set(drivername="postgresql")
    django_db = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": plain.database,
        "USER": plain.username or "",
        "PASSWORD": plain.password or "",
        "HOST": plain.host or "",
        "PORT": plain.port or "",
        "OPTIONS": {"options": f"-c search_path={schema}"},
    }
    check(run_script(plain.render_as_string(hide_password=False), schema, django_db))


def test_django_fenced_writes_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with SyncSqlLeaseProvider(f"sqlite:///{path}") as provider:
        provider.migrate()
    django_db = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path), "OPTIONS": {"timeout": 10}}
    check(run_script(f"sqlite:///{path}", None, django_db))


def test_bad_arguments_raise_before_django_is_touched() -> None:
    from sql_lease.django import accept_fence, check_held

    with pytest.raises(TypeError):
        check_held("k", "a", "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        check_held("k", "a", 0)
    with pytest.raises(ValueError):
        accept_fence("", 1)

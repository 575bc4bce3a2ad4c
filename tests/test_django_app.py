"""Django the way Django apps are built (issue 21, item 5): ``INSTALLED_APPS += ["sql_lease.django"]``
and ``manage.py migrate`` make the lease table (``--database`` honoured, the same DDL as
``sql-lease migrate``, each tool finding the other's work current), and ``provider()`` under
``manage.py test`` keeps its leases in the test database, on SQLite (the in-memory test database)
and PostgreSQL.

The project is written by the test into a temporary directory; its lease and view modules are the
README's Django snippets, pasted as they are. Every ``manage.py`` runs in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sql_lease import SyncSqlLeaseProvider
from sql_lease.sql.migrate import HEAD_REVISION

pytest.importorskip("django")

REPO = Path(__file__).resolve().parent.parent
DJANGO_MIGRATIONS = sorted(path.stem for path in (REPO / "sql_lease" / "django" / "migrations").glob("0*.py"))
LEASE_OBJECTS = ("sql_leases", "sql_leases_fence", "sql_leases_fences", "sql_lease_alembic_version")


def readme_django_snippets() -> dict[str, str]:
    """The Django recipe's code blocks, by the file their first line names (``# reports/leases.py``)."""
    recipes = (REPO / "docs" / "recipes.md").read_text()
    start = recipes.index("\n## Django\n")
    section = recipes[start : recipes.index("\n## ", start + 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    snippets = {}
    for block in blocks:
        match = re.match(r"# (\S+\.py)\b", block)
        assert match, f"a Django recipe block does not start with the file it belongs in:\n{block}"
        snippets[match[1]] = block
    assert set(snippets) == {"settings.py", "reports/leases.py", "reports/views.py"}, snippets.keys()
    return snippets


SETTINGS = """
import json, os
SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "proj.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
MIDDLEWARE = []
DATABASES = json.loads(os.environ["TEST_DJANGO_DATABASES"])
INSTALLED_APPS = ["reports"]
"""

MODELS = """
from django.db import models


class Claim(models.Model):
    thread_id = models.CharField(max_length=200)
    run_id = models.CharField(max_length=200)
    fence = models.BigIntegerField()
"""

URLS = """
from django.urls import path
from reports import views

urlpatterns = [path("threads/<str:thread_id>/claim", views.claim_thread)]
"""

# The project's own tests, run by `manage.py test`: the leases live in the test database.
APP_TESTS = """
import json, os
from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase

from .leases import leases
from .models import Claim


def lease_owner_seen_by_django(key):
    with connection.cursor() as cursor:
        cursor.execute("SELECT owner FROM sql_leases WHERE key = %s", [key])
        row = cursor.fetchone()
    return None if row is None else row[0]


class ViewTests(TransactionTestCase):  # SQLite: no lease write while a TestCase transaction has written
    def test_the_view_claims_a_thread_in_the_test_database(self):
        first = self.client.post("/threads/t1/claim", {"run": "run-1"})
        self.assertEqual(first.status_code, 200, first.content)
        busy = self.client.post("/threads/t1/claim", {"run": "run-2"})
        self.assertEqual((busy.status_code, busy.json()["holder"]), (409, "run-1"))
        self.assertEqual(lease_owner_seen_by_django("thread:t1"), "run-1")  # Django's test DB has it
        self.assertEqual(Claim.objects.filter(thread_id="t1").count(), 1)
        with open(os.environ["TEST_DJANGO_REPORT"], "w") as report:
            json.dump({"test_db": str(connection.settings_dict["NAME"]), "bound": leases.bound}, report)


class LeaseTests(TestCase):
    def test_leases_inside_a_test_case(self):
        # SQLite (shared cache): no lease write once this test's transaction has read the lease
        # table or written anything, so Django's own read comes last
        self.assertTrue(leases.acquire_lease("in-test-case", "me", ttl_ms=60_000).acquired)
        self.assertFalse(leases.acquire_lease("in-test-case", "other", ttl_ms=60_000).acquired)
        self.assertEqual(lease_owner_seen_by_django("in-test-case"), "me")


class OwnTransactionTests(TransactionTestCase):
    def test_a_lease_commits_outside_the_transaction(self):
        try:
            with transaction.atomic():
                self.assertTrue(leases.acquire_lease("outside", "me", ttl_ms=60_000).acquired)
                Claim.objects.create(thread_id="outside", run_id="me", fence=1)
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        self.assertEqual(Claim.objects.filter(thread_id="outside").count(), 0)
        self.assertEqual(leases.get_lease_owner("outside"), "me")
        self.assertEqual(lease_owner_seen_by_django("outside"), "me")


class WaitingTests(TransactionTestCase):
    def test_a_waiter_leaves_no_connection_to_the_test_database(self):
        from sql_lease import LeaseNotAcquiredError

        self.assertTrue(leases.acquire_lease("waited", "holder", ttl_ms=60_000).acquired)
        with self.assertRaises(LeaseNotAcquiredError):
            leases.acquire_lease_wait("waited", "other", 60_000, timeout_s=0.3)
        self.assertTrue(leases.release_lease("waited", "holder"))
"""


def write_project(root: Path) -> None:
    snippets = readme_django_snippets()
    (root / "proj").mkdir()
    (root / "reports").mkdir()  # no migrations: the test runner creates its tables
    (root / "manage.py").write_text(
        "import os, sys\nos.environ.setdefault('DJANGO_SETTINGS_MODULE', 'proj.settings')\n"
        "from django.core.management import execute_from_command_line\nexecute_from_command_line(sys.argv)\n"
    )
    (root / "proj" / "__init__.py").write_text("")
    (root / "proj" / "settings.py").write_text(SETTINGS + snippets["settings.py"])
    (root / "proj" / "urls.py").write_text(URLS)
    (root / "reports" / "__init__.py").write_text("")
    (root / "reports" / "models.py").write_text(MODELS)
    (root / "reports" / "leases.py").write_text(snippets["reports/leases.py"])
    (root / "reports" / "views.py").write_text(snippets["reports/views.py"])
    (root / "reports" / "tests.py").write_text(APP_TESTS)


def manage(root: Path, databases: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TEST_DJANGO_DATABASES": json.dumps(databases),
        "TEST_DJANGO_REPORT": str(root / "report.json"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"manage.py {args} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def run_app_tests(root: Path, databases: dict[str, Any]) -> dict[str, Any]:
    done = manage(root, databases, "test", "reports", "--noinput", "-v", "2")
    assert "Ran 4 tests" in done.stderr and "OK" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    report: dict[str, Any] = json.loads((root / "report.json").read_text())
    assert report["bound"] is True
    return report


# -- SQLite --------------------------------------------------------------------------------------


def sqlite_schema(path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE tbl_name IN (?, ?, ?, ?)", LEASE_OBJECTS)
        return sorted((kind, name, re.sub(r"\s+", " ", sql or "").strip()) for kind, name, sql in rows)


def lease_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM sql_leases").fetchone()[0])


def test_sqlite_migrate_and_test(tmp_path: Path) -> None:
    write_project(tmp_path)
    real, other = tmp_path / "real.sqlite3", tmp_path / "other.sqlite3"
    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(real)},
        "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(other)},
    }
    # --database honoured: only that alias's database gets the table
    manage(tmp_path, databases, "migrate", "--database", "other", "-v", "0")
    assert {name for _, name, _ in sqlite_schema(other)} >= set(LEASE_OBJECTS)
    assert not real.exists() or sqlite_schema(real) == []
    # sql-lease migrate first, then manage.py migrate: the Django migration finds it current
    with SyncSqlLeaseProvider(f"sqlite:///{real}") as leases:
        assert leases.migrate() == HEAD_REVISION
    alembic_made = sqlite_schema(real)
    manage(tmp_path, databases, "migrate", "-v", "0")
    assert sqlite_schema(real) == alembic_made
    with sqlite3.connect(real) as conn:
        applied = conn.execute("SELECT name FROM django_migrations WHERE app = 'sql_lease' ORDER BY name").fetchall()
        assert [name for (name,) in applied] == DJANGO_MIGRATIONS
    # the same DDL, whichever tool ran it
    assert sqlite_schema(other) == alembic_made
    # manage.py migrate first, then sql-lease migrate: nothing to do, and the table works
    with SyncSqlLeaseProvider(f"sqlite:///{other}") as leases:
        assert leases.migrate() == HEAD_REVISION
        assert leases.acquire_lease("k", "me", ttl_ms=10_000).fence >= 1
        assert leases.release_lease("k", "me")
    assert sqlite_schema(other) == alembic_made

    report = run_app_tests(tmp_path, databases)
    assert "mode=memory" in report["test_db"]  # Django's in-memory test database...
    assert lease_rows(real) == 0  # ...held the leases; the real database got none

    # migrate sql_lease 0002 reverses 0003 (Alembic 0005): keys the earlier release cannot name are
    # deleted, the others turned back; migrating forward again stores them escaped once more
    with SyncSqlLeaseProvider(f"sqlite:///{other}") as leases:
        assert leases.acquire_lease("nul\x00key", "me", ttl_ms=60_000).acquired
        assert leases.acquire_lease("escape\x01key", "me", ttl_ms=60_000).acquired
    manage(tmp_path, databases, "migrate", "sql_lease", "0002", "--database", "other", "-v", "0")
    with sqlite3.connect(other) as conn:
        assert conn.execute("SELECT version_num FROM sql_lease_alembic_version").fetchall() == [("0004",)]
        assert conn.execute("SELECT key FROM sql_leases ORDER BY key").fetchall() == [("escape\x01key",)]
    manage(tmp_path, databases, "migrate", "sql_lease", "--database", "other", "-v", "0")
    with SyncSqlLeaseProvider(f"sqlite:///{other}") as leases:
        assert leases.get_lease_owner("escape\x01key") == "me" and leases.get_lease_owner("nul\x00key") is None

    # migrate sql_lease zero drops what the migration made
    manage(tmp_path, databases, "migrate", "sql_lease", "zero", "--database", "other", "-v", "0")
    assert not {name for _, name, _ in sqlite_schema(other)} & {
        "sql_leases",
        "sql_leases_fence",
        "sql_leases_fences",
        "sql_leases_slots",
    }


# -- PostgreSQL ----------------------------------------------------------------------------------


@pytest.fixture
def pg_databases(pg_url: str) -> Iterator[tuple[str, str, str]]:
    """Two fresh databases (one for manage.py migrate, one for sql-lease migrate) and the unique
    name of Django's test database, on the test server; dropped afterwards."""
    suffix = uuid.uuid4().hex[:10]
    names = (f"sqldj_{suffix}", f"sqldj_{suffix}_ref", f"test_sqldj_{suffix}")
    admin = sa.create_engine(
        sa.make_url(pg_url).set(drivername="postgresql+psycopg"),
        isolation_level="AUTOCOMMIT",
        poolclass=sa.pool.NullPool,
    )
    with admin.connect() as conn:
        for name in names[:2]:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield names
    finally:
        with admin.connect() as conn:
            for name in names:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def pg_schema_of(url: sa.URL) -> dict[str, Any]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        inspector = sa.inspect(engine)
        tables = [name for name in LEASE_OBJECTS if inspector.has_table(name)]
        return {
            "sequences": [name for name in inspector.get_sequence_names() if name.startswith("sql_lease")],
            **{
                name: (
                    [(c["name"], str(c["type"]), c["nullable"], c["default"]) for c in inspector.get_columns(name)],
                    inspector.get_pk_constraint(name),
                    inspector.get_indexes(name),
                )
                for name in tables
            },
        }
    finally:
        engine.dispose()


@pytest.mark.postgres
def postgres_databases(base: sa.URL, name: str, test: dict[str, str] | None = None) -> dict[str, Any]:
    """``DATABASES`` with one PostgreSQL alias on the test server (``TEST`` settings if given)."""
    default = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": base.username or "",
        "PASSWORD": base.password or "",
        "HOST": base.host or "",
        "PORT": base.port or "",
    }
    return {"default": default if test is None else {**default, "TEST": test}}


def test_postgres_migrate_and_test(tmp_path: Path, pg_url: str, pg_databases: tuple[str, str, str]) -> None:
    real, ref, test_name = pg_databases
    base = sa.make_url(pg_url).set(drivername="postgresql+psycopg")
    write_project(tmp_path)
    databases = postgres_databases(base, real, {"NAME": test_name})  # unique: parallel runs do not collide
    manage(tmp_path, databases, "migrate", "-v", "0")
    with SyncSqlLeaseProvider(base.set(database=ref)) as leases:
        assert leases.migrate() == HEAD_REVISION
    assert pg_schema_of(base.set(database=real)) == pg_schema_of(base.set(database=ref))  # the same DDL
    django_made = pg_schema_of(base.set(database=real))
    with SyncSqlLeaseProvider(base.set(database=real)) as leases:
        assert leases.migrate() == HEAD_REVISION  # current: sql-lease migrate has nothing to do
        assert leases.get_lease_owner("nobody") is None
    assert pg_schema_of(base.set(database=real)) == django_made

    report = run_app_tests(tmp_path, databases)
    assert report["test_db"] == test_name
    engine = sa.create_engine(base.set(database=real), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM sql_leases").scalar() == 0  # nothing in the real one
    finally:
        engine.dispose()


PROVIDER_SCRIPT = """
import json, sys
import django
from django.conf import settings
settings.configure(
    DATABASES={
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]},
        "private": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        "other": {"ENGINE": "django.db.backends.dummy", "NAME": "x"},
        "mysql": {"ENGINE": "django.db.backends.mysql", "NAME": "x"},
    },
    INSTALLED_APPS=["sql_lease.django"],
)
django.setup()
from django.core.management import call_command
from sql_lease import ProviderClosedError, SyncSqlLeaseProvider
from sql_lease.django import provider

out = {}
for bad in ({"using": 1}, {"table_name": "no such"}, {"operation_timeout_s": 0}):
    try:
        provider(**bad)
    except (TypeError, ValueError) as exc:
        out[next(iter(bad))] = type(exc).__name__
for alias in ("missing", "private", "other"):
    try:
        provider(alias).get_lease_owner("k")
    except (KeyError, ValueError) as exc:
        out[alias] = type(exc).__name__
from sql_lease.django import sql_lease_url_from_django
try:
    sql_lease_url_from_django("mysql")
except ValueError as exc:
    out["mysql"] = str(exc)
unused = provider()
out["repr_unbound"] = repr(unused)
unused.close()
try:
    unused.get_lease_owner("k")
except ProviderClosedError:
    out["closed_unused"] = [unused.closed, unused.bound]
call_command("migrate", verbosity=0)
leases = provider()
out["is_sync_provider"] = isinstance(leases, SyncSqlLeaseProvider)
out["bound_before"] = leases.bound
out["acquired"] = leases.acquire_lease("k", "me", ttl_ms=10_000).acquired
out["bound_after"] = leases.bound
with leases.hold("held", ttl_ms=10_000) as lease:
    out["hold_fence"] = lease.fence
leases.close()
out["closed"] = leases.closed
print(json.dumps(out))
"""


def test_provider_binds_at_first_use_and_checks_arguments_first(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", PROVIDER_SCRIPT, str(tmp_path / "db.sqlite3")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["using"], out["table_name"], out["operation_timeout_s"]) == ("TypeError", "ValueError", "ValueError")
    assert (out["missing"], out["private"], out["other"]) == ("KeyError", "ValueError", "ValueError")
    assert "sql-lease migrate --url mysql://" in out["mysql"] and "SyncSqlLeaseProvider" in out["mysql"], out
    assert "using='default'" in out["repr_unbound"]
    assert out["closed_unused"] == [True, False]  # closed before use: settings never read
    assert out["is_sync_provider"] is True
    assert (out["bound_before"], out["acquired"], out["bound_after"]) == (False, True, True)
    assert out["hold_fence"] >= 1 and out["closed"] is True


LATE_TESTS = """
from django.test import TransactionTestCase


class LateTests(TransactionTestCase):
    def test_a_provider_made_inside_a_test(self):
        from .leases import leases  # made now, after the runner switched to the test database

        self.assertTrue(leases.acquire_lease("late", "me", ttl_ms=60_000).acquired)
        self.assertEqual(leases.get_lease_owner("late"), "me")
"""


def test_postgres_provider_made_inside_a_test_lets_the_runner_drop_the_test_database(
    tmp_path: Path, pg_url: str, pg_databases: tuple[str, str, str]
) -> None:
    """Without ``TEST["NAME"]``, a provider first made under the test runner (a view module imported
    on the test client's first request) keeps no idle connection: the test database is dropped."""
    real, _ref, test_name = pg_databases
    assert test_name == f"test_{real}"  # Django's default test database name
    base = sa.make_url(pg_url).set(drivername="postgresql+psycopg")
    write_project(tmp_path)
    (tmp_path / "reports" / "tests.py").write_text(LATE_TESTS)
    databases = postgres_databases(base, real)
    done = manage(tmp_path, databases, "test", "reports", "--noinput", "-v", "2")
    assert "Ran 1 test" in done.stderr and "OK" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "being accessed" not in done.stderr, done.stderr
    engine = sa.create_engine(base.set(database=real), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            left = conn.exec_driver_sql("SELECT count(*) FROM pg_database WHERE datname = %s", (test_name,)).scalar()
        assert left == 0, "the test database was left behind"
    finally:
        engine.dispose()

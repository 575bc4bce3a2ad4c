"""The lease table at Alembic revision 0007 (SQLite: the slot table's triggers and live-slot index,
so a semaphore's grant, renewal and release are one statement each; PostgreSQL: shorter slot
functions; nothing on MySQL): the statements of ``migrations/versions/0007``, run on this alias's
connection, which also record 0007 in ``sql_lease_alembic_version`` for ``sql-lease migrate``."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations  # type: ignore[import-not-found,import-untyped,unused-ignore]

from sql_lease.django.schema import downgrade_connection, upgrade_connection

ALEMBIC_REVISION = "0007"


def forwards(apps: Any, schema_editor: Any) -> None:
    upgrade_connection(schema_editor.connection, ALEMBIC_REVISION)


def backwards(apps: Any, schema_editor: Any) -> None:
    downgrade_connection(schema_editor.connection, "0006")


class Migration(migrations.Migration):  # type: ignore[misc,unused-ignore]
    dependencies: ClassVar[list[tuple[str, str]]] = [("sql_lease", "0004_semaphore_slots")]
    operations: ClassVar[list[Any]] = [migrations.RunPython(forwards, backwards, elidable=False)]

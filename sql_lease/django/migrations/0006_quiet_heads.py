"""The lease table at Alembic revision 0008 (PostgreSQL: slot functions that rewrite a semaphore's
head row less often; nothing on SQLite or MySQL): the statements of ``migrations/versions/0008``, run
on this alias's connection, which also record 0008 in ``sql_lease_alembic_version`` for
``sql-lease migrate``."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations  # type: ignore[import-not-found,import-untyped,unused-ignore]

from sql_lease.django.schema import downgrade_connection, upgrade_connection

ALEMBIC_REVISION = "0008"


def forwards(apps: Any, schema_editor: Any) -> None:
    upgrade_connection(schema_editor.connection, ALEMBIC_REVISION)


def backwards(apps: Any, schema_editor: Any) -> None:
    downgrade_connection(schema_editor.connection, "0007")


class Migration(migrations.Migration):  # type: ignore[misc,unused-ignore]
    dependencies: ClassVar[list[tuple[str, str]]] = [("sql_lease", "0005_faster_slots")]
    operations: ClassVar[list[Any]] = [migrations.RunPython(forwards, backwards, elidable=False)]

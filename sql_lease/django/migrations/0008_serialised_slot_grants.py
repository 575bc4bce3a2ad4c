"""The lease table at Alembic revision 0010 (PostgreSQL: the slot acquire function takes the key's
advisory lock, as plain acquires do; nothing on SQLite or MySQL): the statements of
``migrations/versions/0010``, run on this alias's connection, which also record 0010 in
``sql_lease_alembic_version`` for ``sql-lease migrate``."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations  # type: ignore[import-not-found,import-untyped,unused-ignore]

from sql_lease.django.schema import downgrade_connection, upgrade_connection

ALEMBIC_REVISION = "0010"


def forwards(apps: Any, schema_editor: Any) -> None:
    upgrade_connection(schema_editor.connection, ALEMBIC_REVISION)


def backwards(apps: Any, schema_editor: Any) -> None:
    downgrade_connection(schema_editor.connection, "0009")


class Migration(migrations.Migration):  # type: ignore[misc,unused-ignore]
    dependencies: ClassVar[list[tuple[str, str]]] = [("sql_lease", "0007_mysql_slot_procedures")]
    operations: ClassVar[list[Any]] = [migrations.RunPython(forwards, backwards, elidable=False)]

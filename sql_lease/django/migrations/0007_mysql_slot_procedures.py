"""The lease table at Alembic revision 0009 (MySQL/MariaDB: the slot acquire and release procedures;
nothing on PostgreSQL or SQLite): the statements of ``migrations/versions/0009``, run on this alias's
connection, which also record 0009 in ``sql_lease_alembic_version`` for ``sql-lease migrate``."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations  # type: ignore[import-not-found,import-untyped,unused-ignore]

from sql_lease.django.schema import downgrade_connection, upgrade_connection

ALEMBIC_REVISION = "0009"


def forwards(apps: Any, schema_editor: Any) -> None:
    upgrade_connection(schema_editor.connection, ALEMBIC_REVISION)


def backwards(apps: Any, schema_editor: Any) -> None:
    downgrade_connection(schema_editor.connection, "0008")


class Migration(migrations.Migration):  # type: ignore[misc,unused-ignore]
    dependencies: ClassVar[list[tuple[str, str]]] = [("sql_lease", "0006_quiet_heads")]
    operations: ClassVar[list[Any]] = [migrations.RunPython(forwards, backwards, elidable=False)]

"""The lease table at Alembic revision 0003: the statements of ``migrations/versions/0001`` to
``0003``, run on this alias's connection (``manage.py migrate [--database ALIAS]``), which also
record 0003 in ``sql_lease_alembic_version`` for ``sql-lease migrate``.

A later Alembic revision comes with a Django migration of its own that upgrades to it."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations  # type: ignore[import-not-found,import-untyped,unused-ignore]

from sql_lease.django.schema import downgrade_connection, upgrade_connection

ALEMBIC_REVISION = "0003"


def forwards(apps: Any, schema_editor: Any) -> None:
    upgrade_connection(schema_editor.connection, ALEMBIC_REVISION)


def backwards(apps: Any, schema_editor: Any) -> None:
    downgrade_connection(schema_editor.connection)


class Migration(migrations.Migration):  # type: ignore[misc,unused-ignore]
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [migrations.RunPython(forwards, backwards, elidable=False)]

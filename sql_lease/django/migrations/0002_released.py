"""The lease table at Alembic revision 0004 (the ``released`` column of a minimum hold): the
statements of ``migrations/versions/0004``, run on this alias's connection, which also record 0004 in
``sql_lease_alembic_version`` for ``sql-lease migrate``. Reversed, it leaves the column (a table at
0004 serves this release and the one before it); ``migrate sql_lease zero`` drops the whole table."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations  # type: ignore[import-not-found,import-untyped,unused-ignore]

from sql_lease.django.schema import upgrade_connection

ALEMBIC_REVISION = "0004"


def forwards(apps: Any, schema_editor: Any) -> None:
    upgrade_connection(schema_editor.connection, ALEMBIC_REVISION)


class Migration(migrations.Migration):  # type: ignore[misc,unused-ignore]
    dependencies: ClassVar[list[tuple[str, str]]] = [("sql_lease", "0001_initial")]
    operations: ClassVar[list[Any]] = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]

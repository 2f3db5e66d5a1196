"""The binary, no-pad collation every queue table gets on MySQL/MariaDB
(docs/reference/schema.md, "Binary, no-pad collation"), as one migration step.

The leading underscore keeps Django's migration loader from taking this module for a
migration.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def binary_collation(connection: Any) -> str:
    """The utf8mb4 collation that compares bytes and keeps trailing spaces significant.

    utf8mb4_bin (the RFC's) pads with spaces, so ids "a" and "a " would collide in the
    unique key; the NO PAD binary collations compare exactly, like SQLite does. (MySQL
    before 8.0.17 has no NO PAD binary collation: there utf8mb4_bin is the best choice.)
    A frozen copy of the rule system check E104 applies (``sqlqueue.checks``): a
    migration must not change with live code.
    """
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    if tuple(connection.mysql_version) >= (8, 0, 17):
        return "utf8mb4_0900_bin"
    return "utf8mb4_bin"


def use_binary_collation(*tables: str) -> migrations.RunPython:
    """A step that converts ``tables`` to the binary collation; nothing elsewhere
    (SQLite compares text as bytes already, PostgreSQL's default collation is not used
    for keys: its ``text`` equality is byte-wise)."""

    def convert(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.vendor != "mysql":
            return
        collation = binary_collation(connection)
        for table in tables:
            schema_editor.execute(
                f"ALTER TABLE {schema_editor.quote_name(table)} "
                f"CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
            )

    return migrations.RunPython(convert, migrations.RunPython.noop, atomic=False,
                                elidable=False)

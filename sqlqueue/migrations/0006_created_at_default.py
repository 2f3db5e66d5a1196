# Hand-written: on MySQL and MariaDB, queue_messages.created_at defaults to the database
# clock, so the publishing INSERT can leave it out (sqlqueue.storage.statements.publishing,
# MySQLPublishing.store_messages). SQLite keeps the clock expression in the INSERT: it
# cannot change a column's default without rebuilding the table. A frozen copy of the
# clock expression (MySQLVendor.now_ms_sql): a migration must not change with live code.

from django.db import migrations

NOW_MS = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"


def _change_default(schema_editor, *, drop):
    if schema_editor.connection.vendor != "mysql":
        return
    change = "DROP DEFAULT" if drop else f"SET DEFAULT ({NOW_MS})"
    schema_editor.execute(f"ALTER TABLE `queue_messages` ALTER COLUMN `created_at` {change}")


def created_at_defaults_to_the_database_clock(apps, schema_editor):
    _change_default(schema_editor, drop=False)


def drop_the_default(apps, schema_editor):
    _change_default(schema_editor, drop=True)


class Migration(migrations.Migration):

    dependencies = [
        ('sqlqueue', '0005_task_results'),
    ]

    operations = [
        migrations.RunPython(
            created_at_defaults_to_the_database_clock, drop_the_default, atomic=False,
            elidable=False,
        ),
    ]

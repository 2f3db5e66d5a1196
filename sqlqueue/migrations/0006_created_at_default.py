# Hand-written: on MySQL and MariaDB, queue_messages.created_at defaults to the database
# clock, so the publishing INSERT can leave it out (sqlqueue.storage.sql.mysql,
# "insert_messages"). SQLite keeps the clock expression in the INSERT: it cannot change a
# column's default without rebuilding the table.

from django.db import migrations


def _change_default(schema_editor, *, drop):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    from sqlqueue.storage.sql import dialect_for

    schema_editor.execute(dialect_for(connection).created_at_default_sql(drop=drop))


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

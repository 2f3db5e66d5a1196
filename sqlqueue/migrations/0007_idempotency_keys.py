# The idempotency window (docs/reference/api.md, "The idempotency window"): ids remembered
# after their messages are collected.

from django.db import migrations, models

from sqlqueue.migrations._collation import use_binary_collation


class Migration(migrations.Migration):

    dependencies = [
        ("sqlqueue", "0006_created_at_default"),
    ]

    operations = [
        migrations.CreateModel(
            name="IdempotencyKey",
            fields=[
                ("pk", models.CompositePrimaryKey("key_high", "key_low", blank=True, editable=False, primary_key=True, serialize=False)),
                ("key_high", models.BigIntegerField(help_text="First 64 bits of the digest, signed.")),
                ("key_low", models.BigIntegerField(help_text="Last 64 bits of the digest, signed.")),
                ("message_offset", models.PositiveBigIntegerField(help_text="Offset of the message first published with this id.")),
                ("expires_at", models.PositiveBigIntegerField(help_text="Epoch ms, database clock: first publish + window.")),
            ],
            options={
                "verbose_name": "idempotency key",
                "db_table": "queue_idempotency_keys",
                "indexes": [models.Index(fields=["expires_at"], name="idx_idempotency_expires")],
            },
        ),
        use_binary_collation('queue_idempotency_keys'),
    ]

"""Todo payload and result: the safe decoder and the edge bounds (no schema change)."""

from __future__ import annotations

from django.db import migrations, models

import switchboard.core.validation


class Migration(migrations.Migration):
    dependencies = [("queues", "0003_drop_lease_expiry_index")]

    operations = [
        migrations.AlterField(
            model_name="todo",
            name="payload",
            field=models.JSONField(
                blank=True,
                decoder=switchboard.core.validation.SafeJSONDecoder,
                default=dict,
                validators=[switchboard.core.validation.validate_stored_json],
            ),
        ),
        migrations.AlterField(
            model_name="todo",
            name="result",
            field=models.JSONField(
                blank=True,
                decoder=switchboard.core.validation.SafeJSONDecoder,
                null=True,
                validators=[switchboard.core.validation.validate_stored_json],
            ),
        ),
    ]

# The ledger's models now belong to switchboard.ledger (its 0001 takes the same tables over); the
# admission app lets go of them in Django's state only. The tables stay as they are.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('admission', '0002_window_claims_limit'),
        ('ledger', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='LedgerEntry'),
                migrations.DeleteModel(name='LedgerHead'),
            ],
            database_operations=[],
        ),
    ]

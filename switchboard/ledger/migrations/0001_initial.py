# The ledger's tables moved here from the admission app. They keep their names, so this migration
# only takes them over in Django's state: existing databases are not touched, and a new database
# gets them from admission's 0001 (on which this depends) as before.

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('admission', '0002_window_claims_limit'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='LedgerEntry',
                    fields=[
                        ('seq', models.BigIntegerField(primary_key=True, serialize=False)),
                        ('prev_hash', models.CharField(max_length=64)),
                        ('kind', models.CharField(choices=[('policy.create', 'Policy Create'), ('policy.update', 'Policy Update'), ('policy.delete', 'Policy Delete'), ('queue.pause', 'Queue Pause'), ('queue.resume', 'Queue Resume'), ('admission.waiver', 'Admission Waiver')], max_length=32)),
                        ('actor_human_id', models.BigIntegerField(blank=True, null=True)),
                        ('actor_human_name', models.CharField(blank=True, default='', max_length=150)),
                        ('actor_endpoint_id', models.UUIDField(blank=True, null=True)),
                        ('actor_endpoint_slug', models.CharField(blank=True, default='', max_length=63)),
                        ('scope', models.CharField(blank=True, default='', max_length=100)),
                        ('queue', models.CharField(blank=True, default='', max_length=64)),
                        ('before', models.JSONField(blank=True, null=True)),
                        ('after', models.JSONField(blank=True, null=True)),
                        ('at', models.DateTimeField()),
                        ('entry_hash', models.CharField(max_length=64, unique=True)),
                    ],
                    options={
                        'db_table': 'admission_ledgerentry',
                        'verbose_name_plural': 'ledger entries',
                        'ordering': ['seq'],
                        'indexes': [models.Index(fields=['scope', 'queue', '-seq'], name='ledger_scope_queue_idx'), models.Index(fields=['kind', '-seq'], name='ledger_kind_idx'), models.Index(fields=['at'], name='ledger_at_idx')],
                        'constraints': [models.CheckConstraint(condition=models.Q(('seq__gte', 1)), name='ledger_seq_positive'), models.CheckConstraint(condition=models.Q(('kind__in', ['policy.create', 'policy.update', 'policy.delete', 'queue.pause', 'queue.resume', 'admission.waiver'])), name='ledger_kind_valid')],
                    },
                ),
                migrations.CreateModel(
                    name='LedgerHead',
                    fields=[
                        ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                        ('seq', models.BigIntegerField()),
                        ('entry_hash', models.CharField(max_length=64)),
                        ('mac', models.CharField(max_length=64)),
                    ],
                    options={
                        'db_table': 'admission_ledgerhead',
                        'constraints': [models.CheckConstraint(condition=models.Q(('id', 1)), name='ledger_head_single_row')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]

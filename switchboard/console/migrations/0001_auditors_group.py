# The auditors group, with the view permissions it reads through (the admin's read-only pages):
# every deployment has it, not only one seeded with demo data. Members read everything and change
# nothing (queues.access decides that; these permissions only open the admin's view pages).

from django.contrib.auth.management import create_permissions
from django.db import migrations

AUDITORS_GROUP = "auditors"
VIEWS = [
    ("queues", "endpoint"),
    ("queues", "todo"),
    ("queues", "attempt"),
    ("queues", "queuepause"),
    ("admission", "admissionpolicy"),
    ("admission", "admissionwindow"),
    ("ledger", "ledgerentry"),
    ("ledger", "ledgerhead"),
]


def create_auditors(apps, schema_editor):
    # Permissions are normally made after every migration has run; make them now so the group
    # can hold them on a fresh database.
    for app_config in apps.get_app_configs():
        saved = getattr(app_config, "models_module", None)
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = saved
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name=AUDITORS_GROUP)
    for app_label, model in VIEWS:
        perm = Permission.objects.filter(
            content_type__app_label=app_label, codename=f"view_{model}"
        ).first()
        if perm is not None:
            group.permissions.add(perm)


class Migration(migrations.Migration):

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("queues", "0003_drop_lease_expiry_index"),
        ("admission", "0003_ledger_moves_to_its_own_app"),
        ("ledger", "0003_ledger_check"),
    ]

    operations = [migrations.RunPython(create_auditors, migrations.RunPython.noop)]

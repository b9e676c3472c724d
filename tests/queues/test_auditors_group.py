"""Every deployment has the auditors group, made by a migration with its view permissions (not
only one seeded with demo data)."""

from __future__ import annotations

import importlib

from django.apps import apps
from django.contrib.auth.models import Group

from queues.access import AUDITORS_GROUP, HumanActor
from tests.conftest import Personas

migration = importlib.import_module("switchboard.console.migrations.0001_auditors_group")


def test_the_migration_makes_the_auditors_group_with_view_permissions_only(db: None) -> None:
    Group.objects.filter(name=AUDITORS_GROUP).delete()
    migration.create_auditors(apps, None)
    group = Group.objects.get(name=AUDITORS_GROUP)
    codenames = set(group.permissions.values_list("codename", flat=True))
    assert {"view_todo", "view_endpoint", "view_ledgerentry", "view_admissionpolicy"} <= codenames
    assert all(c.startswith("view_") for c in codenames)
    migration.create_auditors(apps, None)  # running it again changes nothing
    assert Group.objects.filter(name=AUDITORS_GROUP).count() == 1


def test_an_actors_roles_are_looked_up_once(
    personas: Personas, django_assert_num_queries: object
) -> None:
    actor = HumanActor(personas.auditor)
    with django_assert_num_queries(1):  # type: ignore[operator]
        for _ in range(10):
            assert actor.is_auditor and actor.sees_all and not actor.writes

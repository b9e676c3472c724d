"""Every change to an endpoint row is announced on the ``switchboard_endpoint`` channel (the old
row's token hash; ``*`` for a TRUNCATE), whoever makes it: the services, the admin, a bulk
``update()`` or plain SQL. Each web process listens and forgets its cached row at once
(``queues.auth``), so agents' requests skip the token lookup and a revoke still refuses the
next request everywhere."""

from django.db import migrations

FORWARD = """
CREATE FUNCTION queues_endpoint_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('switchboard_endpoint', '*');
    ELSE
        PERFORM pg_notify('switchboard_endpoint', OLD.token_hash);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER queues_endpoint_changed AFTER UPDATE OR DELETE ON queues_endpoint
    FOR EACH ROW EXECUTE FUNCTION queues_endpoint_changed();
CREATE TRIGGER queues_endpoint_truncated AFTER TRUNCATE ON queues_endpoint
    FOR EACH STATEMENT EXECUTE FUNCTION queues_endpoint_changed();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS queues_endpoint_truncated ON queues_endpoint;
DROP TRIGGER IF EXISTS queues_endpoint_changed ON queues_endpoint;
DROP FUNCTION IF EXISTS queues_endpoint_changed();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0013_todo_field_checks_on_write_of_their_fields"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]

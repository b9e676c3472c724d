"""The HTTP benches' PostgreSQL CPU (``bench.http_bench._database_cpu``) counts this database's
backends and the server's own processes, not the backends of other databases on the same
cluster (the embedded cluster is shared by every checkout: their work is not this run's)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from bench import http_bench


@pytest.mark.django_db
def test_it_leaves_out_a_backend_of_another_database() -> None:
    params = {**connection.get_connection_params(), "dbname": "postgres", "autocommit": True}
    with psycopg.connect(**params) as elsewhere:
        elsewhere.execute("SELECT 1")
        seconds = http_bench._database_cpu()
        # The embedded server runs on this machine, in CI too: its processes can be read.
        assert seconds, "the database server's processes could not be read"
        assert elsewhere.info.backend_pid not in seconds
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (own,) = cursor.fetchone()
    assert own in seconds

"""The child side of ``tests.children.Child``: set Django up, keep one connection, say "ready",
then answer each JSON line on stdin with one JSON line. Imports nothing of Django's until called,
so a child module can import it before ``django.setup()``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def serve(run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    import django

    django.setup()
    from django.db import connection

    connection.ensure_connection()  # one connection for the child's whole life
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(json.loads(line))), flush=True)

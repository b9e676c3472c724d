#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A setting the environment got wrong (the message names it): said in a line, not a
        # traceback through Django's settings loader.
        sys.stderr.write(f"Switchboard is not configured: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()

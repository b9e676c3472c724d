"""Versions of what operators declare (a budget, a named limit), for writes over what was read.

A version is a digest of the thing's definition as its ledger row records it, so it changes with
every write that changes the thing and with nothing else. The REST API sends it as the ETag and
honours If-Match / If-None-Match (``switchboard.core.http.write_preconditions``); the console's
forms carry it so a save applies what its page showed, or nothing.

``expected`` (the versions a writer will write over) may also hold ``ABSENT`` (the writer saw
none: If-None-Match: *) or ``ANY`` (any current version: If-Match: *). Both hold a space, which
no entity tag can (RFC 9110's etagc), so no If-Match tag stands for either.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from typing import Any

ABSENT = "no such thing"
ANY = "any version"


# How a caller without HTTP's headers (an agent's verb, the CLI) names "there is none yet".
NONE_NAMED = "none"


def named(version: str | None) -> tuple[str, ...] | None:
    """The condition a caller names by one version (``NONE_NAMED``: that there is none yet), as
    ``expected``; None (no condition) when it names none."""
    if version is None:
        return None
    return (ABSENT if version == NONE_NAMED else version,)


def spelled(value: str) -> str:
    """A version as a person types it (``--if-version``): a version's 20 hex digits, or
    ``NONE_NAMED``; anything else can never match, and is refused as such (``ValueError``, which
    argparse reports naming the option) rather than read as a write that came too late."""
    if value == NONE_NAMED:
        return value
    digits = value.lower()  # hex digits in either case; versions are written in lower case
    if len(digits) == 20 and all(c in "0123456789abcdef" for c in digits):
        return digits
    raise ValueError(f"a version is 20 hex digits, or {NONE_NAMED!r}")


def digest(definition: Any) -> str:
    """The version of a definition: its canonical JSON (keys sorted), hashed, 20 hex digits."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def holds(expected: Collection[str] | None, version: str | None) -> bool:
    """Whether a write conditioned on ``expected`` may go ahead over ``version`` (None: there is
    nothing yet). No condition always holds."""
    if expected is None:
        return True
    if version is None:
        return ABSENT in expected
    return version in expected or ANY in expected

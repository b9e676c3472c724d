"""Bearer tokens: how they are minted, recognised by prefix, and stored (only their SHA-256)."""

from __future__ import annotations

import base64
import hashlib
import secrets

ENDPOINT_TOKEN_PREFIX = "sbk_"
HUMAN_TOKEN_PREFIX = "sbh_"
LEASE_TOKEN_PREFIX = "sbl_"
HOOK_SECRET_PREFIX = "whsec_"


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None for any other header.
    One reading for every surface (the REST API, MCP, the agents' event stream, /metrics): the
    scheme in any case (RFC 9110 11.1), one or more spaces after it (``1*SP``), white space
    around the token ignored (an agent's REST requests refused two spaces MCP took)."""
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mint(prefix: str, nbytes: int = 32) -> str:
    """A new random token; only its hash is stored, so it is shown once."""
    return prefix + secrets.token_urlsafe(nbytes)


def hook_secret() -> str:
    """A webhook signing secret (kept in clear: the receiver verifies with it), in the Standard
    Webhooks form: ``whsec_`` and the base64 of 24 random bytes, the key receivers decode."""
    return HOOK_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()

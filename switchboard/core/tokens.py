"""Bearer tokens: how they are minted, recognised by prefix, and stored (only their SHA-256)."""

from __future__ import annotations

import base64
import hashlib
import secrets

ENDPOINT_TOKEN_PREFIX = "sbk_"
HUMAN_TOKEN_PREFIX = "sbh_"
LEASE_TOKEN_PREFIX = "sbl_"
HOOK_SECRET_PREFIX = "whsec_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mint(prefix: str, nbytes: int = 32) -> str:
    """A new random token; only its hash is stored, so it is shown once."""
    return prefix + secrets.token_urlsafe(nbytes)


def hook_secret() -> str:
    """A webhook signing secret (kept in clear: the receiver verifies with it), in the Standard
    Webhooks form: ``whsec_`` and the base64 of 24 random bytes, the key receivers decode."""
    return HOOK_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()

"""How a webhook delivery is signed: the Standard Webhooks scheme (standardwebhooks.com), so a
receiver can check it with that project's libraries or a few lines of its own.

* ``webhook-id``: the delivery's id, the same on every attempt (a receiver drops repeats);
* ``webhook-timestamp``: the attempt's time, Unix seconds (a receiver refuses old ones: a
  replayed request carries its old time, and changing it breaks the signature);
* ``webhook-signature``: ``v1,`` and the base64 HMAC-SHA256 of ``<id>.<timestamp>.<body>``
  under the webhook's secret (``whsec_`` and the base64 of its key bytes).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Final

__all__ = ["SECRET_PATTERN", "SECRET_PREFIX", "new_secret", "secret_problem", "signed_headers"]

SECRET_PREFIX: Final = "whsec_"
_KEY_BYTES: Final = 32
_MIN_KEY_BYTES: Final = 24
_MAX_KEY_BYTES: Final = 64
# What ``secret_problem`` accepts, for the API's schema: the prefix and the base64 of 24 to 64
# bytes (8 to 21 groups of four characters, and a padded tail that keeps it within 64 bytes).
_B64: Final = "[A-Za-z0-9+/]"
SECRET_PATTERN: Final = (
    f"^{SECRET_PREFIX}(?:(?:{_B64}{{4}}){{8,20}}(?:{_B64}{{2}}==|{_B64}{{3}}=)?"
    f"|(?:{_B64}{{4}}){{21}}(?:{_B64}{{2}}==)?)$"
)


def new_secret() -> str:
    """A fresh secret: ``whsec_`` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(_KEY_BYTES)).decode()


def secret_problem(secret: str) -> str | None:
    """What is wrong with a secret an admin chose (None: nothing). The message never repeats
    the secret."""
    if len(secret) > 200:
        return "secret: longer than 200 characters"
    if not secret.startswith(SECRET_PREFIX):
        return f"secret: must start with {SECRET_PREFIX!r} (or leave it out: one is made)"
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        return f"secret: what follows {SECRET_PREFIX!r} must be base64"
    if not _MIN_KEY_BYTES <= len(key) <= _MAX_KEY_BYTES:
        return f"secret: its key must be {_MIN_KEY_BYTES} to {_MAX_KEY_BYTES} bytes"
    return None


def signed_headers(secret: str, delivery_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers that sign ``body`` as delivery ``delivery_id`` at ``timestamp``."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }

"""Webhook secrets: the pattern the API's schema states accepts exactly the secrets the API
takes, and a made secret is one of them."""

from __future__ import annotations

import base64
import re

import pytest

from orchestrator.notify.signing import SECRET_PATTERN, new_secret, secret_problem


@pytest.mark.parametrize("key_bytes", range(80))
def test_the_schemas_pattern_is_the_rule_the_api_checks(key_bytes: int) -> None:
    secret = "whsec_" + base64.b64encode(bytes(range(key_bytes))).decode()
    assert bool(re.fullmatch(SECRET_PATTERN, secret)) == (secret_problem(secret) is None)
    assert (secret_problem(secret) is None) == (24 <= key_bytes <= 64)


@pytest.mark.parametrize("secret", ["whsec_!!!!", "nope_" + "A" * 44, "whsec_" + "A" * 43])
def test_a_malformed_secret_is_refused_by_both(secret: str) -> None:
    assert re.fullmatch(SECRET_PATTERN, secret) is None
    assert secret_problem(secret) is not None


def test_a_made_secret_passes() -> None:
    made = new_secret()
    assert re.fullmatch(SECRET_PATTERN, made) and secret_problem(made) is None

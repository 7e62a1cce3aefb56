"""Clients and settings for tests of the API app: every request carries a key."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.exceptions import StarletteDeprecationWarning

from orchestrator.apikeys import generate_key
from orchestrator.settings import Settings, load_settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

__all__ = ["TEST_HOST", "KeyedCalls", "admin_key_of", "api_test_settings", "keyed_client"]

TEST_HOST = "testserver"  # the Host header Starlette's test client sends


def keyed_client(app: FastAPI, key: str | None) -> TestClient:
    """A test client of ``app`` that sends ``key`` as its bearer token (``None``: no key).
    Use it as a context manager: entering starts the app."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return TestClient(app, headers=headers)


def api_test_settings(
    data_dir: Path, database_url: str, redis_url: str, **more: object
) -> Settings:
    """Settings for an app under test: a fresh admin key, the test client's host allowed."""
    values: dict[str, object] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "redis_url": redis_url,
        "admin_key": generate_key(),
        "allowed_hosts": [TEST_HOST, "localhost", "127.0.0.1"],
        "task_packages": ["workflows", "tests"],
    }
    return load_settings(**(values | more))


def admin_key_of(settings: Settings) -> str:
    key = settings.resolved_admin_key()
    assert key is not None
    return key


class KeyedCalls:
    """Requests through a running ``TestClient`` with another key (``None``: no key at all).

    *Why not a second client:* the app's pools belong to the event loop of the client that
    started it; requests must go through that client.
    """

    def __init__(self, client: TestClient, key: str | None) -> None:
        self.client = client
        self.key = key

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", None) or {})
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key}"
            reply: httpx.Response = self.client.request(method, url, headers=headers, **kwargs)
            return reply
        saved = self.client.headers.pop("Authorization", None)
        try:
            anonymous: httpx.Response = self.client.request(method, url, headers=headers, **kwargs)
            return anonymous
        finally:
            if saved is not None:
                self.client.headers["Authorization"] = saved

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    def options(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("OPTIONS", url, **kwargs)

"""Where the API is and which key to send, from the arguments, the environment or a local stack.

In order, first found wins:

1. ``api_url=`` / ``api_key=`` given to the client;
2. ``$CDIFLOW_API_URL`` / ``$CDIFLOW_API_KEY``;
3. the stack ``cdiflow up`` runs from the data folder (``data_dir=``, else
   ``$CDIFLOW_DATA_DIR``, else ``./.data``): its ``stack.json`` names the API's address and
   the file holding its admin key (``<data>/api-key``, readable by the stack's owner alone);
4. ``http://127.0.0.1:8000`` without a key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from cdiflow.client.errors import ConfigError

__all__ = ["DEFAULT_URL", "Endpoint", "resolve"]

DEFAULT_URL: Final = "http://127.0.0.1:8000"
URL_ENV: Final = "CDIFLOW_API_URL"
KEY_ENV: Final = "CDIFLOW_API_KEY"
DATA_DIR_ENV: Final = "CDIFLOW_DATA_DIR"
STACK_FILE: Final = "stack.json"


@dataclass(frozen=True)
class Endpoint:
    """The API's base URL (no trailing slash, no ``/api``) and the key to send, if any."""

    url: str
    key: str | None = None
    source: str = "default"  # where the URL came from, for messages


def resolve(
    api_url: str | None = None, api_key: str | None = None, data_dir: str | Path | None = None
) -> Endpoint:
    """The endpoint to talk to (see the module's docstring); ``ConfigError`` for a URL that is
    not http(s) or a ``stack.json`` that cannot be read."""
    url, source = api_url, "argument"
    key = api_key or os.environ.get(KEY_ENV) or None
    if not url and (url := os.environ.get(URL_ENV)):
        source = f"${URL_ENV}"
    if not url:
        stack = _local_stack(data_dir)
        if stack is not None:
            url, source = stack
            key = key or _stack_key(data_dir)
    if not url:
        url, source = DEFAULT_URL, "default"
    return Endpoint(_checked(url, source), key, source)


def _folder(data_dir: str | Path | None) -> Path:
    return Path(data_dir or os.environ.get(DATA_DIR_ENV) or ".data").expanduser()


def _read_stack(data_dir: str | Path | None) -> dict[str, object] | None:
    path = _folder(data_dir) / STACK_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}); pass api_url= instead") from exc
    return raw if isinstance(raw, dict) else None


def _local_stack(data_dir: str | Path | None) -> tuple[str, str] | None:
    raw = _read_stack(data_dir)
    url = raw.get("api_url") if raw else None
    if not isinstance(url, str) or not url:
        return None
    return url, f"the stack in {_folder(data_dir)}"


def _stack_key(data_dir: str | Path | None) -> str | None:
    """The admin key of the local stack, when this user may read its file."""
    raw = _read_stack(data_dir)
    path = raw.get("api_key_file") if raw else None
    if not isinstance(path, str) or not path:
        return None  # the stack's key is configured (CDIFLOW_ADMIN_KEY): pass it yourself
    try:
        key = Path(path).read_text().strip()
    except OSError:
        return None  # not ours to read: the API will say a key is needed
    return key or None


def _checked(url: str, source: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"API address {url!r} (from {source}) is not an http(s) URL such as {DEFAULT_URL}"
        )
    return url.rstrip("/").removesuffix("/api")

"""What the API commands share: where the API is, how a client is made, tables and JSON."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from cdiflow.client import Client
from cdiflow.client.models import as_data

__all__ = ["Target", "api_options", "echo_json", "table", "when"]


@dataclass(frozen=True)
class Target:
    """Which API a command talks to: ``--api-url``, ``--api-key`` and ``--data-dir``, as
    ``cdiflow.client.config`` resolves them (the flags, then the environment, then the local
    stack)."""

    api_url: str | None
    api_key: str | None
    data_dir: Path | None

    @contextmanager
    def client(self) -> Iterator[Client]:
        with Client(self.api_url, api_key=self.api_key, data_dir=self.data_dir) as client:
            yield client


def api_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--api-url``, ``--api-key`` and ``--data-dir`` to a command, which gets them as one
    ``target: Target`` argument."""

    @functools.wraps(f)
    def command(*args: Any, api_url: str | None, api_key: str | None, data_dir: Path | None,
                **kwargs: Any) -> Any:  # fmt: skip
        return f(*args, target=Target(api_url, api_key, data_dir), **kwargs)

    options = [
        click.option("--api-url", envvar="CDIFLOW_API_URL", default=None, metavar="URL",
                     help="The API's address [env: CDIFLOW_API_URL; default: the local stack's, "
                     "else http://127.0.0.1:8000]."),
        click.option("--api-key", envvar="CDIFLOW_API_KEY", default=None, metavar="KEY",
                     help="API key sent as a bearer token [env: CDIFLOW_API_KEY; default: the "
                     "local stack's]."),
        click.option("--data-dir", envvar="CDIFLOW_DATA_DIR", default=None,
                     type=click.Path(file_okay=False, path_type=Path),
                     help="Data folder of the local stack to find [env: CDIFLOW_DATA_DIR; "
                     "default: ./.data]."),
    ]  # fmt: skip
    wrapped: Callable[..., Any] = command
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped


def echo_json(value: Any) -> None:
    """Print a model, a list of models or plain data as JSON, with every field the API sent
    (those this version does not know too)."""
    click.echo(json.dumps(as_data(value), indent=2, default=str))


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, columns padded to their widest cell."""
    cells = [list(header), *[["" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def when(moment: datetime | None) -> str:
    """A timestamp in local time, to the second."""
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"

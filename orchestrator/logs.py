"""Logging for the orchestrator's processes: plain text, or one JSON object a line.

``setup_logging(level, "json", process=...)`` makes every line a JSON object (``time`` in
ISO 8601 with its offset, ``level``, ``logger``, ``message``, ``process``, and any field a line
carries), for log shippers that index fields; Python's warnings and an exception that ends the
process are logged the same way, so nothing but JSON reaches the log. Code handling a workflow
wraps its work in ``log_context(...)``: every line logged inside it, by any module, carries the
workflow id (and the task run, step and attempt), so one query finds everything that happened
to a run across the scheduler and the workers. In text the ids stay in the messages.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType, TracebackType
from typing import Any, Final

import click
from pythonjsonlogger.json import JsonFormatter

__all__ = ["LOG_FORMATS", "IsoJsonFormatter", "log_context", "log_format_option", "setup_logging"]

LOG_FORMATS: Final = ("text", "json")
LOG_FORMAT_ENV: Final = "CDIFLOW_LOG_FORMAT"

_NOTHING: Final[Mapping[str, Any]] = MappingProxyType({})
_CONTEXT: ContextVar[Mapping[str, Any]] = ContextVar("cdiflow_log_context", default=_NOTHING)
# An access log line of the API names a run in its path: /api/workflows/<id>[/...]
_RUN_IN_PATH: Final = re.compile(r"/api/workflows/([0-9a-f]{8}-[0-9a-f-]{27})")
# The password of a URL (scheme://user:password@host), whoever's message carries one.
_URL_PASSWORD: Final = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s/@]+@")


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Every line logged inside (in this thread or task) carries ``fields``."""
    token = _CONTEXT.set({**_CONTEXT.get(), **fields})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class _ContextFields(logging.Filter):
    """Puts the ``log_context`` fields on each record (a field the record has wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _CONTEXT.get().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        if not hasattr(record, "workflow_id") and record.name == "uvicorn.access":
            found = _RUN_IN_PATH.search(str(record.args))
            if found:
                record.workflow_id = found[1]
        return True


class _HidePasswords(logging.Filter):
    """Replaces the password of any URL in a line (its message and its traceback) by
    ``***``. The code logs URLs without their passwords already; this is for what it does
    not write itself: a library's message, an exception's text."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "@" in message and _URL_PASSWORD.search(message):
            record.msg, record.args = _URL_PASSWORD.sub(r"\1***@", message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and "@" in record.exc_text:
            record.exc_text = _URL_PASSWORD.sub(r"\1***@", record.exc_text)
        return True


class IsoJsonFormatter(JsonFormatter):
    """JSON lines whose ``time`` is ISO 8601 in UTC to the millisecond
    (``2026-12-04T21:40:00.123+00:00``), not ``logging``'s local ``2026-12-04 21:40:00,123``."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


def setup_logging(level: str, log_format: str, *, process: str, text: str) -> None:
    """Log to standard error at ``level``: as ``text`` (a ``logging`` format string) or, for
    ``log_format="json"``, one JSON object a line naming ``process``."""
    handler = logging.StreamHandler()
    handler.addFilter(_ContextFields())
    handler.addFilter(_HidePasswords())
    if log_format == "json":
        handler.setFormatter(
            IsoJsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                static_fields={"process": process},
            )
        )
        # What Python would print as text instead: warnings, and the traceback that ends it.
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
    else:
        handler.setFormatter(logging.Formatter(text))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("cdiflow").critical("ended by %s: %s", kind.__name__, exc,
                                          exc_info=(kind, exc, tb))  # fmt: skip


def log_format_option(f: Any) -> Any:
    """``--log-format text|json`` (``$CDIFLOW_LOG_FORMAT``)."""
    return click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default="text",
        show_default=True,
        envvar=LOG_FORMAT_ENV,
        show_envvar=True,
        help="text, or one JSON object a line carrying the workflow and task ids.",
    )(f)

"""The one rule for task, workflow and step names, shared by the registry and the validator."""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = ["MODULE_PATH_RE", "NAME_RE", "name_problem"]

# Letters, digits, '_' and '-', starting with a letter: safe in URLs, logs, metric labels
# and file names without quoting.
NAME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")

# "package.module:function" (the attribute may be dotted, e.g. "Class.method").
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
MODULE_PATH_RE: Final = re.compile(rf"{_IDENT}(?:\.{_IDENT})*:{_IDENT}(?:\.{_IDENT})*")


def name_problem(kind: str, name: Any) -> str | None:
    """A sentence describing why ``name`` is not a valid ``kind`` name, or ``None`` if it is."""
    if not isinstance(name, str):
        return f"{kind} name must be a string, got {type(name).__name__}"
    if NAME_RE.fullmatch(name) is None:
        return (
            f"{kind} name {name!r} is not valid: use 1-64 letters, digits, '_' or '-', "
            "starting with a letter"
        )
    return None

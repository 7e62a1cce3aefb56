"""The API's OpenAPI document as the client tests read it: its operations, the operation a
request path is, and a schema with every ``$ref`` replaced by what it names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Operation", "find", "inline", "operations"]


@dataclass(frozen=True)
class Operation:
    method: str
    template: str  # "/api/workflows/{workflow_id}"
    spec: dict[str, Any]

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(self.template)))

    def answers(self) -> dict[int, dict[str, Any]]:
        """Each status the operation answers with a body it documents as a success (2xx), or
        as the same model an error status carries too (readiness' 503), by status."""
        return {int(code): r for code, r in self.spec["responses"].items() if code.isdigit()}


def operations(document: dict[str, Any]) -> list[Operation]:
    return [
        Operation(method.upper(), template, spec)
        for template, by_method in document["paths"].items()
        for method, spec in by_method.items()
    ]


def find(found: list[Operation], method: str, path: str) -> Operation | None:
    """The operation ``method path`` is; a path without parameters first (``/active`` is not a
    ``{workflow_id}``)."""
    matches = [op for op in found if op.method == method and op.pattern.fullmatch(path)]
    matches.sort(key=lambda op: op.template.count("{"))
    return matches[0] if matches else None


def inline(schema: Any, definitions: dict[str, Any]) -> Any:
    """``schema`` with each ``$ref`` to ``definitions`` replaced by its target, without the
    titles (generated from names, which differ between a document and a model's own) and
    without ``"default": null`` (FastAPI leaves it out of the document)."""
    if isinstance(schema, list):
        return [inline(item, definitions) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref":
            out.update(inline(definitions[value.rsplit("/", 1)[-1]], definitions))
        elif (key == "title" and isinstance(value, str)) or (key == "default" and value is None):
            continue
        else:
            out[key] = inline(value, definitions)
    return out

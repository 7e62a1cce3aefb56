"""What the chaos tests share: a case's verdict that shows all of it when it fails."""

from __future__ import annotations

import json
from typing import Any, Protocol


class Judged(Protocol):
    @property
    def passed(self) -> bool: ...

    def as_dict(self) -> dict[str, Any]: ...


def passed(result: Judged) -> bool:
    """Whether ``result`` passed; if not, all of it on stdout first (pytest shows a failed
    test's output in full, and shortens an assertion's message): where each stuck run was."""
    if not result.passed:
        print(json.dumps(result.as_dict(), indent=1, default=str))
    return result.passed

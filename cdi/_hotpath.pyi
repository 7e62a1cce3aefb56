"""Types of ``cdi._hotpath``, the client's hot path in Rust (``cdi/client-native``)."""

from typing import Any

MAX_MESSAGE: int

class Wire:
    """One connection's hot path: its socket's fd (owned by the caller) and reused buffers."""

    def __init__(self, fd: int) -> None: ...
    def transfer(
        self, request_id: int, key: str, to: str, via: str
    ) -> tuple[dict[str, Any] | bytes | None, int | None] | None: ...
    def access(
        self,
        request_id: int,
        key: str,
        wait: bool,
        have: int | None,
        spin_s: float,
        deadline: float | None,
    ) -> tuple[dict[str, Any] | bytes | None, int | None] | None: ...

def word_at(obj: object, offset: int) -> int: ...
def views_in_use(
    handed: list[tuple[memoryview, memoryview]],
    exports: int,
    mbuf: int,
    registered: int,
    released: int,
) -> bool: ...

"""Keyset paging: a list ordered newest first by ``(created_at, id)`` is read a page at a time
from a cursor, the key of the row where the previous page stopped.

A page costs the rows it returns, wherever it lies in the list: the query starts at the cursor
in an index that ends with ``(created_at, id)`` (``WHERE (created_at, id) < (:t, :id) ORDER BY
created_at DESC, id DESC LIMIT n``), where ``OFFSET`` read and threw away every row before it.
Rows written meanwhile do not shift a page: a newer row lands before the first page, never in
the middle, and no row is skipped or shown twice.

Totals are exact only where that is cheap (the counts kept by status, ``db.tallies``); any
other filter is counted up to ``COUNT_CAP`` matches, and a page says whether more follow.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Generic, TypeVar

from sqlalchemy import ColumnElement, Select, func, select, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session

from orchestrator.errors import InvalidRequest

__all__ = ["COUNT_CAP", "Cursor", "Keyset", "Page", "capped_count"]

# Counting past it costs as many index or heap rows (tens of ms at 10,000 on a large table);
# a page's "more than 1,000" says what a person needs.
COUNT_CAP: Final = 1_000
_T = TypeVar("_T")


@dataclass(frozen=True)
class Cursor:
    """A place in a newest-first list: the key of a row, and which way the page goes from it
    (``newer``: the page of rows newer than it, to go back)."""

    created_at: datetime
    id: uuid.UUID
    newer: bool = False

    def encode(self) -> str:
        """Opaque to clients (they pass back what a page gave them)."""
        way = "p" if self.newer else "n"
        raw = f"{way}|{self.created_at.isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """``InvalidRequest`` for anything but what ``encode`` made."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            way, moment, key = raw.split("|")
            if way not in ("n", "p"):
                raise ValueError(way)
            created_at = datetime.fromisoformat(moment)
            if created_at.tzinfo is None:
                raise ValueError(moment)
            return cls(created_at, uuid.UUID(key), newer=way == "p")
        except (ValueError, UnicodeDecodeError, binascii.Error):
            raise InvalidRequest(
                f"{text[:60]!r} is not a cursor of this list: pass the next_cursor or "
                "prev_cursor of a page as it came, or leave cursor out for the first page"
            ) from None


@dataclass(frozen=True)
class Page(Generic[_T]):
    """One page, newest first, and where the pages beside it start."""

    items: list[_T]
    next: Cursor | None  # older rows follow
    prev: Cursor | None  # newer rows come before
    total: int
    total_exact: bool  # False: at least ``total`` (counted up to ``COUNT_CAP``)


class Keyset:
    """The newest-first order of a table by its ``created_at`` and ``id`` columns."""

    def __init__(
        self, created_at: InstrumentedAttribute[datetime], id: InstrumentedAttribute[uuid.UUID]
    ) -> None:
        self.created_at = created_at
        self.id = id

    def key(self, cursor: Cursor) -> tuple[datetime, uuid.UUID]:
        return cursor.created_at, cursor.id

    def older(self, cursor: Cursor) -> ColumnElement[bool]:
        return tuple_(self.created_at, self.id) < tuple_(*self.key(cursor))

    def newer(self, cursor: Cursor) -> ColumnElement[bool]:
        return tuple_(self.created_at, self.id) > tuple_(*self.key(cursor))

    def page_query(
        self, query: Select[Any], cursor: Cursor | None, limit: int, offset: int = 0
    ) -> Select[Any]:
        """``limit + 1`` rows from the cursor on (the extra one says whether more follow);
        a ``newer`` cursor reads upwards, oldest first."""
        if cursor is not None:
            query = query.where(self.newer(cursor) if cursor.newer else self.older(cursor))
        return query.order_by(*self.order(cursor)).limit(limit + 1).offset(offset)

    def order(self, cursor: Cursor | None) -> tuple[ColumnElement[Any], ...]:
        """A page's order from ``cursor``: newest first, or oldest first for a ``newer``
        one."""
        if cursor is not None and cursor.newer:
            return self.created_at.asc(), self.id.asc()
        return self.created_at.desc(), self.id.desc()

    def any_beyond(
        self, session: Session, query: Select[Any], edge: Cursor
    ) -> bool:  # fmt: skip
        """Whether a row lies past ``edge`` the way it points (one index probe)."""
        return session.execute(self.beyond_statement(query, edge)).first() is not None

    def beyond_statement(self, query: Select[Any], edge: Cursor) -> Select[Any]:
        """The first row of ``query`` past ``edge`` in the keyset's order.

        Not ``EXISTS``: the planner may answer that with a scan in table order, which for
        newer rows (appended last) reads every older row first; the order makes it start at
        ``edge`` in the index."""
        if edge.newer:
            beyond, order = self.newer(edge), (self.created_at.asc(), self.id.asc())
        else:
            beyond, order = self.older(edge), (self.created_at.desc(), self.id.desc())
        return query.where(beyond).order_by(None).order_by(*order).limit(1)


def capped_count(session: Session, query: Select[Any]) -> tuple[int, bool]:
    """Matches of ``query`` up to ``COUNT_CAP``: (count, whether that is all of them)."""
    counted = select(func.count()).select_from(query.limit(COUNT_CAP + 1).subquery())
    n = int(session.scalar(counted) or 0)
    return min(n, COUNT_CAP), n <= COUNT_CAP

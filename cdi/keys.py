"""What names a CDI object: its key.

``ObjectKey`` is a ``str`` to Python and a type of its own to the type checker, so a CDI
object's key can be followed by one name wherever it travels (an instruction, a report, a
record of its hand-offs) and is not mistaken for another string (an S3 object key, a Redis
key). ``ObjectKey(text)`` costs nothing at run time: it returns ``text``.
"""

from __future__ import annotations

from typing import NewType

__all__ = ["ObjectKey"]

ObjectKey = NewType("ObjectKey", str)

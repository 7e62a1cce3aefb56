"""Write ``cdiflow/client/aio.py`` (``AsyncClient``) from ``cdiflow/client/sync.py`` (``Client``).

The two clients are the same verbs over ``httpx.Client`` and ``httpx.AsyncClient``; the async
one is derived from the sync one by fixed textual rules (as httpx and redis-py derive one from
the other), so they cannot drift apart: edit ``sync.py``, then run

    .venv/bin/python tools/unasync_client.py

``tests/client/test_async_twin.py`` fails while ``aio.py`` is not what this script writes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYNC = ROOT / "cdiflow" / "client" / "sync.py"
ASYNC = ROOT / "cdiflow" / "client" / "aio.py"

_DOC_SYNC = (
    '"""``Client``: the cdiflow API from Python, blocking (see ``AsyncClient`` for '
    + """asyncio).

    from cdiflow.client import Client

    with Client() as api:  # finds the local stack, or $CDIFLOW_API_URL
        run = api.run("image_pipeline", "photo.jpg")  # upload, start, wait
        api.download_result(run.id, "result.png")
"""
)
_DOC_ASYNC = '''"""``AsyncClient``: the cdiflow API from asyncio, verb for verb as ``Client``.

    from cdiflow.client import AsyncClient

    async with AsyncClient() as api:
        run = await api.run("image_pipeline", "photo.jpg")
        async for event in api.events(run.id, follow=False):
            print(event.kind)

Written by ``tools/unasync_client.py`` from ``sync.py``: edit that file, then run the tool.
'''

# (old, new): plain replacements, each of which must apply at least once.
_RULES: list[tuple[str, str]] = [
    (_DOC_SYNC, _DOC_ASYNC),
    (
        "import os\nimport time\nimport uuid\n"
        "from collections.abc import Iterator, Mapping, Sequence",
        "import asyncio\nimport os\nimport uuid\n"
        "from collections.abc import AsyncIterator, Mapping, Sequence",
    ),
    ('__all__ = ["Client"]', '__all__ = ["AsyncClient"]'),
    ("class Client:", "class AsyncClient:"),
    ("transport: httpx.BaseTransport | None", "transport: httpx.AsyncBaseTransport | None"),
    ("httpx.Client(", "httpx.AsyncClient("),
    ("    def close(self) -> None:", "    async def aclose(self) -> None:"),
    ("            pool.close()", "            await pool.aclose()"),
    ("    def __enter__(self)", "    async def __aenter__(self)"),
    ("    def __exit__(", "    async def __aexit__("),
    ("        self.close()", "        await self.aclose()"),
    ("Use it as a context manager, or ``close()`` it.",
     "Use it as an async context manager, or ``aclose()`` it."),
    ("    def _send(", "    async def _send("),
    ("= pool.request(", "= await pool.request("),
    ("return self._save(", "return await self._save("),
    ("with self._http.stream(", "async with self._http.stream("),
    ("response.read()", "await response.aread()"),
    ("for chunk in response.iter_bytes():", "async for chunk in response.aiter_bytes():"),
    ("named[name] = self.upload(local).uri", "named[name] = (await self.upload(local)).uri"),
    ("return self._send(", "return await self._send("),
    ("        self._send(", "        await self._send("),
    ("= self._send(", "= await self._send("),
    ("uri = self.upload(local).uri", "uri = (await self.upload(local)).uri"),
    ("= self.start(", "= await self.start("),
    ("return self.wait(", "return await self.wait("),
    (") -> Iterator[Event]:", ") -> AsyncIterator[Event]:"),
    ("            yield from page.events",
     "            for event in page.events:\n                yield event"),
    ("time.sleep(", "await asyncio.sleep("),
]  # fmt: skip
# Every public method of the class becomes a coroutine.
_METHOD = re.compile(r"\n    def (?!__|api_url)(\w+)\(")


def async_source(sync_source: str) -> str:
    """``aio.py`` as derived from ``sync_source`` and formatted by ruff (as the project
    formats everything); ``ValueError`` if a rule no longer applies (``sync.py`` changed in a
    way the rules do not cover: extend them)."""
    text = sync_source
    for old, new in _RULES:
        if old not in text:
            raise ValueError(f"the rule for {old[:60]!r} matches nothing in sync.py")
        text = text.replace(old, new)
    text = _METHOD.sub(r"\n    async def \1(", text)
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(ASYNC), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return formatted.stdout


def main() -> int:
    ASYNC.write_text(async_source(SYNC.read_text()))
    print(f"wrote {ASYNC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

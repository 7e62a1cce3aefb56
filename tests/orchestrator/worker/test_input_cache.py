"""The input cache: its index (LRU, budget, invalidation, keying, single flight) alone, and the
holder and the workers' side against a real minion with a stand-in S3 that counts its GETs."""

from __future__ import annotations

import io
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from pydantic import SecretStr

import cdi
from cdi import ObjectKey
from cdi.minion.process import MinionChild
from orchestrator.errors import InputMissing
from orchestrator.objectstore import ObjectStore, Stored
from orchestrator.settings import Settings
from orchestrator.worker.input_cache import CacheIndex, CacheKey, Entry, Verdict
from orchestrator.worker.input_cache_host import HostInputCache, InputStats
from workflows.imagebuf import map_image

URI = "s3://cdiflow/in/a.jpg"


def key(uri: str = URI, etag: str | None = '"1"', **changes: Any) -> CacheKey:
    fields: dict[str, Any] = {
        "identity": "http://s3|us-east-1|AK",
        "uri": uri,
        "etag": etag,
        "version": None,
        "max_input_bytes": 1 << 20,
        "max_pixels": 10**6,
    }
    return CacheKey(**(fields | changes))


def entry(k: CacheKey, size: int, name: str | None = None) -> Entry:
    return Entry(k.digest, k.family, ObjectKey(name or f"obj-{k.digest[:8]}"), size, size // 10)


class Objects:
    """What the index destroys; ``shared`` ones refuse until let go."""

    def __init__(self) -> None:
        self.destroyed: list[str] = []
        self.shared: set[str] = set()

    def destroy(self, name: str) -> bool:
        if name in self.shared:
            return False
        self.destroyed.append(name)
        return True


def fill(index: CacheIndex, k: CacheKey, size: int) -> bool:
    caller = object()
    assert index.acquire(k, caller, 0) is Verdict.FILL
    return index.put(k, caller, entry(k, size))


# ------------------------------------------------------------------ keying
def test_the_key_names_the_tag_the_reader_and_the_limits() -> None:
    base = key()
    assert key().digest == base.digest
    for other in (
        key(etag='"2"'),
        key(version="v2"),
        key(identity="http://s3|us-east-1|OTHER"),
        key(uri="s3://cdiflow/in/b.jpg"),
        key(max_pixels=5),
        key(max_input_bytes=5),
    ):
        assert other.digest != base.digest
    # Only the tag differs: the same family, so a new tag retires the old entry.
    assert key(etag='"2"').family == base.family
    assert key(identity="x").family != base.family
    assert not key(etag=None).cacheable
    assert key(etag=None, version="v1").cacheable


# ------------------------------------------------------------------ the index
def test_least_recently_used_entries_go_first_within_the_budget() -> None:
    objects = Objects()
    index = CacheIndex(300, objects.destroy)
    a, b, c = key(uri="s3://x/a"), key(uri="s3://x/b"), key(uri="s3://x/c")
    assert fill(index, a, 100) and fill(index, b, 100) and fill(index, c, 100)
    assert index.used == 300
    assert isinstance(index.acquire(a, object(), 0), Entry)  # a is now the most recent
    d = key(uri="s3://x/d")
    assert fill(index, d, 150)  # b and c go, a stays
    assert objects.destroyed == [entry(b, 0).key, entry(c, 0).key]
    assert index.used == 250 and len(index) == 2
    assert isinstance(index.acquire(a, object(), 0), Entry)
    assert index.acquire(b, object(), 0) is Verdict.FILL


def test_an_entry_larger_than_the_budget_is_refused_and_not_waited_for() -> None:
    index = CacheIndex(100, Objects().destroy)
    big = key()
    first = object()
    assert index.acquire(big, first, 0) is Verdict.FILL
    index.abandon(big.digest, first, too_big=True)
    assert index.acquire(big, object(), 5) is Verdict.SKIP  # at once, not after 5 s
    assert not index.put(key(uri="s3://x/huge"), object(), entry(key(uri="s3://x/huge"), 101))


def test_a_new_tag_retires_the_old_entry_at_once() -> None:
    objects = Objects()
    index = CacheIndex(1000, objects.destroy)
    old = key(etag='"1"')
    assert fill(index, old, 100)
    new = key(etag='"2"')
    assert index.acquire(new, object(), 0) is Verdict.FILL  # S3 has "2" now
    assert objects.destroyed == [entry(old, 0).key]
    assert index.used == 0 and len(index) == 0


def test_an_evicted_entry_still_read_is_freed_when_its_reader_lets_go() -> None:
    objects = Objects()
    index = CacheIndex(100, objects.destroy)
    a = key(uri="s3://x/a")
    assert fill(index, a, 100)
    objects.shared.add(entry(a, 0).key)  # a reader copies it right now
    b = key(uri="s3://x/b")
    assert not fill(index, b, 100)  # a left the index but its bytes still count
    assert index.acquire(a, object(), 0) is Verdict.FILL and index.used == 100
    objects.shared.clear()
    index.reap()
    assert index.used == 0 and objects.destroyed == [entry(a, 0).key]


def test_one_caller_fetches_while_the_others_wait_for_its_entry() -> None:
    index = CacheIndex(1000, Objects().destroy)
    k = key()
    filler = object()
    assert index.acquire(k, filler, 0) is Verdict.FILL
    got: list[Entry | Verdict] = []
    waiters = [
        threading.Thread(target=lambda: got.append(index.acquire(k, object(), 10)))
        for _ in range(3)
    ]
    for t in waiters:
        t.start()
    assert index.put(k, filler, entry(k, 10))
    for t in waiters:
        t.join(5)
    assert len(got) == 3 and all(isinstance(g, Entry) for g in got)
    # A fill abandoned (the fetch failed) lets the next caller fetch; a wait can time out.
    other = key(uri="s3://x/other")
    assert index.acquire(other, filler, 0) is Verdict.FILL
    assert index.acquire(other, object(), 0.05) is Verdict.SKIP
    index.abandon(other.digest, filler)
    assert index.acquire(other, object(), 0) is Verdict.FILL


# ------------------------------------------------------------------ against a minion
class FakeS3:
    """A stand-in ``ObjectStore``: objects by URI with an ETag, GETs and HEADs counted, and
    keys that may not be read (``refused``)."""

    def __init__(self, identity: str = "http://s3|us-east-1|AK") -> None:
        self.identity = identity
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.gets = 0
        self.refused: set[str] = set()

    def put(self, uri: str, data: bytes) -> None:
        self.objects[uri] = (data, f'"{hash(data) & 0xFFFFFF:x}"')

    def head(self, uri: str) -> Stored:
        if uri in self.refused or uri not in self.objects:
            raise InputMissing(f"{uri} does not exist")
        data, etag = self.objects[uri]
        return Stored(len(data), etag, None)

    def get(self, uri: str, limit: int) -> bytes:
        return self.get_stored(uri, limit)[0]

    def get_stored(self, uri: str, limit: int) -> tuple[bytes, Stored]:
        stored = self.head(uri)
        self.gets += 1
        return self.objects[uri][0], stored


def jpeg(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="JPEG", quality=95)
    return out.getvalue()


@pytest.fixture(scope="module")
def minion() -> Iterator[MinionChild]:
    with tempfile.TemporaryDirectory(prefix="cdiflow-input-cache-") as name:
        os.chmod(name, 0o755)
        child = MinionChild(str(Path(name) / "minion.sock")).start()
        try:
            yield child
        finally:
            child.stop()


def pixels(client: cdi.Client, obj: cdi.CDIObject) -> bytes:
    view = obj.access(timeout=1)
    try:
        img = map_image(view)
        data = img.tobytes()
        del img
        return data
    finally:
        view.release()


def test_workers_of_a_host_fetch_an_input_once_and_own_their_copies(minion: MinionChild) -> None:
    url = f"unix://{minion.socket_path}"
    s3 = FakeS3()
    s3.put(URI, jpeg((200, 40, 10)))
    store: Any = s3
    holding = HostInputCache(url, "w1", 1 << 20)
    joining = HostInputCache(url, "w2", 1 << 20)
    assert holding.holding and not joining.holding  # one holder per host
    with (
        cdi.connect(url, "w1") as w1,
        cdi.connect(url, "w2") as w2,
        cdi.connect(url, "sched") as sched,
    ):
        try:
            a, fa = holding.fetch(
                w1,
                store,
                URI,
                ObjectKey("wf-a"),
                recovery="sched",
                max_input_bytes=1 << 20,
                max_pixels=10**6,
            )
            b, fb = joining.fetch(
                w2,
                store,
                URI,
                ObjectKey("wf-b"),
                recovery="sched",
                max_input_bytes=1 << 20,
                max_pixels=10**6,
            )
            assert (fa.hit, fb.hit) == (False, True) and s3.gets == 1
            assert fa.s3_bytes == fb.source_bytes == len(s3.objects[URI][0]) and fb.s3_bytes == 0
            assert pixels(w1, a) == pixels(w2, b)  # the same image, in two objects
            assert holding.held()[0] == 1
            # What each worker's heartbeat reports: its own fetches, the holder's entries.
            stats = InputStats()
            stats.count(fa, cached=True)
            stats.count(fb, cached=True)
            figures = stats.figures(holding)
            assert (figures.hits, figures.misses, figures.saved_bytes) == (1, 1, fb.source_bytes)
            assert (figures.s3_bytes, figures.holder, figures.entries) == (fa.s3_bytes, True, 1)
            assert figures.bytes == holding.held()[1] > 0
            assert not stats.figures(joining).holder
            assert (stats.figures(joining).entries, stats.figures(joining).bytes) == (0, 0)
            # Each copy is its worker's own: it transfers and destroys it like any other.
            b.transfer("sched")
            sched.use("wf-b").destroy()
            assert w2.describe("wf-a")["owner"] == "w1"

            # The object changes in S3: fetched again, and the old entry is retired.
            s3.put(URI, jpeg((10, 40, 200)))
            c, fc = joining.fetch(
                w2,
                store,
                URI,
                ObjectKey("wf-c"),
                recovery="sched",
                max_input_bytes=1 << 20,
                max_pixels=10**6,
            )
            assert not fc.hit and s3.gets == 2 and holding.held()[0] == 1
            assert pixels(w2, c) != pixels(w1, a)

            # A reader with other credentials, or limits, shares nothing with the first.
            other: Any = FakeS3(identity="http://s3|us-east-1|OTHER")
            other.objects = dict(s3.objects)
            d, fd = joining.fetch(
                w2,
                other,
                URI,
                ObjectKey("wf-d"),
                recovery="sched",
                max_input_bytes=1 << 20,
                max_pixels=10**6,
            )
            assert not fd.hit and other.gets == 1
            # One S3 refuses (the HEAD): the cache never answers for it.
            other.refused.add(URI)
            with pytest.raises(InputMissing):
                joining.fetch(
                    w2,
                    other,
                    URI,
                    ObjectKey("wf-e"),
                    recovery="sched",
                    max_input_bytes=1 << 20,
                    max_pixels=10**6,
                )
            for obj in (a, c, d):
                obj.destroy()
        finally:
            joining.close()
            holding.close()
        # The holder's objects went with it.
        assert [o["key"] for o in sched.list_objects()] == []


def test_without_a_holder_a_worker_fetches_plainly_and_holds_the_cache_next(
    minion: MinionChild,
) -> None:
    url = f"unix://{minion.socket_path}"
    s3 = FakeS3()
    s3.put(URI, jpeg((1, 2, 3)))
    store: Any = s3
    first = HostInputCache(url, "v1", 1 << 20)
    second = HostInputCache(url, "v2", 1 << 20)
    with cdi.connect(url, "v2") as v2:
        try:
            first.close()  # the holder's process ends
            obj, fetched = second.fetch(
                v2,
                store,
                URI,
                ObjectKey("wf-x"),
                recovery=None,
                max_input_bytes=1 << 20,
                max_pixels=10**6,
            )
            assert not fetched.hit and second.holding  # it took the address over
            obj.destroy()
            obj, fetched = second.fetch(
                v2,
                store,
                URI,
                ObjectKey("wf-y"),
                recovery=None,
                max_input_bytes=1 << 20,
                max_pixels=10**6,
            )
            assert fetched.hit and s3.gets == 1
            obj.destroy()
        finally:
            second.close()
        assert v2.list_objects() == []


def test_the_store_names_who_reads_never_the_secret() -> None:
    settings = Settings(
        s3_endpoint_url="http://127.0.0.1:9000",
        aws_access_key_id="AKID",
        aws_secret_access_key=SecretStr("s3cr3t-value"),
    )
    identity = ObjectStore(settings).identity
    assert "AKID" in identity and "127.0.0.1:9000" in identity and "s3cr3t" not in identity


def test_threads_of_one_worker_hit_the_same_entry_at_once(minion: MinionChild) -> None:
    """A container holds one share of an object: the slots of one worker take their copies in
    turn, so no slot's release ends the share another slot is still reading through."""
    url = f"unix://{minion.socket_path}"
    s3 = FakeS3()
    s3.put(URI, jpeg((90, 90, 90), (640, 480)))
    store: Any = s3
    holding = HostInputCache(url, "t1", 16 << 20)
    joining = HostInputCache(url, "t2", 16 << 20)
    results: list[bool] = []
    errors: list[BaseException] = []
    with cdi.connect(url, "t2") as t2:
        try:

            def slot(n: int) -> None:
                try:
                    for i in range(15):
                        obj, fetched = joining.fetch(
                            t2, store, URI, ObjectKey(f"wf-{n}-{i}"), recovery=None,
                            max_input_bytes=1 << 20, max_pixels=10**6,
                        )  # fmt: skip
                        results.append(fetched.hit)
                        obj.destroy()
                except BaseException as exc:  # reported below
                    errors.append(exc)

            started = time.monotonic()
            slots = [threading.Thread(target=slot, args=(n,)) for n in range(3)]
            for t in slots:
                t.start()
            for t in slots:
                t.join(60)
            assert not errors, errors
            # One fetch from S3, every other a hit, and none waited out a share (5 s).
            assert s3.gets == 1 and results.count(False) == 1 and len(results) == 45
            assert time.monotonic() - started < 5
        finally:
            joining.close()
            holding.close()
        assert t2.list_objects() == []

"""Mappings a client keeps for cooperative objects it gave away, and what they must not allow."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import cdi
from cdi.client.mapcache import MappingCache
from cdi.protocol import Op
from tests.cdi.conftest import MinionProcess, start_minion, stop_minion

Unique = Callable[[str], str]


def _mm_of(client: cdi.Client, key: str) -> object:
    return client._session.owned.maps[key].mm


def test_an_object_that_comes_back_reuses_the_mapping(
    minion: MinionProcess, unique: Unique
) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    key = unique("k")
    obj = a.create(key, 10_000)
    first_mm = _mm_of(a, key)
    view = obj.access()
    view[:3] = b"one"
    obj.transfer(b.container_id or "")
    with pytest.raises(ValueError, match="released"):
        view[0]  # revoked as always, although the mapping itself stays cached
    assert not obj.owned
    with pytest.raises(cdi.NotOwner):
        obj.read(timeout=0)  # a cached mapping is not ownership

    theirs = b.use(key)
    with theirs.view(timeout=5) as buf:
        assert bytes(buf[:3]) == b"one"
        buf[:3] = b"two"
    theirs.transfer(a.container_id or "")

    again = obj.access(timeout=5)
    assert _mm_of(a, key) is first_mm  # no fd, no mmap: the same mapping is usable again
    assert bytes(again[:3]) == b"two"
    again.release()
    obj.destroy()
    assert not obj.owned
    with pytest.raises(cdi.ObjectNotFound):
        obj.read(timeout=0)  # the mapping stays cached for its segment, the object is gone


def test_a_recreated_key_gets_its_own_memory(minion: MinionProcess, unique: Unique) -> None:
    """The cache names memory by the minion's segment id, never by key."""
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    key = unique("k")
    obj = a.create(key, 10_000)
    obj.write(b"old")
    obj.transfer(b.container_id or "")
    theirs = b.use(key)
    theirs.access(timeout=5).release()
    theirs.destroy()
    fresh = b.create(key, 50_000)  # another size class: another segment
    fresh.write(b"new")
    fresh.transfer(a.container_id or "")
    assert bytes(obj.read()[:3]) == b"new"
    assert obj.size == 50_000
    obj.destroy()


def test_a_new_object_reuses_the_mapping_of_a_freed_segment(
    minion: MinionProcess, unique: Unique
) -> None:
    """A create offers the segments we still map; the minion picks one and sends no fd."""
    a = minion.client(unique("a"))
    size = 3 << 20
    first = a.create(unique("k"), size)
    first.write(b"secret")
    first_mm = _mm_of(a, first.key)
    segment = a._session.owned.maps[first.key].segment
    first.destroy()
    assert first_mm.closed is False  # type: ignore[attr-defined]

    second = a.create(unique("k"), size)
    assert a._session.owned.maps[second.key].segment == segment
    assert _mm_of(a, second.key) is first_mm  # no mmap, and its pages are already mapped
    assert bytes(second.read()[:6]) == bytes(6)  # zeroed by the minion: no old bytes show
    second.destroy()


def test_an_object_in_a_segment_we_mapped_under_another_key_reuses_it(
    minion: MinionProcess, unique: Unique
) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    size = 3 << 20
    one = a.create(unique("k"), size)
    one.transfer(b.container_id or "")
    theirs = b.use(one.key)
    theirs.access(timeout=5).release()
    b_mm = _mm_of(b, one.key)
    theirs.transfer(a.container_id or "")  # b caches its mapping of this segment
    one.access(timeout=5).release()
    one.destroy()

    two = a.create(unique("k"), size)  # the same segment, now under another key
    assert a._session.owned.maps[two.key].segment == b._session.owned.cache.get(one.key).segment  # type: ignore[union-attr]
    two.write(b"fresh")
    two.transfer(b.container_id or "")
    with b.use(two.key).view(timeout=5) as buf:
        assert _mm_of(b, two.key) is b_mm  # the fd came, the cached mapping served
        assert bytes(buf[:5]) == b"fresh"
    assert one.key not in b._session.owned.cache
    b.use(two.key).destroy()


def test_create_checks_the_segments_it_is_offered(minion: MinionProcess, unique: Unique) -> None:
    a = minion.client(unique("a"))
    for bad in ("1", [1.5], list(range(65)), {"x": 1}):
        with pytest.raises(cdi.InvalidArgument, match="have must be a list"):
            a._session.conn.call(Op.CREATE, key=unique("k"), size=10, have=bad)
    # Naming a segment that is not free (or not ours) just gets a new one, with its fd.
    obj = a.create(unique("k"), 10)
    other = unique("k")
    reply, fd = a._session.conn.call(
        Op.CREATE, key=other, size=10, have=[a._session.owned.maps[obj.key].segment]
    )
    assert fd is not None and reply["segment"] != a._session.owned.maps[obj.key].segment
    os.close(fd)
    obj.destroy()
    a._session.conn.call(Op.DESTROY, key=other)


def test_strict_objects_are_never_cached(shared_dir: Path, unique: Unique) -> None:
    directory = shared_dir / "strict-cache"
    directory.mkdir()
    running = start_minion(directory, "--isolation", "strict")
    try:
        a, b = running.client(unique("a")), running.client(unique("b"))
        key = unique("k")
        obj = a.create(key, 10_000)
        first_mm = _mm_of(a, key)
        obj.transfer(b.container_id or "")
        assert key not in a._session.owned.cache
        assert first_mm.closed  # type: ignore[attr-defined]
        b.use(key).transfer(a.container_id or "")
        obj.access(timeout=5).release()
        assert _mm_of(a, key) is not first_mm
        obj.destroy()
    finally:
        stop_minion(running)


def test_the_cache_keeps_to_its_budget(minion: MinionProcess, unique: Unique) -> None:
    a = minion.client(unique("a"), cache_bytes=12_288)  # room for one 3-page segment
    b = minion.client(unique("b"), cache_bytes=0)
    keys = [unique("k") for _ in range(3)]
    objects = [a.create(k, 10_000) for k in keys]
    for obj in objects:
        obj.transfer(b.container_id or "")
    assert list(a._session.owned.cache) == keys[-1:]
    assert a._session.owned.cache.bytes == 12_288
    for key in keys:
        theirs = b.use(key)
        theirs.access(timeout=5).release()
        theirs.transfer(a.container_id or "")
        assert not b._session.owned.cache  # cache_bytes=0 keeps nothing
    for obj in objects:
        obj.destroy()
    assert (
        len(a._session.owned.cache) == 1 and a._session.owned.cache.bytes == 12_288
    )  # still within budget


def test_claiming_a_mapping_gives_a_non_owner_nothing(
    minion: MinionProcess, unique: Unique
) -> None:
    owner, other = minion.client(unique("owner")), minion.client(unique("other"))
    key = unique("k")
    obj = owner.create(key, 4096)
    segment = owner._session.owned.maps[key].segment
    with pytest.raises(cdi.NotOwner):
        other._session.conn.call(Op.ACCESS, key=key, wait=False, have=segment)
    with pytest.raises(cdi.AccessTimeout):
        other._session.conn.call_blocking(Op.ACCESS, 0.05, key=key, have=segment)
    # The owner that claims a mapping it does not have (a wrong id) gets the fd as usual.
    reply, fd = owner._session.conn.call(Op.ACCESS, key=key, wait=False, have=-1)
    assert fd is not None and reply["segment"] == segment
    os.close(fd)
    obj.destroy()


def _faults_while(action: Callable[[], object]) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    action()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_populate_maps_every_page_before_the_first_touch(
    minion: MinionProcess, unique: Unique
) -> None:
    client = minion.client(unique("a"))
    size = 4 << 20  # 1024 pages
    lazy = client.create(unique("lazy"), size, populate=False)
    eager = client.create(unique("eager"), size)  # populate is the default for a creator
    payload = b"\x01" * size
    with lazy.view() as buf:
        lazy_faults = _faults_while(lambda: buf.__setitem__(slice(None), payload))
    with eager.view() as buf:
        eager_faults = _faults_while(lambda: buf.__setitem__(slice(None), payload))
    assert lazy_faults >= 512  # one fault per page (or per fault-around batch)
    assert eager_faults < 64
    lazy.destroy()
    eager.destroy()


@dataclass
class _FakeMapping:
    capacity: int
    segment: int | None


def test_the_cache_indexes_mappings_by_segment_and_capacity() -> None:
    cache: MappingCache[_FakeMapping] = MappingCache(limit=30)
    first, second, third = _FakeMapping(10, 1), _FakeMapping(10, 2), _FakeMapping(20, 3)
    assert cache.put("a", first) == []
    assert cache.put("b", second) == []
    assert cache.segments_of_capacity(10) == [2, 1]  # most recently cached first
    assert cache.put("c", third) == [("a", first)]  # least recently used goes over budget
    assert cache.segments_of_capacity(10) == [2]
    assert cache.pop_segment(2, capacity=20) is None  # never a mapping of another size
    assert cache.pop_segment(2, capacity=10) is second
    assert "b" not in cache and cache.segments_of_capacity(10) == []
    # The same segment cached again under another key replaces the old entry.
    again = _FakeMapping(20, 3)
    assert cache.put("d", again) == [("c", third)]
    assert list(cache) == ["d"] and cache.bytes == 20
    assert cache.clear() == [again] and cache.bytes == 0 and cache.segments_of_capacity(20) == []

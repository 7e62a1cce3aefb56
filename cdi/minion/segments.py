"""Shared-memory segments and the pool that keeps them warm.

A segment is a ``memfd`` (anonymous shared memory with no name in any filesystem: a process can map
it only if it was handed the file descriptor) whose pages are allocated up front with
``posix_fallocate``. First touch of fresh pages costs ~0.8 ms/MB on our machines against
~0.035 ms/MB for pages already in use, so released segments go back to a pool, grouped in size
classes, and a ``create`` of a size seen before never pays the allocation again. A transfer never
allocates.

Cooperative segments are sealed against shrinking and growing: owners hold the fd and could
otherwise ``ftruncate`` it, and the minion's own mapping would then fault (SIGBUS) when it zeroes
the segment for reuse. Strict segments stay unsealed because revoking one *is* truncating it; they
are never reused. Their owner holds the fd and may truncate it too, so the minion never touches
their bytes through its mapping: it copies out of them with ``preadv`` and zeroes them with
``pwrite``, which see a truncated file as a short one instead of killing the minion (and every
object of the host) with SIGBUS.
"""

from __future__ import annotations

import ctypes
import fcntl
import itertools
import logging
import mmap
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from cdi.errors import OutOfMemory
from cdi.protocol import PAGE, size_class

__all__ = ["PAGE", "Segment", "SegmentPool", "size_class"]

log = logging.getLogger(__name__)

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_SEGMENT_IDS = itertools.count(1)
_ZEROS = memoryview(bytes(1 << 20))  # what pwrite zeroes an unsealed segment from, per call


@dataclass(eq=False)
class Segment:
    """One memfd plus the minion's own mapping of it."""

    fd: int
    capacity: int
    sealed: bool
    _mm: mmap.mmap = field(repr=False)
    _addr: int = field(repr=False)
    id: int = field(default_factory=lambda: next(_SEGMENT_IDS))
    """Unique for the minion's life: a client that cached a mapping names the memory by it."""
    dirty: int = 0
    """Bytes from the start that earlier objects may have written (the rest is zeros)."""
    uids: set[int] = field(default_factory=set)
    """Every uid whose processes were ever handed this memory (as owners or readers). Only a
    segment of one uid goes back to the pool, and only to that uid: Linux cannot take back a
    mapping, so memory one uid may still map never serves another."""
    _read_only: int | None = field(default=None, repr=False)

    @classmethod
    def allocate(cls, capacity: int, *, sealed: bool) -> Segment:
        flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealed else 0)
        fd = os.memfd_create("cdi-segment", flags)
        try:
            # Only the minion's uid may open the memory by name (/proc/<pid>/fd/<n>): a reader
            # given a read-only fd cannot reopen it writable through /proc/self/fd.
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, capacity)
            os.posix_fallocate(fd, 0, capacity)  # allocate the pages now, not on first touch
            if sealed:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            mm = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            raise OutOfMemory(f"cannot allocate a {capacity}-byte segment: {exc}") from exc
        probe = ctypes.c_char.from_buffer(mm)
        addr = ctypes.addressof(probe)
        del probe  # drop the buffer export at once so the mapping can be closed later
        return cls(fd=fd, capacity=capacity, sealed=sealed, _mm=mm, _addr=addr)

    def read_only_fd(self) -> int:
        """A read-only fd of this memory for readers of a shared object: it cannot be mapped
        writable (EACCES), written or truncated. Opened once, through /proc/self/fd, and kept."""
        if self._read_only is None:
            self._read_only = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        return self._read_only

    def intact(self, length: int) -> bool:
        """True if the file still spans ``length`` bytes (an unsealed owner may have shrunk it)."""
        return self.sealed or os.fstat(self.fd).st_size >= length

    def zero(self, end: int, start: int = 0) -> None:
        """Zero bytes ``start..end`` (clipped to the capacity)."""
        end = min(end, self.capacity)
        if end <= start:
            return
        if self.sealed:
            # A sealed file cannot shrink under the mapping: every page is there.
            ctypes.memset(self._addr + start, 0, end - start)
            return
        self._positional_io(
            "zero",
            start,
            end,
            lambda at: os.pwrite(self.fd, _ZEROS[: min(end - at, len(_ZEROS))], at),
        )

    def copy_from(self, other: Segment, length: int) -> None:
        """Copy the first ``length`` bytes of ``other`` into this segment, which nobody else
        maps yet (it was just acquired). An unsealed source its owner truncated reads short:
        what lay beyond its end stays zeros here."""
        n = min(length, self.capacity, other.capacity)
        if other.sealed:
            ctypes.memmove(self._addr, other._addr, n)
            return
        with memoryview(self._mm) as target:

            def read_into(at: int) -> int:
                with target[at:n] as rest:
                    return os.preadv(other.fd, [rest], at)

            other._positional_io("copy", 0, n, read_into)

    def _positional_io(self, what: str, start: int, end: int, step: Callable[[int], int]) -> None:
        """Run ``step(at)`` (one pread/pwrite, returning the bytes it did) from ``start`` to
        ``end``. For unsealed segments, whose owner may truncate the file: an error or a short
        file ends the loop with a warning, never a SIGBUS in this process."""
        at = start
        while at < end:
            try:
                done = step(at)
            except OSError as exc:
                log.warning("cannot %s segment %d at %d: %s", what, self.id, at, exc)
                return
            if done <= 0:
                return
            at += done

    def read(self, length: int) -> bytes:
        return self._mm[:length]

    def close(self, *, truncate: bool = False) -> None:
        """Unmap and close; ``truncate`` first frees the pages so stale mappings fault."""
        self._mm.close()
        if truncate and not self.sealed:
            os.ftruncate(self.fd, 0)
        os.close(self.fd)
        if self._read_only is not None:
            os.close(self._read_only)
            self._read_only = None


class SegmentPool:
    """Hands out segments by size class and keeps released ones warm for reuse, per uid.

    ``memory_limit`` caps all segment bytes (in use and idle); ``idle_limit`` caps what idle
    segments may keep. A released segment that one uid alone was handed is kept for that uid
    only; one handed to several uids is closed (a process may still map it: Linux cannot
    revoke a mapping, so its pages must never hold another object). A segment is zeroed when it
    is handed out again, not when it is released, and only as far as it must be: all of it if
    the new owner asked for zeros, else the old bytes beyond the new object's size (the creator
    overwrites its size, not the slack the next owner maps too). Its old bytes are its own
    uid's: a process can read the memory of processes of its own uid anyway
    (``/proc/<pid>/mem``), so leaving them to a creator about to overwrite them (an image)
    hides nothing and saves a pass over the memory.
    """

    def __init__(self, memory_limit: int, idle_limit: int) -> None:
        self.memory_limit = memory_limit
        self.idle_limit = idle_limit
        self._idle: dict[tuple[int, bool, int | None], list[Segment]] = defaultdict(list)
        self.retired = 0  # released segments closed because several uids were handed them
        self.idle_bytes = 0
        self.used_bytes = 0
        self.used_segments = 0
        self.allocations = 0
        self.reuses = 0
        self.zeroed_bytes = 0

    def acquire(
        self,
        size: int,
        *,
        sealed: bool = True,
        prefer: frozenset[int] = frozenset(),
        uid: int | None = None,
        zeroed: bool = True,
    ) -> Segment:
        """A segment for ``size`` bytes, to be handed to a process of ``uid``: an idle one of
        its class that only ``uid`` (or nobody) was handed, if any — one of ``prefer`` (segment
        ids the caller still maps) when possible — else a new one.

        ``zeroed=False``: that process will overwrite the first ``size`` bytes, so old bytes
        of its own uid may stay there (never beyond ``size``)."""
        capacity = size_class(size)
        bucket = self._idle.get((capacity, sealed, uid)) or self._idle.get((capacity, sealed, None))
        if bucket:
            segment = bucket.pop(_preferred_index(bucket, prefer))
            self.idle_bytes -= capacity
            self.reuses += 1
            self._scrub(segment, size, zeroed)
        else:
            self._make_room(capacity)
            segment = Segment.allocate(capacity, sealed=sealed)
            self.allocations += 1
        if uid is not None:
            segment.uids.add(uid)
        self.used_bytes += capacity
        self.used_segments += 1
        return segment

    def _scrub(self, segment: Segment, size: int, zeroed: bool) -> None:
        """Zero what the new owner must not see: everything old if it asked for zeros, else
        the old bytes beyond ``size`` only (the owner overwrites the rest, and the slack up to
        the capacity would otherwise travel with the object to whoever gets it next)."""
        if not segment.dirty:
            return
        keep = 0 if zeroed else min(size, segment.dirty)
        if segment.dirty > keep:
            segment.zero(segment.dirty, start=keep)
            self.zeroed_bytes += segment.dirty - keep
        segment.dirty = keep

    @staticmethod
    def returns_to(segment: Segment, uid: int) -> bool:
        """Whether only ``uid`` was handed ``segment``, so a mapping of it that a process of
        ``uid`` keeps can only ever serve that uid's objects again."""
        return segment.sealed and segment.uids <= {uid}

    def release(self, segment: Segment, used: int) -> None:
        """Return a segment whose object is gone; ``used`` bytes of it may hold its data."""
        self._forget(segment)
        if not segment.sealed or not segment.intact(segment.capacity):
            segment.close(truncate=True)
            return
        if len(segment.uids) > 1:
            self.retired += 1
            segment.close()  # sealed: it cannot be truncated; nobody gets it again
            return
        if self.idle_bytes + segment.capacity > self.idle_limit:
            segment.close()
            return
        segment.dirty = max(segment.dirty, min(used, segment.capacity))
        owner = next(iter(segment.uids), None)
        self._idle[(segment.capacity, segment.sealed, owner)].append(segment)
        self.idle_bytes += segment.capacity

    def discard(self, segment: Segment) -> None:
        """Revoke a segment for good: truncate so every stale mapping faults, then close."""
        self._forget(segment)
        segment.close(truncate=True)

    def prewarm(self, size: int, count: int, *, sealed: bool = True) -> None:
        """Allocate ``count`` idle segments for objects of ``size`` bytes."""
        warm = [self.acquire(size, sealed=sealed) for _ in range(count)]
        for segment in warm:
            self._forget(segment)
            self._idle[(segment.capacity, sealed, None)].append(segment)
            self.idle_bytes += segment.capacity

    def close(self) -> None:
        for bucket in self._idle.values():
            for segment in bucket:
                segment.close()
        self._idle.clear()
        self.idle_bytes = 0

    def _forget(self, segment: Segment) -> None:
        self.used_bytes -= segment.capacity
        self.used_segments -= 1

    def _make_room(self, capacity: int) -> None:
        if self.used_bytes + self.idle_bytes + capacity <= self.memory_limit:
            return
        # Give back idle segments, largest first, before refusing.
        for key in sorted(self._idle, key=lambda k: k[0], reverse=True):
            bucket = self._idle[key]
            while bucket and self.used_bytes + self.idle_bytes + capacity > self.memory_limit:
                bucket.pop().close()
                self.idle_bytes -= key[0]
        if self.used_bytes + capacity > self.memory_limit:
            raise OutOfMemory(
                f"a {capacity}-byte segment would exceed the minion's memory limit of "
                f"{self.memory_limit} bytes ({self.used_bytes} in use)"
            )
        log.debug("freed idle segments to make room for %d bytes", capacity)


def _preferred_index(bucket: list[Segment], prefer: frozenset[int]) -> int:
    """The most recently released segment of ``bucket`` whose id is in ``prefer``; else the
    most recently released one (its pages are the likeliest to be warm in cache)."""
    if prefer:
        for index in range(len(bucket) - 1, -1, -1):
            if bucket[index].id in prefer:
                return index
    return -1

"""Fetch each input once per host: the workers' side of the input cache and its holder.

*Who holds the cache.* A CDI object has one owner, and only the owner can share it, so the
cached objects need an owner that outlives any one task and answers every worker of the host.
The first worker process of a host (and uid) to bind the host's abstract Unix address runs the
*holder* in a thread: a CDI container of its own (``<worker id>.input-cache``) that owns the
cached objects, and the index (``input_cache.CacheIndex``). The others connect to it; when its
process ends, its objects die with its container (their recovery container is itself) and the
next worker that finds the address free holds the cache anew, empty.

*A fetch through the cache* (``HostInputCache.fetch``): a HEAD, with the worker's own
credentials, gives the object's ETag and version and refuses a caller S3 would refuse (so an
input the caller may not read is never served from the cache); then the holder is asked for the
key. On a hit the worker asks for a share (one at a time per worker process: a container
holds one share of an object) and the holder shares the object read-only with it; the worker
copies it into the task's own object (one ``memcpy``) and releases the share: the workflow's
object must be its own to transfer, keep or destroy, which a share is not. On a miss the
worker GETs and decodes as without the cache, then copies the image into a new object it hands
to the holder. A GET whose tag is not the HEAD's (the object changed in between) is used but
not cached.

Anything that goes wrong with the cache itself (no holder, a dead connection, an object gone)
falls back to the plain fetch: the cache only ever saves work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

import cdi
from cdi import ObjectKey
from cdi.url import resolve_socket_path
from orchestrator.errors import InputTooLarge
from orchestrator.objectstore import ObjectStore, Stored
from orchestrator.worker.input_cache import CacheIndex, CacheKey, Entry, Verdict
from orchestrator.worker.input_fetch import decode_into_object

__all__ = ["CacheFigures", "Fetched", "HostInputCache", "InputStats", "cache_address"]

log = logging.getLogger(__name__)

WAIT_S: Final = 10.0  # how long a worker waits for another's fill of the same input
RETRY_S: Final = 30.0  # how long after a failed registration of the holder it is tried again
_KEY_PREFIX: Final = "cdiflow-input-cache/"


def cache_address(cdi_socket: str) -> bytes:
    """The abstract Unix address of the cache of the minion at ``cdi_socket`` for this uid."""
    name = f"{os.path.realpath(cdi_socket)}|{os.getuid()}"
    return b"\0cdiflow-input-cache/" + hashlib.sha256(name.encode()).hexdigest()[:24].encode()


@dataclass(frozen=True)
class Fetched:
    """How an input came: from the cache (``hit``), and the bytes S3 sent or was spared."""

    hit: bool
    s3_bytes: int  # the input's bytes GET from S3 (0 on a hit)
    source_bytes: int  # the input's size in S3


class InputStats:
    """A worker's input fetches, for its metrics (thread-safe)."""

    def __init__(self) -> None:
        self.hits = self.misses = self.saved_bytes = self.s3_bytes = 0
        self._lock = threading.Lock()

    def count(self, fetched: Fetched, *, cached: bool) -> None:
        with self._lock:
            self.s3_bytes += fetched.s3_bytes
            if fetched.hit:
                self.hits += 1
                self.saved_bytes += fetched.source_bytes
            elif cached:
                self.misses += 1

    def figures(self, cache: HostInputCache) -> CacheFigures:
        """These counts and what ``cache`` holds for the host, read now."""
        entries, used = cache.held()
        with self._lock:
            return CacheFigures(self.hits, self.misses, self.saved_bytes, self.s3_bytes,
                                cache.holding, entries, used)  # fmt: skip


@dataclass(frozen=True)
class CacheFigures:
    """A worker's input cache as its heartbeat reports it: its own hits, misses, S3 bytes its
    hits spared and input bytes it GET, and what it holds for the host (``holder``: this
    worker holds the host's cache; ``entries`` and ``bytes`` are 0 on the others)."""

    hits: int
    misses: int
    saved_bytes: int
    s3_bytes: int
    holder: bool
    entries: int
    bytes: int


class _Channel:
    """One JSON line each way over a connection to the holder."""

    def __init__(self, sock: socket.socket) -> None:
        self.file = sock.makefile("rwb")

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.file.write(json.dumps(request).encode() + b"\n")
        self.file.flush()
        line = self.file.readline()
        if not line:
            raise ConnectionError("the input cache's holder closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()


class _Holder:
    """Owns the cached objects through its own CDI container and answers the host's workers."""

    def __init__(self, client: cdi.Client, budget: int, listener: socket.socket) -> None:
        self.client = client
        self.container_id = str(client.container_id)
        self.index = CacheIndex(budget, self._destroy)
        self.listener = listener
        self._thread = threading.Thread(target=self._accept, name="input-cache", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        # The address stays bound while the accept thread is inside accept(): once it has
        # returned, the next worker of the host can hold the cache at once.
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self.listener.close()
        with contextlib.suppress(cdi.CDIError):
            self.index.clear()
        self.client.close()  # what is still shared dies with our container once released

    def _destroy(self, key: ObjectKey) -> bool:
        try:
            self.client.use(key, check=False).destroy()
        except cdi.ObjectShared:
            return False
        except (cdi.ObjectNotFound, cdi.NotOwner):
            pass  # gone already
        return True

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        pending: set[str] = set()
        caller = object()
        channel = _Channel(conn)
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] != os.getuid():
                return  # the address is per uid; another's is not served
            file = channel.file
            for line in file:
                reply = self._answer(json.loads(line), caller, pending)
                file.write(json.dumps(reply).encode() + b"\n")
                file.flush()
        except (OSError, ValueError, KeyError, TypeError, cdi.CDIError) as exc:
            log.debug("input cache connection ended: %s", exc)
        finally:
            for digest in pending:  # a fill that never came: the next waiter fetches
                self.index.abandon(digest, caller)
            channel.close()
            conn.close()

    def _answer(self, req: dict[str, Any], caller: object, pending: set[str]) -> dict[str, Any]:
        ckey = CacheKey(**req["key"])
        digest = ckey.digest
        op = req["op"]
        if op == "get":
            got = self.index.acquire(ckey, caller, WAIT_S)
            if got is Verdict.FILL:
                pending.add(digest)
                return {"status": "fill", "holder": self.container_id,
                        "budget": self.index.budget}  # fmt: skip
            return {"status": "hit" if isinstance(got, Entry) else "skip"}
        if op == "share":
            # Asked apart from ``get``, by a worker holding its lock on reading the cache: a
            # container holds one share of an object, which one thread's release would end
            # under another thread of the same worker still reading it.
            entry = self.index.find(digest)
            if entry is None:
                return {"ok": False}  # evicted since
            try:
                self.client.use(entry.key, check=False).share([str(req["reader"])])
            except cdi.CDIError as exc:
                log.warning("cached input %s cannot be shared: %s", ckey.uri, exc)
                if isinstance(exc, (cdi.ObjectNotFound, cdi.NotOwner)):
                    self.index.drop(digest)
                return {"ok": False}
            return {"ok": True, "object": entry.key, "source_bytes": entry.source_bytes}
        pending.discard(digest)
        if op == "abandon":
            self.index.abandon(digest, caller, too_big=bool(req.get("too_big")))
            return {"ok": True}
        if op != "put":
            raise ValueError(f"unknown input cache operation {op!r}")
        key = ObjectKey(str(req["object"]))
        if not key.startswith(_KEY_PREFIX):
            raise ValueError(f"{key!r} is not an input cache object")
        try:
            handle = self.client.use(key)
            handle.set_recovery(self.container_id)  # it dies with the holder, not elsewhere
            entry = Entry(digest, ckey.family, key, handle.size, int(req["source_bytes"]))
        except cdi.CDIError as exc:
            log.warning("input cache: %s offered an object we cannot take: %s", ckey.uri, exc)
            self.index.abandon(digest, caller)
            return {"ok": False}
        if self.index.put(ckey, caller, entry):
            return {"ok": True}
        with contextlib.suppress(cdi.CDIError):
            handle.destroy()
        return {"ok": False}


class HostInputCache:
    """A worker's way to its host's input cache; the holder too, while this process holds
    the host's address (``holding``)."""

    def __init__(self, cdi_url: str | None, worker_id: str, budget: int) -> None:
        self.cdi_url = cdi_url
        self.address = cache_address(resolve_socket_path(cdi_url))
        self.holder_id = f"{worker_id}.input-cache"
        self.budget = budget
        self._holder: _Holder | None = None
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()  # one share of an object per container at a time
        self._retry_at = 0.0  # when to try holding again after the minion refused the holder
        self._try_hold()

    @property
    def holding(self) -> bool:
        return self._holder is not None

    def held(self) -> tuple[int, int]:
        """Entries and bytes this process holds for its host (0, 0 when another does)."""
        holder = self._holder
        return (len(holder.index), holder.index.used) if holder is not None else (0, 0)

    def close(self) -> None:
        with self._lock:
            holder, self._holder = self._holder, None
        if holder is not None:
            holder.close()

    def _try_hold(self) -> None:
        with self._lock:
            if self._holder is not None or time.monotonic() < self._retry_at:
                return
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                listener.bind(self.address)
                listener.listen(64)
            except OSError:
                listener.close()
                return  # another process of this host holds it
            try:
                client = cdi.connect(self.cdi_url, self.holder_id)
            except cdi.CDIError as exc:
                listener.close()
                self._retry_at = time.monotonic() + RETRY_S
                log.warning("the input cache cannot register %s (tried again in %g s): %s",
                            self.holder_id, RETRY_S, exc)  # fmt: skip
                return
            self._holder = _Holder(client, self.budget, listener)
            self._holder.start()
            log.info("holding this host's input cache (%d MiB)", self.budget >> 20)

    def _connect(self) -> socket.socket | None:
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(WAIT_S + 5.0)  # a holder that stopped answering is not waited for
            try:
                sock.connect(self.address)
                return sock
            except OSError:
                sock.close()
                self._try_hold()  # nobody holds it (its process ended): we may
        return None

    def fetch(
        self,
        client: cdi.Client,
        store: ObjectStore,
        uri: str,
        key: ObjectKey,
        *,
        recovery: str | None,
        max_input_bytes: int,
        max_pixels: int,
    ) -> tuple[cdi.CDIObject, Fetched]:
        """The input at ``uri`` decoded into a new object ``key`` of ``client``'s, from the
        host's cache when it holds the version S3 has now. Errors as a plain GET and decode."""
        stored = store.head(uri)  # S3 refuses a caller that may not read it, as a GET would
        if stored.size > max_input_bytes:
            raise InputTooLarge(
                f"{uri} is {stored.size} bytes; the limit is {max_input_bytes} (MAX_INPUT_BYTES)"
            )
        ckey = CacheKey(store.identity, uri, stored.etag, stored.version,
                        max_input_bytes, max_pixels)  # fmt: skip
        sock = self._connect() if ckey.cacheable else None
        if sock is None:
            return self._plain(client, store, uri, key, recovery, max_input_bytes, max_pixels)
        channel = _Channel(sock)
        try:
            try:
                reply = channel.call({"op": "get", "key": dataclasses.asdict(ckey),
                                      "reader": client.container_id})  # fmt: skip
            except (OSError, ValueError) as exc:
                log.warning("the input cache did not answer: %s", exc)
                reply = {"status": "skip"}
            if reply["status"] == "hit":
                copied = self._copy(channel, client, ckey, key, recovery)
                if copied is not None:
                    return copied
            elif reply["status"] == "fill":
                return self._fill(channel, reply, client, store, ckey, stored, key, recovery)
            return self._plain(client, store, uri, key, recovery, max_input_bytes, max_pixels)
        finally:
            channel.close()
            sock.close()

    def _plain(
        self,
        client: cdi.Client,
        store: ObjectStore,
        uri: str,
        key: ObjectKey,
        recovery: str | None,
        max_input_bytes: int,
        max_pixels: int,
    ) -> tuple[cdi.CDIObject, Fetched]:
        data = store.get(uri, max_input_bytes)
        obj = decode_into_object(client, data, uri, key, recovery=recovery, max_pixels=max_pixels)
        return obj, Fetched(False, len(data), len(data))

    def _copy(
        self,
        channel: _Channel,
        client: cdi.Client,
        ckey: CacheKey,
        key: ObjectKey,
        recovery: str | None,
    ) -> tuple[cdi.CDIObject, Fetched] | None:
        """A new object ``key`` with the bytes of the cached input of ``ckey``, shared with us
        for the copy; None if it cannot be read (the caller fetches the input itself)."""
        with self._read_lock:
            try:
                shared = channel.call({"op": "share", "key": dataclasses.asdict(ckey),
                                       "reader": client.container_id})  # fmt: skip
            except (OSError, ValueError) as exc:
                log.warning("the input cache did not answer: %s", exc)
                return None
            if not shared.get("ok"):
                return None  # evicted between the two calls
            cached = client.use(str(shared["object"]), check=False)
            try:
                try:
                    view = cached.read(timeout=5.0)
                except cdi.CDIError as exc:
                    log.warning("cached input %s cannot be read: %s", cached.key, exc)
                    return None
                try:
                    obj = client.create(key, len(view), recovery=recovery, zeroed=False)
                    try:
                        with obj.view() as buffer:
                            buffer[:] = view
                    except BaseException:
                        with contextlib.suppress(cdi.CDIError):
                            obj.destroy()
                        raise
                finally:
                    view.release()
            finally:
                with contextlib.suppress(cdi.CDIError):
                    cached.release()
        return obj, Fetched(True, 0, int(shared["source_bytes"]))

    def _fill(
        self,
        channel: _Channel,
        reply: dict[str, Any],
        client: cdi.Client,
        store: ObjectStore,
        ckey: CacheKey,
        stored: Stored,
        key: ObjectKey,
        recovery: str | None,
    ) -> tuple[cdi.CDIObject, Fetched]:
        """Fetch and decode as without the cache, then offer the holder a copy."""
        data, got = store.get_stored(ckey.uri, ckey.max_input_bytes)
        obj = decode_into_object(client, data, ckey.uri, key, recovery=recovery,
                                 max_pixels=ckey.max_pixels)  # fmt: skip
        fetched = Fetched(False, len(data), len(data))
        same = (got.etag, got.version) == (stored.etag, stored.version)
        try:
            if not same or obj.size > int(reply["budget"]):
                # Changed since the HEAD (a later fetch caches the new one), or never fits.
                channel.call({"op": "abandon", "key": dataclasses.asdict(ckey),
                              "too_big": same})  # fmt: skip
            else:
                self._offer(channel, client, obj, ckey, str(reply["holder"]), len(data))
        except (OSError, ValueError, cdi.CDIError) as exc:
            log.warning("input %s was not cached: %s", ckey.uri, exc)
        return obj, fetched

    def _offer(
        self,
        channel: _Channel,
        client: cdi.Client,
        obj: cdi.CDIObject,
        ckey: CacheKey,
        holder: str,
        source_bytes: int,
    ) -> None:
        copy = client.create(f"{_KEY_PREFIX}{uuid.uuid4().hex}", obj.size, zeroed=False)
        try:
            with obj.view() as source, copy.view() as target:
                target[:] = source
            copy.transfer(holder)
        except BaseException:
            with contextlib.suppress(cdi.CDIError):
                copy.destroy()
            raise
        channel.call({"op": "put", "key": dataclasses.asdict(ckey), "object": copy.key,
                      "source_bytes": source_bytes})  # fmt: skip

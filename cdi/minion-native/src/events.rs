//! Object and container events for the controller's directory, written to an inherited pipe
//! (`--events-fd`) as a stream of msgpack arrays that `cdi/minion/launcher.py` relays:
//! `["registered", cid, pid, uid]`, `["gone", cid]`, `["changed", key, size, owner,
//! generation, created_at]` (`created_at`: the object's creation, Unix seconds, kept across a
//! restart), `["removed", key]`, `["arrived", key, recovery, generation]` (an object received
//! from another host by the gateway in the minion, `gateway.rs`, and its generation here), and,
//! first of all from a minion with a state folder, `["store", store, restarts, kept_objects]` (`docs/minion-restart.md`: its store's id, how
//! many minions took the store over from another, the objects this one found again).
//!
//! The loop never waits for the reader: events collect in an outbox that is written after each
//! epoll batch (after the replies, which are what clients wait for), EPOLLOUT is watched while
//! bytes are pending, and a reader that is gone only costs the events.
//!
//! *Objects' events linger* (`--events-linger-ms`, 200 by default; 0: each at once): an
//! object's `changed` and `removed` wait that long, the latest of each object replacing the
//! ones before, and an object created and destroyed within it is never told at all. *Why:* the
//! directory serves lookups, recovery and dashboards, and its reporter already waits as long to
//! batch its calls; a frame that lives a few milliseconds would otherwise cost the relay and
//! the controller three or four events each. Containers' events (`registered`, `gone`,
//! `store`) write the objects' lingering events first, so the reader sees them in order.

use std::collections::{HashMap, HashSet};
use std::os::fd::RawFd;

use crate::log;
use crate::msgpack::Enc;
use crate::sys;

/// Beyond this many pending bytes the reader is hopelessly behind: drop events, not memory.
const MAX_PENDING: usize = 64 << 20;

/// An object's latest event, not yet written.
enum Lingering {
    Changed {
        size: u64,
        owner: String,
        generation: u64,
        created_at: f64,
    },
    Removed,
}

pub struct EventSink {
    fd: RawFd,
    outbox: Vec<u8>,
    written: usize,
    broken: bool,
    overflowing: bool,
    linger_ns: u64,
    lingering: HashMap<String, Lingering>,
    since_ns: u64, // when the oldest lingering event came (meaningful while there is one)
    told: HashSet<String>, // objects the reader was told exist (and not told gone since)
}

impl EventSink {
    /// Take over `fd`, making it non-blocking; the error names what is wrong with it.
    /// Objects' events linger `linger_ms` (0: written at once).
    pub fn open(fd: RawFd, linger_ms: u64) -> Result<EventSink, String> {
        // SAFETY: fcntl on an arbitrary int is harmless; EBADF tells us it is not open.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(format!("--events-fd {fd} is not an open file descriptor"));
        }
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(format!("--events-fd {fd} is not open for writing"));
        }
        // SAFETY: as above, on an fd we now know is open.
        unsafe {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        Ok(EventSink {
            fd,
            outbox: Vec::with_capacity(4096),
            written: 0,
            broken: false,
            overflowing: false,
            linger_ns: linger_ms.saturating_mul(1_000_000),
            lingering: HashMap::new(),
            since_ns: 0,
            told: HashSet::new(),
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    pub fn registered(&mut self, container: &str, pid: i32, uid: u32) {
        self.write_lingering();
        if let Some(mut enc) = self.event(4) {
            enc.str("registered");
            enc.str(container);
            enc.int(pid as i128);
            enc.uint(uid as u64);
        }
    }

    pub fn store(&mut self, store: &str, restarts: u64, kept_objects: u64) {
        self.write_lingering();
        if let Some(mut enc) = self.event(4) {
            enc.str("store");
            enc.str(store);
            enc.uint(restarts);
            enc.uint(kept_objects);
        }
    }

    pub fn gone(&mut self, container: &str) {
        self.write_lingering();
        if let Some(mut enc) = self.event(2) {
            enc.str("gone");
            enc.str(container);
        }
    }

    pub fn changed(&mut self, key: &str, size: u64, owner: &str, generation: u64, created_at: f64) {
        if self.linger_ns == 0 {
            self.write_changed(key, size, owner, generation, created_at);
            return;
        }
        let owner = owner.to_owned();
        let event = Lingering::Changed {
            size,
            owner,
            generation,
            created_at,
        };
        self.linger(key, event);
    }

    fn write_changed(
        &mut self,
        key: &str,
        size: u64,
        owner: &str,
        generation: u64,
        created_at: f64,
    ) {
        let Some(mut enc) = self.event(6) else {
            return;
        };
        enc.str("changed");
        enc.str(key);
        enc.uint(size);
        enc.str(owner);
        enc.uint(generation);
        enc.float(created_at);
        if !self.told.contains(key) {
            self.told.insert(key.to_owned());
        }
    }

    /// An object received from another host was handed to its owner here; `recovery`: the
    /// recovery container it had there (the gateway beside us sends it back there if its
    /// owner here dies), empty if none.
    pub fn arrived(&mut self, key: &str, recovery: &str, generation: u64) {
        if let Some(mut enc) = self.event(4) {
            enc.str("arrived");
            enc.str(key);
            enc.str(recovery);
            enc.uint(generation);
        }
    }

    pub fn removed(&mut self, key: &str) {
        if self.linger_ns == 0 {
            self.write_removed(key);
        } else if self.told.contains(key) || !self.lingering.contains_key(key) {
            self.linger(key, Lingering::Removed);
        } else {
            // Created (or first told to us) within the linger and gone: never told at all.
            self.lingering.remove(key);
        }
    }

    fn write_removed(&mut self, key: &str) {
        let Some(mut enc) = self.event(2) else {
            return;
        };
        enc.str("removed");
        enc.str(key);
        self.told.remove(key);
    }

    fn linger(&mut self, key: &str, event: Lingering) {
        if self.broken {
            return;
        }
        if self.lingering.is_empty() {
            self.since_ns = sys::monotonic_ns();
        }
        match self.lingering.get_mut(key) {
            Some(slot) => *slot = event,
            None => {
                self.lingering.insert(key.to_owned(), event);
            }
        }
    }

    /// When the lingering events are due (`None`: there are none).
    pub fn due_at(&self) -> Option<u64> {
        (!self.lingering.is_empty()).then(|| self.since_ns.saturating_add(self.linger_ns))
    }

    /// Write the lingering events once they are due.
    pub fn tick(&mut self) {
        if self.due_at().is_some_and(|at| sys::monotonic_ns() >= at) {
            self.write_lingering();
        }
    }

    /// Write every lingering event now.
    pub fn write_lingering(&mut self) {
        for (key, event) in std::mem::take(&mut self.lingering) {
            match event {
                Lingering::Changed {
                    size,
                    owner,
                    generation,
                    created_at,
                } => self.write_changed(&key, size, &owner, generation, created_at),
                Lingering::Removed => self.write_removed(&key),
            }
        }
    }

    /// An encoder positioned after a new array header, or `None` if events are being dropped.
    fn event(&mut self, items: usize) -> Option<Enc<'_>> {
        if self.broken {
            return None;
        }
        if self.outbox.len() - self.written > MAX_PENDING {
            if !self.overflowing {
                self.overflowing = true;
                log::warning(format_args!(
                    "the directory's event reader is {MAX_PENDING} bytes behind; dropping \
                     events until it catches up"
                ));
            }
            return None;
        }
        self.overflowing = false;
        let mut enc = Enc(&mut self.outbox);
        enc.array(items);
        Some(enc)
    }

    pub fn pending(&self) -> bool {
        !self.broken && self.written < self.outbox.len()
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Write what the pipe takes now; never blocks.
    pub fn flush(&mut self) {
        while self.pending() {
            let rest = &self.outbox[self.written..];
            // SAFETY: rest is a valid buffer of its length.
            let n = unsafe { libc::write(self.fd, rest.as_ptr().cast(), rest.len()) };
            if n < 0 {
                match sys::errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => break,
                    code => {
                        self.broken = true;
                        log::warning(format_args!(
                            "the directory's event reader is gone ({}); dropping events from now on",
                            sys::os_error_text(code)
                        ));
                        self.outbox = Vec::new();
                        self.written = 0;
                        return;
                    }
                }
            } else {
                self.written += n as usize;
            }
        }
        if self.written == self.outbox.len() {
            self.outbox.clear();
            self.written = 0;
        } else if self.written > (1 << 16) && self.written * 2 > self.outbox.len() {
            self.outbox.drain(..self.written); // keep the buffer from growing without bound
            self.written = 0;
        }
    }

    /// At shutdown: keep writing for up to `budget_ms` while the reader takes the rest (the
    /// Python reporter's close flushes for about a second too).
    pub fn drain(&mut self, budget_ms: u64) {
        let deadline = sys::monotonic_ns() + budget_ms * 1_000_000;
        self.write_lingering();
        self.flush();
        while self.pending() {
            let now = sys::monotonic_ns();
            if now >= deadline {
                break;
            }
            let mut pfd = libc::pollfd {
                fd: self.fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            let wait = ((deadline - now) / 1_000_000).max(1) as libc::c_int;
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, wait) };
            self.flush();
        }
    }
}

impl Drop for EventSink {
    fn drop(&mut self) {
        sys::close(self.fd); // the reader sees the end of the stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink on a pipe, and the pipe's read end.
    fn sink(linger_ms: u64) -> (EventSink, RawFd) {
        let mut fds = [0; 2];
        // SAFETY: a valid array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (EventSink::open(fds[1], linger_ms).unwrap(), fds[0])
    }

    /// The events written so far, as their kinds and keys (every event here has a key).
    fn written(sink: &mut EventSink, read_fd: RawFd) -> Vec<String> {
        sink.flush();
        let mut bytes = vec![0u8; 1 << 16];
        // SAFETY: a valid buffer of its length; the read end does not block once the sink
        // has written (and an empty pipe is made non-blocking first).
        let n = unsafe {
            libc::fcntl(read_fd, libc::F_SETFL, libc::O_NONBLOCK);
            libc::read(read_fd, bytes.as_mut_ptr().cast(), bytes.len())
        };
        let bytes = &bytes[..n.max(0) as usize];
        // Keys here are two characters, after their one-byte msgpack header; kinds are the
        // words the stream names. In the order written, and within one linger's batch (whose
        // order is not kept) by key.
        let mut found = Vec::new();
        for word in ["changed", "removed", "registered"] {
            let word = word.as_bytes();
            for at in (0..bytes.len().saturating_sub(word.len()))
                .filter(|&at| bytes[at..].starts_with(word))
            {
                let key = &bytes[at + word.len() + 1..at + word.len() + 3];
                let (word, key) = (String::from_utf8_lossy(word), String::from_utf8_lossy(key));
                found.push((at, format!("{word} {key}")));
            }
        }
        found.sort();
        found.into_iter().map(|(_, event)| event).collect()
    }

    fn sorted(mut events: Vec<String>) -> Vec<String> {
        events.sort();
        events
    }

    #[test]
    fn an_object_created_and_destroyed_within_the_linger_is_never_told() {
        let (mut sink, read_fd) = sink(200);
        sink.changed("k1", 10, "a", 1, 0.0);
        sink.changed("k1", 10, "b", 2, 0.0);
        sink.removed("k1");
        assert!(sink.due_at().is_none());
        sink.write_lingering();
        assert!(written(&mut sink, read_fd).is_empty());
        sys::close(read_fd);
    }

    #[test]
    fn the_latest_event_of_each_object_is_told_once_due() {
        let (mut sink, read_fd) = sink(200);
        sink.changed("k1", 10, "a", 1, 0.0);
        sink.changed("k2", 10, "a", 1, 0.0);
        sink.changed("k1", 10, "b", 2, 0.0);
        let due = sink.due_at().expect("lingering");
        sink.tick(); // not due yet
        assert!(written(&mut sink, read_fd).is_empty());
        assert!(due > sys::monotonic_ns());
        sink.write_lingering();
        assert_eq!(
            sorted(written(&mut sink, read_fd)),
            ["changed k1", "changed k2"]
        );
        // Told to exist: its end is told too, and a new one under the same key again.
        sink.removed("k1");
        sink.write_lingering();
        assert_eq!(written(&mut sink, read_fd), ["removed k1"]);
        sink.changed("k1", 10, "c", 3, 0.0);
        sink.removed("k2");
        sink.write_lingering();
        assert_eq!(
            sorted(written(&mut sink, read_fd)),
            ["changed k1", "removed k2"]
        );
        sys::close(read_fd);
    }

    #[test]
    fn a_containers_event_comes_after_the_objects_lingering_before_it() {
        let (mut sink, read_fd) = sink(200);
        sink.changed("k1", 10, "a", 1, 0.0);
        sink.registered("c1", 1, 0);
        assert!(sink.due_at().is_none());
        let text = written(&mut sink, read_fd);
        assert_eq!(text, ["changed k1", "registered c1"]);
        sys::close(read_fd);
    }

    #[test]
    fn without_a_linger_each_event_is_written_at_once() {
        let (mut sink, read_fd) = sink(0);
        sink.changed("k1", 10, "a", 1, 0.0);
        sink.removed("k1");
        assert!(sink.due_at().is_none());
        assert_eq!(written(&mut sink, read_fd), ["changed k1", "removed k1"]);
        sys::close(read_fd);
    }
}

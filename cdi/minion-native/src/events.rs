//! Object and container events for the controller's directory, written to an inherited pipe
//! (`--events-fd`) as a stream of msgpack arrays that `cdi/minion/launcher.py` relays:
//! `["registered", cid, pid, uid]`, `["gone", cid]`, `["changed", key, size, owner,
//! generation, created_at]` (`created_at`: the object's creation, Unix seconds, kept across a
//! restart), `["removed", key]`, `["arrived", key, recovery]` (an object received from another
//! host by the gateway in the minion, `gateway.rs`), and, first of all from a minion with a state folder,
//! `["store", store, restarts, kept_objects]` (`docs/minion-restart.md`: its store's id, how
//! many minions took the store over from another, the objects this one found again).
//!
//! The loop never waits for the reader: events collect in an outbox that is written after each
//! epoll batch (after the replies, which are what clients wait for), EPOLLOUT is watched while
//! bytes are pending, and a reader that is gone only costs the events.

use std::os::fd::RawFd;

use crate::log;
use crate::msgpack::Enc;
use crate::sys;

/// Beyond this many pending bytes the reader is hopelessly behind: drop events, not memory.
const MAX_PENDING: usize = 64 << 20;

pub struct EventSink {
    fd: RawFd,
    outbox: Vec<u8>,
    written: usize,
    broken: bool,
    overflowing: bool,
}

impl EventSink {
    /// Take over `fd`, making it non-blocking; the error names what is wrong with it.
    pub fn open(fd: RawFd) -> Result<EventSink, String> {
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
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    pub fn registered(&mut self, container: &str, pid: i32, uid: u32) {
        if let Some(mut enc) = self.event(4) {
            enc.str("registered");
            enc.str(container);
            enc.int(pid as i128);
            enc.uint(uid as u64);
        }
    }

    pub fn store(&mut self, store: &str, restarts: u64, kept_objects: u64) {
        if let Some(mut enc) = self.event(4) {
            enc.str("store");
            enc.str(store);
            enc.uint(restarts);
            enc.uint(kept_objects);
        }
    }

    pub fn gone(&mut self, container: &str) {
        if let Some(mut enc) = self.event(2) {
            enc.str("gone");
            enc.str(container);
        }
    }

    pub fn changed(&mut self, key: &str, size: u64, owner: &str, generation: u64, created_at: f64) {
        if let Some(mut enc) = self.event(6) {
            enc.str("changed");
            enc.str(key);
            enc.uint(size);
            enc.str(owner);
            enc.uint(generation);
            enc.float(created_at);
        }
    }

    /// An object received from another host was handed to its owner here; `recovery`: the
    /// recovery container it had there (the gateway beside us sends it back there if its
    /// owner here dies), empty if none.
    pub fn arrived(&mut self, key: &str, recovery: &str) {
        if let Some(mut enc) = self.event(3) {
            enc.str("arrived");
            enc.str(key);
            enc.str(recovery);
        }
    }

    pub fn removed(&mut self, key: &str) {
        if let Some(mut enc) = self.event(2) {
            enc.str("removed");
            enc.str(key);
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

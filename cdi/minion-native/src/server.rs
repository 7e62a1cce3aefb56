//! The minion's loop: accepts containers, reads requests, sends replies and fds.
//!
//! One thread, one epoll loop: every operation runs to completion before the next starts,
//! which is what makes `transfer` atomic and two racing transfers of one object impossible to
//! both succeed. The operations are in `ops.rs`, the state they change in `registry.rs`, the
//! reply encoding in `replies.rs`; the protocol is `cdi/PROTOCOL.md`. Who is calling is known
//! from the socket (SO_PEERCRED), never from the message; memory is handed out only as an fd
//! over SCM_RIGHTS and only to the current owner.
//!
//! When a send fails (the peer is gone, or does not read its replies), the connection is
//! marked doomed, gets nothing more, and is closed (its objects recovered) as soon as the
//! request in hand is answered, so no operation ever runs inside another.

use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::args::Config;
use crate::events::EventSink;
use crate::log;
use crate::msgpack::{unpack, Value};
use crate::objects::{ByRequest, Connection, RequestId};
use crate::ops::dispatch;
use crate::protocol::{CdiError, Failure, MAX_MESSAGE};
use crate::registry::{Entries, Registry};
use crate::replies::{encode, Body};
use crate::sys;

/// Set by SIGTERM/SIGINT; the handler also writes to the wake pipe so epoll_wait returns.
pub static STOP: AtomicBool = AtomicBool::new(false);
pub static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

// epoll tokens; connections count up from FIRST_CONNECTION and are never reused, so an event
// for a connection closed earlier in the same batch finds nothing instead of a newcomer.
const LISTENER: u64 = 0;
const WAKE: u64 = 1;
const EVENTS: u64 = 2;
const FIRST_CONNECTION: u64 = 16;
const MAX_EVENTS: usize = 256;

pub struct Minion {
    registry: Registry,
    next_connection: u64,
    doomed: Vec<u64>,
    epoll: RawFd,
    listener: RawFd,
    wake: (RawFd, RawFd),
    spare_fd: RawFd,
    events_watched: bool,
    out: Vec<u8>,
}

impl Minion {
    pub fn new(config: Config, events: Option<EventSink>) -> Result<Minion, String> {
        // SAFETY: plain syscalls; results are checked.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        let mut pipe = [-1; 2];
        let piped = unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if epoll < 0 || piped != 0 {
            return Err(format!(
                "cannot set up the event loop: {}",
                sys::last_os_error_text()
            ));
        }
        WAKE_FD.store(pipe[1], Ordering::SeqCst);
        Ok(Minion {
            registry: Registry::new(config, events),
            next_connection: FIRST_CONNECTION,
            doomed: Vec::new(),
            epoll,
            listener: -1,
            wake: (pipe[0], pipe[1]),
            spare_fd: open_spare(),
            events_watched: false,
            out: Vec::with_capacity(4096),
        })
    }

    // ------------------------------------------------------------------ lifecycle
    /// Create the socket (replacing a stale one), listen, prewarm. On error the socket file,
    /// if this call created it, is removed again.
    pub fn bind(&mut self) -> Result<(), String> {
        let path = self.registry.config.socket_path.clone();
        let shown = path.display();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        let raw = path.as_os_str().as_bytes();
        let (addr, len) = sys::unix_address(raw)
            .ok_or_else(|| format!("socket path {shown} is longer than Unix sockets allow"))?;
        if path.exists() {
            let probe =
                sys::seqpacket_socket().map_err(|e| format!("cannot probe {shown}: {e}"))?;
            // SAFETY: addr/len describe a valid sockaddr_un.
            let answered =
                unsafe { libc::connect(probe, (&addr as *const libc::sockaddr_un).cast(), len) }
                    == 0;
            sys::close(probe);
            if answered {
                return Err(format!("another minion is already listening on {shown}"));
            }
            // A stale socket left by a minion that died.
            std::fs::remove_file(&path).map_err(|e| format!("cannot remove {shown}: {e}"))?;
        }
        let listener =
            sys::seqpacket_socket().map_err(|e| format!("cannot listen on {shown}: {e}"))?;
        self.listener = listener;
        // SAFETY: addr/len describe a valid sockaddr_un; listener is our socket.
        if unsafe { libc::bind(listener, (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
            return Err(format!(
                "cannot listen on {shown}: {}",
                sys::last_os_error_text()
            ));
        }
        let started = (|| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(self.registry.config.socket_mode),
            )
            .map_err(|e| format!("cannot chmod {shown}: {e}"))?;
            // SAFETY: listener is a bound socket; O_NONBLOCK takes plain flags.
            unsafe {
                if libc::listen(listener, 256) != 0 {
                    return Err(format!(
                        "cannot listen on {shown}: {}",
                        sys::last_os_error_text()
                    ));
                }
                let flags = libc::fcntl(listener, libc::F_GETFL);
                libc::fcntl(listener, libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
            for (size, count) in self.registry.config.prewarm.clone() {
                self.registry
                    .pool
                    .prewarm(size, count)
                    .map_err(|f| match f {
                        Failure::Cdi(e) => {
                            format!("cannot prewarm {count} segments of {size} bytes: {}", e.msg)
                        }
                        Failure::Internal(m) => {
                            format!("cannot prewarm {count} segments of {size} bytes: {m}")
                        }
                    })?;
            }
            self.watch(listener, LISTENER, libc::EPOLLIN)?;
            self.watch(self.wake.0, WAKE, libc::EPOLLIN)
        })();
        if let Err(err) = started {
            let _ = std::fs::remove_file(&path);
            return Err(err);
        }
        log::info(format_args!(
            "minion for host {} listening on {shown}",
            self.registry.config.host
        ));
        Ok(())
    }

    fn watch(&self, fd: RawFd, token: u64, events: libc::c_int) -> Result<(), String> {
        let mut event = libc::epoll_event {
            events: events as u32,
            u64: token,
        };
        // SAFETY: event is a valid epoll_event; fd is open.
        if unsafe { libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_ADD, fd, &mut event) } != 0 {
            return Err(format!("epoll_ctl: {}", sys::last_os_error_text()));
        }
        Ok(())
    }

    fn unwatch(&self, fd: RawFd) {
        // SAFETY: removing an fd from our epoll set; a null event is allowed since 2.6.9.
        unsafe { libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }

    pub fn serve_forever(&mut self) {
        let mut buffer = vec![0u8; MAX_MESSAGE]; // reused for every request
        let mut ready = vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS];
        while !STOP.load(Ordering::Relaxed) {
            // While a container waits in access(), poll instead of sleeping for a short
            // budget: waking a sleeping process costs ~40 us on a VM, the hand-off ~10.
            let spinning =
                !self.registry.waiters.is_empty() && sys::monotonic_ns() < self.registry.spin_until;
            // SAFETY: ready holds MAX_EVENTS entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll,
                    ready.as_mut_ptr(),
                    MAX_EVENTS as libc::c_int,
                    if spinning { 0 } else { -1 },
                )
            };
            if n < 0 {
                if sys::errno() == libc::EINTR {
                    continue;
                }
                log::error(format_args!(
                    "epoll_wait failed: {}",
                    sys::last_os_error_text()
                ));
                break;
            }
            if n == 0 {
                sys::sched_yield(); // polling: let a runnable container on this core go first
            }
            for event in &ready[..n as usize] {
                match event.u64 {
                    LISTENER => self.accept(),
                    WAKE => self.drain_wake_pipe(),
                    EVENTS => {} // flushed below
                    token => self.on_readable(token, &mut buffer),
                }
            }
            self.flush_events();
        }
        self.shutdown();
    }

    fn drain_wake_pipe(&self) {
        let mut sink = [0u8; 64];
        // SAFETY: sink is a valid buffer; the pipe is non-blocking.
        while unsafe { libc::read(self.wake.0, sink.as_mut_ptr().cast(), sink.len()) } > 0 {}
    }

    /// Close the containers' connections without reclaiming (the objects die with us), free
    /// every segment, remove the socket.
    fn shutdown(&mut self) {
        for token in self.registry.registered_tokens() {
            self.close(token, false);
        }
        self.registry.objects.clear(); // dropping a segment unmaps and closes it
        self.registry.pool.close();
        if self.listener >= 0 {
            self.unwatch(self.listener);
            sys::close(self.listener);
            self.listener = -1;
            let _ = std::fs::remove_file(&self.registry.config.socket_path);
        }
        if let Some(sink) = self.registry.events.as_mut() {
            sink.drain(1000);
        }
        self.registry.events = None;
        log::info(format_args!("minion stopped"));
    }

    // ------------------------------------------------------------------ I/O
    fn accept(&mut self) {
        // SAFETY: accept4 with null address pointers.
        let fd = unsafe {
            libc::accept4(
                self.listener,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            let code = sys::errno();
            if matches!(code, libc::EMFILE | libc::ENFILE) {
                self.shed_connection(code);
            } else if !matches!(code, libc::EAGAIN | libc::EINTR | libc::ECONNABORTED) {
                log::warning(format_args!("accept failed: {}", sys::os_error_text(code)));
            }
            return;
        }
        let Some((pid, uid, gid)) = sys::peer_credentials(fd) else {
            sys::close(fd);
            return;
        };
        let token = self.next_connection;
        self.next_connection += 1;
        if self.watch(fd, token, libc::EPOLLIN).is_err() {
            sys::close(fd);
            return;
        }
        self.registry.conns.insert(
            token,
            Connection {
                fd,
                pid,
                uid,
                gid,
                container: None,
                registered: 0,
                waiting: ByRequest::default(),
                have: ByRequest::default(),
                doomed: false,
            },
        );
    }

    /// Out of fds: accept the waiting connection with a spare fd and close it at once, so the
    /// client hears about it and the listener stops reporting readable.
    fn shed_connection(&mut self, code: i32) {
        log::warning(format_args!(
            "refusing a connection: {} (one fd per connection and per segment)",
            sys::os_error_text(code)
        ));
        if self.spare_fd >= 0 {
            sys::close(self.spare_fd);
            // SAFETY: as in accept.
            let fd = unsafe {
                libc::accept4(
                    self.listener,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd >= 0 {
                sys::close(fd);
            }
            self.spare_fd = open_spare();
        }
    }

    fn on_readable(&mut self, token: u64, buffer: &mut [u8]) {
        let Some(conn) = self.registry.conns.get(&token) else {
            return;
        };
        let flags = libc::MSG_TRUNC | libc::MSG_DONTWAIT; // MSG_TRUNC: the real length
                                                          // SAFETY: buffer is valid for its length.
        let n = unsafe { libc::recv(conn.fd, buffer.as_mut_ptr().cast(), buffer.len(), flags) };
        if n < 0 && matches!(sys::errno(), libc::EAGAIN | libc::EINTR) {
            return;
        }
        if n <= 0 {
            // The peer hung up (or the socket failed): its objects go to their recovery.
            self.close(token, true);
            self.flush_outbox();
        } else if n as usize > buffer.len() {
            let err = CdiError::protocol(format!("message larger than {} bytes", buffer.len()));
            self.send(token, 0, &Body::Error(err), None);
        } else {
            match unpack(&buffer[..n as usize]) {
                Ok(Value::Map(entries)) => self.serve(token, &entries),
                Ok(_) => {
                    let err = CdiError::protocol("a message must be a map");
                    self.send(token, 0, &Body::Error(err), None);
                }
                Err(text) => {
                    let err = CdiError::protocol(format!("undecodable message: {text}"));
                    self.send(token, 0, &Body::Error(err), None);
                }
            }
        }
        self.settle();
    }

    /// One decoded request: check its id, run the operation, send what it owes waiting
    /// containers, then its reply.
    fn serve(&mut self, token: u64, request: Entries) {
        let id = match Value::field(request, "id") {
            None => 0,
            Some(Value::Int(i)) => i.get(),
            Some(_) => {
                let err = CdiError::protocol("request id must be an integer");
                return self.send(token, 0, &Body::Error(err), None);
            }
        };
        let registry = &mut self.registry;
        let outcome = catch_unwind(AssertUnwindSafe(|| dispatch(registry, token, id, request)));
        let reply = match outcome {
            Ok(Ok(reply)) => reply,
            Ok(Err(Failure::Cdi(err))) => Some((Body::Error(err), None)),
            Ok(Err(Failure::Internal(text))) => Some(self.internal_error(token, &text)),
            Err(panic) => {
                let text = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".to_owned());
                Some(self.internal_error(token, &text))
            }
        };
        self.flush_outbox(); // first: a new owner waits for its grant; the caller's ack can follow
        if let Some((body, fd)) = reply {
            self.send(token, id, &body, fd);
        }
    }

    /// Send what the registry owes waiting containers (grants, refusals); after a grant, yield
    /// the core once: if the new owner runs on this core (polling, or just woken by the grant),
    /// it takes the object now rather than after our ack and epoll round (p50 ~138 -> ~105 us
    /// in alternating bench runs; the sender's ack waits those microseconds instead).
    fn flush_outbox(&mut self) {
        let mut granted = false;
        while !self.registry.outbox.is_empty() {
            for (token, id, body, fd) in std::mem::take(&mut self.registry.outbox) {
                granted |= !matches!(body, Body::Error(_));
                self.send(token, id, &body, fd);
            }
        }
        if granted {
            sys::sched_yield();
        }
    }

    /// A bug must not take the whole host's objects down: log it, tell the caller.
    fn internal_error(&self, token: u64, text: &str) -> (Body, Option<RawFd>) {
        let pid = self.registry.conns.get(&token).map_or(0, |c| c.pid);
        log::error(format_args!(
            "minion failed on a request from pid {pid}: {text}"
        ));
        let err = CdiError {
            code: "cdi_error",
            msg: format!("internal minion error: {text}"),
        };
        (Body::Error(err), None)
    }

    fn send(&mut self, token: u64, id: RequestId, body: &Body, fd: Option<RawFd>) {
        let Some(conn) = self.registry.conns.get(&token) else {
            return;
        };
        if conn.doomed {
            return;
        }
        let (sock, pid) = (conn.fd, conn.pid);
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        encode(&mut out, &self.registry, body, id);
        let sent = sys::send_message(sock, &out, fd);
        self.out = out;
        if let Err(code) = sent {
            // A client that does not read its replies (or is gone) loses its connection.
            if !matches!(code, libc::EPIPE | libc::ECONNRESET | libc::EAGAIN) {
                log::warning(format_args!(
                    "dropping pid {pid}: {}",
                    sys::os_error_text(code)
                ));
            }
            if let Some(conn) = self.registry.conns.get_mut(&token) {
                conn.doomed = true;
                self.doomed.push(token);
            }
        }
    }

    /// Close the connections whose sends failed, recovering their objects (which may grant
    /// them to waiting containers, and doom more); runs after each request, once its reply is
    /// out.
    fn settle(&mut self) {
        let mut next = 0;
        while next < self.doomed.len() {
            let token = self.doomed[next];
            next += 1;
            self.close(token, true);
            self.flush_outbox();
        }
        self.doomed.clear();
    }

    /// Stop watching and close a connection; the registry forgets it (recovering its objects
    /// if `reclaim`).
    fn close(&mut self, token: u64, reclaim: bool) {
        let Some(fd) = self.registry.conns.get(&token).map(|c| c.fd) else {
            return;
        };
        self.unwatch(fd);
        sys::close(fd);
        self.registry.disconnect(token, reclaim);
    }

    fn flush_events(&mut self) {
        let Some(sink) = self.registry.events.as_mut() else {
            return;
        };
        sink.flush();
        let (fd, want) = (sink.fd(), sink.pending() && !sink.is_broken());
        if want != self.events_watched {
            self.events_watched = want;
            if want {
                let _ = self.watch(fd, EVENTS, libc::EPOLLOUT);
            } else {
                self.unwatch(fd);
            }
        }
    }
}

/// An fd kept open to give up when the process runs out of them (see `shed_connection`).
fn open_spare() -> RawFd {
    // SAFETY: a NUL-terminated literal path.
    unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) }
}

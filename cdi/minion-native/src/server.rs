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
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::args::Config;
use crate::epoll::Epoll;
use crate::events::EventSink;
use crate::gateway::{Gateway, GatewayConfig, LINK};
use crate::listener::{Accepted, Listener};
use crate::log;
use crate::objects::{ByRequest, Connection, RequestId};
use crate::ops::answer;
use crate::protocol::{CdiError, Failure, MAX_MESSAGE};
use crate::registry::Registry;
use crate::replies::{encode, Body};
use crate::sys;

/// Set by SIGTERM/SIGINT; the handler also writes to the wake pipe so epoll_wait returns.
pub static STOP: AtomicBool = AtomicBool::new(false);
/// Set by SIGUSR2 (with STOP): stop keeping the objects, segment files and journal for the
/// next minion of the state folder, as if the process had been killed.
pub static KEEP: AtomicBool = AtomicBool::new(false);
/// Set by SIGUSR1 (the launcher's death, with a state folder): serve on until a successor
/// asks to take over (SIGUSR2), for `--successor-wait-ms` at most, then stop keeping.
pub static ORPHANED: AtomicBool = AtomicBool::new(false);
pub static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

// epoll tokens; connections count up from FIRST_CONNECTION and are never reused, so an event
// for a connection closed earlier in the same batch finds nothing instead of a newcomer.
const LISTENER: u64 = 0;
const WAKE: u64 = 1;
const EVENTS: u64 = 2;
const GATEWAY: u64 = 3;
/// The gateway beside us answering the sender's questions for routes.
const ROUTES: u64 = 4;
const FIRST_CONNECTION: u64 = 16;
/// Marks the token of a registered process's pidfd: its connection's token with this bit set.
const PROCESS: u64 = 1 << 62;
const MAX_EVENTS: usize = 256;

pub struct Minion {
    registry: Registry,
    next_connection: u64,
    doomed: Vec<u64>,
    epoll: Epoll,
    listener: Option<Listener>,
    wake: (RawFd, RawFd),
    events_watched: bool,
    out: Vec<u8>,
    /// After a restart: when to settle the containers that have not come back.
    resume_at: Option<u64>,
    /// With its launcher gone: when to stop if no successor has asked to take over.
    orphaned_until: Option<u64>,
    /// The receiving side of the gateway between hosts, when the launcher hands one over.
    gateway: Option<Gateway>,
}

impl Minion {
    pub fn new(config: Config, events: Option<EventSink>) -> Result<Minion, String> {
        let epoll = Epoll::new()?;
        let mut pipe = [-1; 2];
        // SAFETY: a plain system call; the result is checked.
        let piped = unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if piped != 0 {
            return Err(format!(
                "cannot set up the event loop: {}",
                sys::last_os_error_text()
            ));
        }
        WAKE_FD.store(pipe[1], Ordering::SeqCst);
        let gateway = match (config.gateway_fd, config.gateway_key_fd) {
            (Some(listen_fd), Some(key_fd)) => {
                let key = crate::gateway::read_key(key_fd)?;
                // SAFETY: fcntl on an inherited fd; a bad one fails accept4 later, logged.
                unsafe {
                    let flags = libc::fcntl(listen_fd, libc::F_GETFL);
                    libc::fcntl(listen_fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
                    libc::fcntl(listen_fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
                let gateway = GatewayConfig {
                    listen_fd,
                    key,
                    channels_fd: config.gateway_channels_fd,
                    timeout_ns: config.link_timeout_ms.saturating_mul(1_000_000),
                    sends: config.gateway_sends,
                };
                Some(Gateway::new(gateway, &config.host))
            }
            _ => None,
        };
        let mut registry = Registry::new(config, events);
        if gateway.as_ref().is_some_and(|g| g.sender.is_some()) {
            registry.holder = Some(crate::sending::holder_of(&registry.config.host));
        }
        Ok(Minion {
            registry,
            next_connection: FIRST_CONNECTION,
            doomed: Vec::new(),
            epoll,
            listener: None,
            wake: (pipe[0], pipe[1]),
            events_watched: false,
            out: Vec::with_capacity(4096),
            resume_at: None,
            orphaned_until: None,
            gateway,
        })
    }

    // ------------------------------------------------------------------ lifecycle
    /// Listen, prewarm, watch. On error the socket file, if this call created it, is removed.
    pub fn bind(&mut self) -> Result<(), String> {
        if let Some(dir) = self.registry.config.state_dir.clone() {
            crate::resume::open(&mut self.registry, &dir)?;
            let tokens: Vec<(std::rc::Rc<str>, RawFd)> = self
                .registry
                .expected
                .iter()
                .filter_map(|(cid, e)| e.pidfd.map(|fd| (cid.clone(), fd)))
                .collect();
            for (cid, pidfd) in tokens {
                let token = self.next_connection;
                self.next_connection += 1;
                if let Some(expected) = self.registry.expected.get_mut(&cid) {
                    expected.token = token;
                }
                self.epoll.watch(pidfd, token | PROCESS, libc::EPOLLIN)?;
            }
            self.resume_at = Some(0); // settles on the first turn of the loop
        }
        let config = &self.registry.config;
        let listener =
            Listener::bind(&config.socket_path, config.socket_mode, config.socket_group)?;
        let started = (|| {
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
            self.epoll.watch(listener.fd, LISTENER, libc::EPOLLIN)?;
            if let Some(gateway) = &self.gateway {
                self.epoll
                    .watch(gateway.listen_fd(), GATEWAY, libc::EPOLLIN)?;
                if let Some(sender) = &gateway.sender {
                    self.epoll
                        .watch(sender.routes_fd(), ROUTES, libc::EPOLLIN)?;
                }
            }
            self.epoll.watch(self.wake.0, WAKE, libc::EPOLLIN)
        })();
        if let Err(err) = started {
            listener.close();
            return Err(err);
        }
        self.listener = Some(listener);
        log::info(format_args!(
            "minion for host {} listening on {}",
            self.registry.config.host,
            self.registry.config.socket_path.display()
        ));
        Ok(())
    }

    /// Serve until stopped; true if it stopped for a restart, keeping the objects.
    pub fn serve_forever(&mut self) -> bool {
        let mut buffer = vec![0u8; MAX_MESSAGE]; // reused for every request
        let mut ready = vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS];
        while !STOP.load(Ordering::Relaxed) {
            // While a container waits in access(), poll instead of sleeping for a short
            // budget: waking a sleeping process costs ~40 us on a VM, the hand-off ~10.
            let spinning =
                !self.registry.waiters.is_empty() && sys::monotonic_ns() < self.registry.spin_until;
            self.check_orphaned();
            let wake_at = [
                self.resume_at,
                self.orphaned_until,
                self.registry.next_arrival_deadline(),
                self.gateway.as_ref().and_then(Gateway::next_deadline),
                self.registry.events.as_ref().and_then(EventSink::due_at),
            ]
            .into_iter()
            .flatten()
            .min();
            let timeout = if spinning {
                0
            } else {
                match wake_at {
                    Some(at) => (at.saturating_sub(sys::monotonic_ns()) / 1_000_000 + 1) as i32,
                    None => -1,
                }
            };
            let n = self.epoll.wait(&mut ready, timeout);
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
                let token = event.u64; // a copy: epoll_event is packed
                match token {
                    LISTENER => self.accept(),
                    WAKE => self.drain_wake_pipe(),
                    EVENTS => {} // flushed below
                    GATEWAY => {
                        if let Some(gateway) = self.gateway.as_mut() {
                            gateway.accept(&self.epoll);
                        }
                    }
                    ROUTES => self.on_routes(),
                    token if token & LINK != 0 && token & PROCESS == 0 => self.on_link(token),
                    token if token & PROCESS != 0 => self.on_exit(token & !PROCESS),
                    token => self.on_readable(token, &mut buffer),
                }
            }
            self.settle_resume();
            if let Some(gateway) = self.gateway.as_mut() {
                gateway.tick(&mut self.registry, &self.epoll);
            }
            self.registry.expire_arrivals();
            self.flush_outbox();
            self.flush_links();
            self.settle();
            self.registry.persist();
            self.flush_events();
        }
        if KEEP.load(Ordering::SeqCst) && self.registry.journal.is_some() {
            self.registry.persist();
            if let Some(sink) = self.registry.events.as_mut() {
                sink.drain(1000); // what lingers too: the next minion tells only what it keeps
            }
            log::info(format_args!(
                "minion stopped, keeping its objects for the next one"
            ));
            return true;
        }
        self.shutdown();
        false
    }

    /// The launcher is gone (SIGUSR1): serve on for a while, so that the clients lose
    /// nothing until a successor asks to take over; then stop, keeping the objects.
    fn check_orphaned(&mut self) {
        if !ORPHANED.load(Ordering::Relaxed) || self.registry.journal.is_none() {
            return;
        }
        let now = sys::monotonic_ns();
        match self.orphaned_until {
            None => {
                let wait = self.registry.config.successor_wait_ms;
                log::info(format_args!(
                    "the minion's launcher is gone; serving until a successor takes over \
                     (at most {wait} ms)"
                ));
                self.orphaned_until = Some(now.saturating_add(wait.saturating_mul(1_000_000)));
            }
            Some(until) if now >= until => {
                KEEP.store(true, Ordering::SeqCst);
                STOP.store(true, Ordering::SeqCst);
            }
            Some(_) => {}
        }
    }

    /// After a restart: recover the objects of containers that ended meanwhile, once the
    /// others had their grace to come back.
    fn settle_resume(&mut self) {
        if self.registry.pending_gone.is_empty() && self.resume_at.is_none() {
            return;
        }
        self.resume_at = crate::resume::settle(&mut self.registry);
        self.flush_outbox();
        self.settle();
    }

    /// A gateway link has bytes: frames, payload. A commit grants a waiting owner first.
    fn on_link(&mut self, token: u64) {
        let Some(gateway) = self.gateway.as_mut() else {
            return;
        };
        gateway.on_readable(&mut self.registry, &self.epoll, token);
        self.flush_outbox();
        self.flush_links();
        self.settle();
    }

    /// Transfers to other hosts the request in hand started: the minion sends them itself.
    fn depart(&mut self) {
        if self.registry.departures.is_empty() {
            return;
        }
        let Some(sender) = self.gateway.as_mut().and_then(|g| g.sender.as_mut()) else {
            return;
        };
        for departure in std::mem::take(&mut self.registry.departures) {
            sender.depart(&mut self.registry, &self.epoll, departure);
        }
    }

    /// The gateway beside us answered where containers live: those transfers go on.
    fn on_routes(&mut self) {
        if let Some(sender) = self.gateway.as_mut().and_then(|g| g.sender.as_mut()) {
            sender.on_routes(&mut self.registry, &self.epoll);
        }
        self.flush_outbox();
        self.settle();
    }

    fn flush_links(&mut self) {
        if let Some(gateway) = self.gateway.as_mut() {
            gateway.flush(&mut self.registry, &self.epoll);
        }
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
        if let Some(mut gateway) = self.gateway.take() {
            gateway.shutdown(&mut self.registry, &self.epoll);
        }
        self.registry.objects.clear(); // dropping a segment unmaps and closes it
        self.registry.pool.close();
        if let Some(listener) = self.listener.take() {
            self.epoll.unwatch(listener.fd);
            listener.close();
        }
        if let Some(journal) = self.registry.journal.take() {
            // A stop for good: the objects are gone, and so is what described them.
            let _ = std::fs::remove_file(journal.path());
        }
        if let Some(dir) = self.registry.pool.dir.as_ref() {
            // Whether or not the journal could be kept: nothing in it outlives this stop.
            let _ = std::fs::remove_dir_all(dir);
            if let Some(state_dir) = self.registry.config.state_dir.as_ref() {
                let _ = std::fs::remove_file(state_dir.join(crate::resume::SEGMENTS_FILE));
            }
        }
        if let Some(sink) = self.registry.events.as_mut() {
            sink.drain(1000);
        }
        self.registry.events = None;
        log::info(format_args!("minion stopped"));
    }

    // ------------------------------------------------------------------ I/O
    fn accept(&mut self) {
        let Some(accepted) = self.listener.as_mut().and_then(Listener::accept) else {
            return;
        };
        let Accepted { fd, pid, uid, gid } = accepted;
        let token = self.next_connection;
        self.next_connection += 1;
        if self.epoll.watch(fd, token, libc::EPOLLIN).is_err() {
            sys::close(fd);
            return;
        }
        self.registry.conns.insert(
            token,
            Connection {
                fd,
                pid,
                start: 0,
                uid,
                gid,
                container: None,
                registered: 0,
                resume: String::new(),
                pidfd: None,
                waiting: ByRequest::default(),
                have: ByRequest::default(),
                doomed: false,
            },
        );
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
            let (id, reply) = answer(&mut self.registry, token, &buffer[..n as usize]);
            for token in std::mem::take(&mut self.registry.registered_now) {
                self.watch_process(token);
            }
            self.depart();
            self.flush_outbox(); // first: a new owner waits for its grant; the ack can follow
            if let Some((body, fd)) = reply {
                self.send(token, id, &body, fd);
            }
        }
        self.settle();
    }

    /// Send what the registry owes waiting containers (grants, refusals); after a grant, yield
    /// the core once: if the new owner runs on this core (polling, or just woken by the grant),
    /// it takes the object now rather than after our ack and epoll round (the sender's ack
    /// waits instead; docs/decisions/2026-12-05-cdi-hand-off-latency.md).
    fn flush_outbox(&mut self) {
        self.registry.persist(); // the journal first: what a grant tells has been recorded
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

    fn send(&mut self, token: u64, id: RequestId, body: &Body, fd: Option<RawFd>) {
        let Some(conn) = self.registry.conns.get(&token) else {
            return;
        };
        if conn.doomed {
            return;
        }
        let (sock, pid) = (conn.fd, conn.pid);
        self.registry.persist(); // the journal first: what a reply tells has been recorded
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        encode(&mut out, &self.registry, token, body, id);
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
        let Some((fd, pidfd)) = self.registry.conns.get(&token).map(|c| (c.fd, c.pidfd)) else {
            return;
        };
        self.epoll.unwatch(fd);
        sys::close(fd);
        if let Some(pidfd) = pidfd {
            self.epoll.unwatch(pidfd);
            sys::close(pidfd);
        }
        self.registry.disconnect(token, reclaim);
    }

    /// Watch the registered process itself (a pidfd), not only its socket: an owner that
    /// forked a child without exec and died has its objects recovered at once, although the
    /// child still holds the socket. The pidfd comes from the socket (SO_PEERPIDFD: the
    /// connecting process, with no pid reuse race), else from its pid; with neither (a peer in
    /// another pid namespace has pid 0), the socket's closing is what tells.
    fn watch_process(&mut self, token: u64) {
        let Some(conn) = self.registry.conns.get(&token) else {
            return;
        };
        let (sock, pid) = (conn.fd, conn.pid);
        let Some(pidfd) = sys::peer_pidfd(sock, pid) else {
            log::info(format_args!(
                "pid {pid}: no pidfd; its socket tells when it goes"
            ));
            return;
        };
        if self
            .epoll
            .watch(pidfd, token | PROCESS, libc::EPOLLIN)
            .is_err()
        {
            sys::close(pidfd);
            return;
        }
        if let Some(conn) = self.registry.conns.get_mut(&token) {
            conn.pidfd = Some(pidfd);
        }
    }

    /// The registered process exited: its connection closes, its objects are recovered.
    fn on_exit(&mut self, token: u64) {
        if !self.registry.conns.contains_key(&token) {
            if crate::resume::exited(&mut self.registry, token) {
                self.resume_at = Some(0); // settle now (or set the deadline)
                self.settle_resume();
            }
            return;
        }
        if let Some(conn) = self.registry.conns.get(&token) {
            log::info(format_args!("process {} exited", conn.pid));
        }
        self.close(token, true);
        self.flush_outbox();
        self.settle();
    }

    fn flush_events(&mut self) {
        let Some(sink) = self.registry.events.as_mut() else {
            return;
        };
        sink.tick();
        sink.flush();
        let (fd, want) = (sink.fd(), sink.pending() && !sink.is_broken());
        if want != self.events_watched {
            self.events_watched = want;
            if want {
                let _ = self.epoll.watch(fd, EVENTS, libc::EPOLLOUT);
            } else {
                self.epoll.unwatch(fd);
            }
        }
    }
}

//! The per-host minion (`cdi/minion/server.py`): holds every object's memory and enforces
//! single ownership.
//!
//! One thread, one epoll loop: every operation runs to completion before the next starts,
//! which is what makes `transfer` atomic and two racing transfers of one object impossible to
//! both succeed. Who is calling is known from the socket (SO_PEERCRED), never from the
//! message; memory is handed out only as an fd over SCM_RIGHTS and only to the current owner.
//!
//! One structural difference from the Python loop: when a send fails (the peer is gone, or
//! does not read its replies), Python closes that connection on the spot, in the middle of
//! whatever operation was sending, and recovers its objects there. Here the connection is
//! marked doomed, gets nothing more, and is closed (with the same recovery) as soon as the
//! request in hand is answered, so no operation ever runs inside another.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::args::Config;
use crate::events::EventSink;
use crate::log;
use crate::msgpack::{unpack, Enc, Value, NIL};
use crate::objects::{ByRequest, Connection, RequestId, StoredObject};
use crate::protocol::{
    check_container_id, check_key, check_segment_ids, check_size, CdiError, Failure, Isolation, Op,
    MAX_MESSAGE,
};
use crate::pyrepr::{repr, repr_str, truthy};
use crate::segments::{SegmentPool, UidSet};
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

type Entries<'v, 'a> = &'v [(Value<'a>, Value<'a>)];

/// What a handler answers: a body and at most one fd; `None` defers the reply (`access`).
type Reply = Option<(Body, Option<RawFd>)>;

/// Reply bodies, encoded with their keys in the Python minion's order.
enum Body {
    Grant {
        size: u64,
        capacity: u64,
        generation: u64,
        isolation: Isolation,
        segment: u64,
    },
    Registered,
    Use {
        size: u64,
        owner: Rc<str>,
        isolation: Isolation,
    },
    Cancelled(bool),
    Generation(u64),
    Empty,
    Recovery(Rc<str>),
    Stat,
    List,
    Error(CdiError),
}

/// The id a reply carries: the request's, as it came (even a malformed one is echoed back).
#[derive(Clone, Copy)]
enum ReplyId<'v, 'a> {
    Id(RequestId),
    Raw(&'v Value<'a>),
}

const ZERO_ID: ReplyId<'static, 'static> = ReplyId::Id(RequestId::Int(0));

fn arg<'v, 'a>(request: Entries<'v, 'a>, name: &str) -> &'v Value<'a> {
    Value::get(request, name).unwrap_or(&NIL)
}

fn grant(obj: &StoredObject) -> Body {
    Body::Grant {
        size: obj.size,
        capacity: obj.segment.capacity,
        generation: obj.generation,
        isolation: obj.isolation,
        segment: obj.segment.id,
    }
}

/// Python's `repr()` of a request value; too deep to render is an internal error there too.
fn repr_of(value: &Value) -> Result<String, Failure> {
    repr(value).map_err(|e| Failure::Internal(e.to_owned()))
}

fn vanished() -> Failure {
    Failure::Internal("object vanished during the operation".to_owned())
}

pub struct Minion {
    config: Config,
    pool: SegmentPool,
    objects: HashMap<Rc<str>, StoredObject>,
    next_order: u64,
    containers: HashMap<Rc<str>, u64>,
    bound_uid: HashMap<Rc<str>, u32>,
    /// key -> (connection, request id) of deferred `access` requests. Lists emptied by a
    /// cancel stay until the next grant, as in Python (they keep the busy-poll going).
    waiters: HashMap<Rc<str>, Vec<(u64, RequestId)>>,
    conns: HashMap<u64, Connection>,
    next_connection: u64,
    next_registration: u64,
    doomed: Vec<u64>,
    epoll: RawFd,
    listener: RawFd,
    wake: (RawFd, RawFd),
    spare_fd: RawFd,
    spin_until: u64,
    events: Option<EventSink>,
    events_watched: bool,
    out: Vec<u8>,
    pid: u32,
}

impl Minion {
    pub fn new(config: Config, events: Option<EventSink>) -> Result<Minion, String> {
        let page = sys::page_size();
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
            pool: SegmentPool::new(config.memory_limit, config.idle_limit, page),
            config,
            objects: HashMap::new(),
            next_order: 0,
            containers: HashMap::new(),
            bound_uid: HashMap::new(),
            waiters: HashMap::new(),
            conns: HashMap::new(),
            next_connection: FIRST_CONNECTION,
            next_registration: 0,
            doomed: Vec::new(),
            epoll,
            listener: -1,
            wake: (pipe[0], pipe[1]),
            spare_fd: open_spare(),
            spin_until: 0,
            events,
            events_watched: false,
            out: Vec::with_capacity(4096),
            pid: std::process::id(),
        })
    }

    // ------------------------------------------------------------------ lifecycle
    /// Create the socket (replacing a stale one), listen, prewarm. On error the socket file,
    /// if this call created it, is removed again.
    pub fn bind(&mut self) -> Result<(), String> {
        let path = self.config.socket_path.clone();
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
                std::fs::Permissions::from_mode(self.config.socket_mode),
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
            for (size, count) in self.config.prewarm.clone() {
                self.pool.prewarm(size, count).map_err(|f| match f {
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
            self.config.host
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
            let spinning = !self.waiters.is_empty() && sys::monotonic_ns() < self.spin_until;
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
        let mut registered: Vec<(u64, u64)> = self
            .containers
            .values()
            .filter_map(|c| self.conns.get(c).map(|conn| (conn.registered, *c)))
            .collect();
        registered.sort_unstable();
        for (_, conn) in registered {
            let _ = self.close(conn, false);
        }
        self.objects.clear(); // dropping a segment unmaps and closes it
        self.pool.close();
        if self.listener >= 0 {
            self.unwatch(self.listener);
            sys::close(self.listener);
            self.listener = -1;
            let _ = std::fs::remove_file(&self.config.socket_path);
        }
        if let Some(sink) = self.events.as_mut() {
            sink.drain(1000);
        }
        self.events = None;
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
        self.conns.insert(
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
        let Some(conn) = self.conns.get(&token) else {
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
            self.close_and_recover(token);
        } else if n as usize > buffer.len() {
            let err = CdiError::protocol(format!("message larger than {} bytes", buffer.len()));
            self.send(token, ZERO_ID, &Body::Error(err), None);
        } else {
            match unpack(&buffer[..n as usize]) {
                Ok(Value::Map(entries)) => self.serve(token, &entries),
                Ok(_) => {
                    let err = CdiError::protocol("a message must be a map");
                    self.send(token, ZERO_ID, &Body::Error(err), None);
                }
                Err(text) => {
                    let err = CdiError::protocol(format!("undecodable message: {text}"));
                    self.send(token, ZERO_ID, &Body::Error(err), None);
                }
            }
        }
        self.settle();
    }

    /// One decoded request: check id, op and registration, run the handler, answer.
    fn serve(&mut self, token: u64, request: Entries) {
        let id = match Value::get(request, "id") {
            None => RequestId::Int(0),
            Some(Value::Int(i)) => RequestId::Int(i.get()),
            Some(Value::Bool(b)) => RequestId::Bool(*b),
            Some(other) => {
                let err = CdiError::protocol("request id must be an integer");
                return self.send(token, ReplyId::Raw(other), &Body::Error(err), None);
            }
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| self.dispatch(token, id, request)));
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
        if let Some((body, fd)) = reply {
            self.send(token, ReplyId::Id(id), &body, fd);
        }
    }

    /// A bug must not take the whole host's objects down: log it, tell the caller.
    fn internal_error(&self, token: u64, text: &str) -> (Body, Option<RawFd>) {
        let pid = self.conns.get(&token).map_or(0, |c| c.pid);
        log::error(format_args!(
            "minion failed on a request from pid {pid}: {text}"
        ));
        let err = CdiError {
            code: "cdi_error",
            msg: format!("internal minion error: {text}"),
        };
        (Body::Error(err), None)
    }

    fn dispatch(&mut self, token: u64, id: RequestId, request: Entries) -> Result<Reply, Failure> {
        let op = match Value::get(request, "op") {
            None => return Err(CdiError::protocol("unknown operation ''").into()),
            Some(Value::Str(name)) => Op::parse(name).ok_or_else(|| {
                CdiError::protocol(format!("unknown operation {}", repr_str(name)))
            })?,
            Some(other) => {
                return Err(
                    CdiError::protocol(format!("unknown operation {}", repr_of(other)?)).into(),
                )
            }
        };
        let registered = self
            .conns
            .get(&token)
            .is_some_and(|c| c.container.is_some());
        if !registered && !op.is_open() {
            return Err(
                CdiError::not_registered("register(container_id) before using objects").into(),
            );
        }
        match op {
            Op::Register => self.register(token, request),
            Op::Create => self.create(token, request),
            Op::Use => self.use_(request),
            Op::Copy => self.copy(token, request),
            Op::Access => self.access(token, id, request),
            Op::Cancel => self.cancel(token, request),
            Op::Transfer => self.transfer(token, request),
            Op::Resize => self.resize(token, request),
            Op::Destroy => self.destroy(token, request),
            Op::SetRecovery => self.set_recovery(token, request),
            Op::Stat => Ok(Some((Body::Stat, None))),
            Op::List => Ok(Some((Body::List, None))),
        }
    }

    fn send(&mut self, token: u64, id: ReplyId, body: &Body, fd: Option<RawFd>) {
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        if conn.doomed {
            return;
        }
        let (sock, pid) = (conn.fd, conn.pid);
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        self.encode(&mut out, body, id);
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
            if let Some(conn) = self.conns.get_mut(&token) {
                conn.doomed = true;
                self.doomed.push(token);
            }
        }
    }

    /// Close the connections whose sends failed, recovering their objects (which may doom
    /// more); runs after each request, once its reply is out.
    fn settle(&mut self) {
        let mut next = 0;
        while next < self.doomed.len() {
            let token = self.doomed[next];
            next += 1;
            self.close_and_recover(token);
        }
        self.doomed.clear();
    }

    fn close_and_recover(&mut self, token: u64) {
        if let Err(failure) = self.close(token, true) {
            let text = match failure {
                Failure::Cdi(e) => e.msg,
                Failure::Internal(text) => text,
            };
            log::warning(format_args!(
                "recovering the objects of a closed connection failed: {text}"
            ));
        }
    }

    fn close(&mut self, token: u64, reclaim: bool) -> Result<(), Failure> {
        let Some(mut conn) = self.conns.remove(&token) else {
            return Ok(());
        };
        self.unwatch(conn.fd);
        sys::close(conn.fd);
        for (id, key) in conn.waiting.take() {
            if let Some(waiters) = self.waiters.get_mut(&key) {
                if let Some(at) = waiters.iter().position(|&(t, i)| t == token && i == id) {
                    waiters.remove(at);
                }
            }
        }
        conn.have.clear();
        let Some(cid) = conn.container.take() else {
            return Ok(());
        };
        if self.containers.get(&cid) != Some(&token) {
            return Ok(());
        }
        self.containers.remove(&cid);
        if let Some(sink) = self.events.as_mut() {
            sink.gone(&cid);
        }
        if reclaim {
            self.recover_objects_of(&cid)?;
        }
        Ok(())
    }

    /// Objects of a dead owner go back to their recovery container, else are reclaimed.
    fn recover_objects_of(&mut self, dead: &Rc<str>) -> Result<(), Failure> {
        let mut theirs: Vec<(u64, Rc<str>)> = self
            .objects
            .values()
            .filter(|o| o.owner == *dead)
            .map(|o| (o.order, o.key.clone()))
            .collect();
        theirs.sort_unstable();
        for (_, key) in theirs {
            let Some(obj) = self.objects.get(&key) else {
                continue;
            };
            let recovery = self
                .containers
                .get_key_value(&obj.recovery)
                .map(|(k, _)| k.clone());
            match recovery {
                Some(recovery) if recovery != *dead => {
                    log::info(format_args!(
                        "owner {dead} of {key} died; returning it to {recovery}"
                    ));
                    // One object at a time: one that cannot move (a strict object needs a
                    // fresh segment, and memory may have run out) is reclaimed, and the rest
                    // are still recovered. set_owner fails only before the hand-over.
                    if let Err(failure) = self.set_owner(&key, recovery.clone()) {
                        let why = match failure {
                            Failure::Cdi(err) => err.msg,
                            Failure::Internal(msg) => msg,
                        };
                        log::warning(format_args!(
                            "cannot return {key} to {recovery} ({why}); reclaiming it"
                        ));
                        self.remove(&key);
                    }
                }
                _ => {
                    log::info(format_args!(
                        "owner {dead} of {key} died and nobody can recover it; reclaiming"
                    ));
                    self.remove(&key);
                }
            }
        }
        Ok(())
    }

    fn flush_events(&mut self) {
        let Some(sink) = self.events.as_mut() else {
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

    // ------------------------------------------------------------------ encoding
    fn encode(&self, out: &mut Vec<u8>, body: &Body, id: ReplyId) {
        let mut enc = Enc(out);
        if let Body::Error(err) = body {
            enc.map(4);
            enc.str("ok");
            enc.bool(false);
            enc.str("code");
            enc.str(err.code);
            enc.str("msg");
            enc.str(&err.msg);
            enc.str("id");
            encode_id(&mut enc, id);
            return;
        }
        let fields = match body {
            Body::Grant { .. } => 5,
            Body::Registered => 4,
            Body::Use { .. } => 3,
            Body::Stat => 11,
            Body::Empty => 0,
            _ => 1,
        };
        enc.map(fields + 2);
        match body {
            Body::Grant {
                size,
                capacity,
                generation,
                isolation,
                segment,
            } => {
                enc.str("size");
                enc.uint(*size);
                enc.str("capacity");
                enc.uint(*capacity);
                enc.str("generation");
                enc.uint(*generation);
                enc.str("isolation");
                enc.str(isolation.as_str());
                enc.str("segment");
                enc.uint(*segment);
            }
            Body::Registered => {
                enc.str("host");
                enc.str(&self.config.host);
                enc.str("minion_pid");
                enc.uint(self.pid as u64);
                enc.str("max_object");
                enc.uint(self.config.max_object);
                enc.str("isolation");
                enc.str(self.config.isolation.as_str());
            }
            Body::Use {
                size,
                owner,
                isolation,
            } => {
                enc.str("size");
                enc.uint(*size);
                enc.str("owner");
                enc.str(owner);
                enc.str("isolation");
                enc.str(isolation.as_str());
            }
            Body::Cancelled(cancelled) => {
                enc.str("cancelled");
                enc.bool(*cancelled);
            }
            Body::Generation(generation) => {
                enc.str("generation");
                enc.uint(*generation);
            }
            Body::Recovery(recovery) => {
                enc.str("recovery");
                enc.str(recovery);
            }
            Body::Stat => self.encode_stat(&mut enc),
            Body::List => self.encode_list(&mut enc),
            Body::Empty | Body::Error(_) => {}
        }
        enc.str("id");
        encode_id(&mut enc, id);
        enc.str("ok");
        enc.bool(true);
    }

    fn encode_stat(&self, enc: &mut Enc) {
        let pool = &self.pool;
        enc.str("host");
        enc.str(&self.config.host);
        enc.str("objects");
        enc.uint(self.objects.len() as u64);
        let mut containers: Vec<&str> = self.containers.keys().map(|c| &**c).collect();
        containers.sort_unstable(); // byte order of UTF-8 is code point order, as Python sorts
        enc.str("containers");
        enc.array(containers.len());
        for container in containers {
            enc.str(container);
        }
        for (name, value) in [
            ("used_bytes", pool.used_bytes),
            ("used_segments", pool.used_segments),
            ("idle_bytes", pool.idle_bytes),
            ("allocations", pool.allocations),
            ("reuses", pool.reuses),
            ("zeroed_bytes", pool.zeroed_bytes),
            (
                "waiters",
                self.waiters.values().map(|w| w.len() as u64).sum(),
            ),
            ("memory_limit", pool.memory_limit),
        ] {
            enc.str(name);
            enc.uint(value);
        }
    }

    fn encode_list(&self, enc: &mut Enc) {
        let mut objects: Vec<&StoredObject> = self.objects.values().collect();
        objects.sort_unstable_by_key(|o| o.order);
        enc.str("objects");
        enc.array(objects.len());
        for o in objects {
            enc.map(11);
            enc.str("key");
            enc.str(&o.key);
            enc.str("size");
            enc.uint(o.size);
            enc.str("capacity");
            enc.uint(o.segment.capacity);
            enc.str("owner");
            enc.str(&o.owner);
            enc.str("creator");
            enc.str(&o.creator);
            enc.str("recovery");
            enc.str(&o.recovery);
            enc.str("isolation");
            enc.str(o.isolation.as_str());
            enc.str("generation");
            enc.uint(o.generation);
            enc.str("host");
            enc.str(&self.config.host);
            enc.str("created_at");
            enc.float(o.created_at);
            enc.str("updated_at");
            enc.float(o.updated_at);
        }
    }

    // ------------------------------------------------------------------ helpers
    fn container_of(&self, token: u64) -> Result<Rc<str>, Failure> {
        self.conns
            .get(&token)
            .and_then(|c| c.container.clone())
            .ok_or_else(|| Failure::Internal("connection is not registered".to_owned()))
    }

    fn lookup(&self, request: Entries) -> Result<&StoredObject, Failure> {
        let key = Value::get(request, "key");
        // Every stored key passed check_key when it was created: a hit needs no validation.
        if let Some(Value::Str(key)) = key {
            if let Some(obj) = self.objects.get(&**key) {
                return Ok(obj);
            }
        }
        let key = check_key(key.unwrap_or(&NIL))?;
        Err(CdiError::not_found(format!("no object with key {}", repr_str(&key))).into())
    }

    /// The key of the requested object if the caller's container owns it, else `NotOwner`.
    fn owned(&self, token: u64, request: Entries) -> Result<Rc<str>, Failure> {
        let obj = self.lookup(request)?;
        let container = self.conns.get(&token).and_then(|c| c.container.as_ref());
        if container != Some(&obj.owner) {
            let who = container.map_or("None", |c| &**c);
            return Err(CdiError::not_owner(format!(
                "container {who} does not own {}",
                repr_str(&obj.key)
            ))
            .into());
        }
        Ok(obj.key.clone())
    }

    fn set_owner(&mut self, key: &Rc<str>, owner: Rc<str>) -> Result<(), Failure> {
        let obj = self.objects.get_mut(key).ok_or_else(vanished)?;
        if obj.isolation == Isolation::Strict && owner != obj.owner {
            move_to_fresh_segment(&mut self.pool, obj)?;
        }
        if let Some(conn) = self.containers.get(&owner).and_then(|t| self.conns.get(t)) {
            obj.writers.add(conn.uid);
        }
        obj.owner = owner;
        obj.generation += 1;
        self.grant_waiters(key); // first: the new owner is waiting; bookkeeping can follow
        if let Some(obj) = self.objects.get_mut(key) {
            obj.updated_at = sys::unix_time();
        }
        self.changed(key);
        Ok(())
    }

    fn grant_waiters(&mut self, key: &Rc<str>) {
        let Some(waiters) = self.waiters.get_mut(key) else {
            return;
        };
        if waiters.is_empty() {
            return;
        }
        let waiters = std::mem::take(waiters);
        let Some(owner) = self.objects.get(key).map(|o| o.owner.clone()) else {
            return;
        };
        let mut keep = Vec::new();
        let mut grants = Vec::new();
        for (token, id) in waiters {
            match self.conns.get_mut(&token) {
                Some(conn) if !conn.doomed && conn.container.as_ref() == Some(&owner) => {
                    conn.waiting.pop(id);
                    grants.push((token, id, conn.have.pop(id)));
                }
                _ => keep.push((token, id)),
            }
        }
        if keep.is_empty() {
            self.waiters.remove(key);
        } else {
            self.waiters.insert(key.clone(), keep);
        }
        if grants.is_empty() {
            return;
        }
        for (token, id, have) in grants {
            let Some(obj) = self.objects.get(key) else {
                return;
            };
            let (body, fd) = (grant(obj), obj.grant_fd(have));
            self.send(token, ReplyId::Id(id), &body, fd);
        }
        // If the new owner runs on this core (polling, or just woken by the grant), let it take
        // the object now rather than after our ack and epoll round (see server.py).
        sys::sched_yield();
    }

    fn remove(&mut self, key: &Rc<str>) {
        let Some(obj) = self.objects.remove(key) else {
            return;
        };
        let StoredObject {
            segment,
            size,
            writers,
            isolation,
            ..
        } = obj;
        match isolation {
            Isolation::Strict => self.pool.discard(segment),
            Isolation::Cooperative => self.pool.release(segment, size, &writers),
        }
        let destroyed = CdiError::not_found(format!("{} was destroyed", repr_str(key)));
        for (token, id) in self.waiters.remove(key).unwrap_or_default() {
            if let Some(conn) = self.conns.get_mut(&token) {
                conn.waiting.pop(id);
                conn.have.pop(id);
            }
            self.send(
                token,
                ReplyId::Id(id),
                &Body::Error(destroyed.clone()),
                None,
            );
        }
        if let Some(sink) = self.events.as_mut() {
            sink.removed(key);
        }
    }

    fn changed(&mut self, key: &str) {
        if let (Some(sink), Some(obj)) = (self.events.as_mut(), self.objects.get(key)) {
            sink.changed(&obj.key, obj.size, &obj.owner, obj.generation);
        }
    }

    /// A new object owned by the caller; `prefer`: segment ids it still maps.
    #[allow(clippy::too_many_arguments)]
    fn new_object(
        &mut self,
        token: u64,
        key: &str,
        size: u64,
        isolation: Isolation,
        recovery: Rc<str>,
        prefer: &[i128],
        zeroed: bool,
    ) -> Result<StoredObject, Failure> {
        let owner = self.container_of(token)?;
        let uid = self.conns.get(&token).map_or(0, |c| c.uid);
        let cooperative = isolation == Isolation::Cooperative;
        let prefer = if cooperative { prefer } else { &[] };
        let segment = self
            .pool
            .acquire(size, cooperative, prefer, Some(uid), zeroed)?;
        let now = sys::unix_time();
        self.next_order += 1;
        Ok(StoredObject {
            key: Rc::from(key),
            size,
            segment,
            creator: owner.clone(),
            owner,
            recovery,
            isolation,
            generation: 1,
            writers: UidSet::of(uid),
            created_at: now,
            updated_at: now,
            order: self.next_order,
        })
    }

    fn insert(&mut self, obj: StoredObject) -> Rc<str> {
        let key = obj.key.clone();
        self.objects.insert(key.clone(), obj);
        self.changed(&key);
        key
    }

    // ------------------------------------------------------------------ operations
    fn register(&mut self, token: u64, request: Entries) -> Result<Reply, Failure> {
        let cid = check_container_id(arg(request, "container"))?;
        let conn = self.conns.get(&token).ok_or_else(vanished)?;
        if let Some(current) = &conn.container {
            return Err(CdiError::protocol(format!(
                "this connection is already registered as {}",
                repr_str(current)
            ))
            .into());
        }
        if let Some(other) = self.containers.get(&*cid).and_then(|t| self.conns.get(t)) {
            return Err(CdiError::container_exists(format!(
                "container id {} is in use by a live process (pid {})",
                repr_str(&cid),
                other.pid
            ))
            .into());
        }
        let (pid, uid) = (conn.pid, conn.uid);
        match self.bound_uid.get(&*cid) {
            Some(&bound) if bound != uid && uid != 0 => {
                return Err(CdiError::container_exists(format!(
                    "container id {} belongs to uid {bound}, not {uid}",
                    repr_str(&cid)
                ))
                .into());
            }
            Some(_) => {}
            None => {
                self.bound_uid.insert(Rc::from(&*cid), uid);
            }
        }
        let cid: Rc<str> = Rc::from(&*cid);
        self.next_registration += 1;
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.container = Some(cid.clone());
            conn.registered = self.next_registration;
        }
        self.containers.insert(cid.clone(), token);
        if let Some(sink) = self.events.as_mut() {
            sink.registered(&cid, pid, uid);
        }
        Ok(Some((Body::Registered, None)))
    }

    fn create(&mut self, token: u64, request: Entries) -> Result<Reply, Failure> {
        let key = check_key(arg(request, "key"))?;
        let size = check_size(arg(request, "size"), self.config.max_object)?;
        let isolation = self.isolation(Value::get(request, "isolation"))?;
        let recovery = match Value::get(request, "recovery") {
            Some(value) if truthy(value) => Rc::from(&*check_container_id(value)?),
            _ => self.container_of(token)?,
        };
        let have = check_segment_ids(Value::get(request, "have"))?;
        let zeroed = match Value::get(request, "zeroed") {
            None => true,
            Some(Value::Bool(zeroed)) => *zeroed,
            Some(other) => {
                return Err(CdiError::invalid_argument(format!(
                    "zeroed must be true or false, got {}",
                    repr_of(other)?
                ))
                .into())
            }
        };
        if self.objects.contains_key(&*key) {
            return Err(CdiError::key_exists(format!(
                "an object with key {} already exists",
                repr_str(&key)
            ))
            .into());
        }
        let obj = self.new_object(token, &key, size, isolation, recovery, &have, zeroed)?;
        // No fd if the creator still maps the segment it got (a pooled one it used before).
        let segment = obj.segment.id as i128;
        let reply = (
            grant(&obj),
            obj.grant_fd(have.contains(&segment).then_some(segment)),
        );
        self.insert(obj);
        Ok(Some(reply))
    }

    fn isolation(&self, value: Option<&Value>) -> Result<Isolation, Failure> {
        let value = match value {
            None | Some(Value::Nil) => return Ok(self.config.isolation),
            Some(value) => value,
        };
        if let Value::Str(name) = value {
            if let Some(isolation) = Isolation::parse(name) {
                return Ok(isolation);
            }
        }
        Err(CdiError::invalid_argument(format!(
            "isolation must be 'cooperative' or 'strict', got {}",
            repr_of(value)?
        ))
        .into())
    }

    fn use_(&self, request: Entries) -> Result<Reply, Failure> {
        let obj = self.lookup(request)?;
        let body = Body::Use {
            size: obj.size,
            owner: obj.owner.clone(),
            isolation: obj.isolation,
        };
        Ok(Some((body, None)))
    }

    fn access(&mut self, token: u64, id: RequestId, request: Entries) -> Result<Reply, Failure> {
        let obj = self.lookup(request)?;
        let have = match Value::get(request, "have") {
            Some(Value::Int(have)) => Some(have.get()),
            _ => None,
        };
        let container = self.conns.get(&token).and_then(|c| c.container.as_ref());
        if container == Some(&obj.owner) {
            return Ok(Some((grant(obj), obj.grant_fd(have))));
        }
        if let Some(Value::Bool(false)) = Value::get(request, "wait") {
            let who = container.map_or("None", |c| &**c);
            return Err(CdiError::not_owner(format!(
                "container {who} does not own {}",
                repr_str(&obj.key)
            ))
            .into());
        }
        if Value::get(request, "id").is_none() {
            return Err(CdiError::protocol(
                "an access that waits needs a request id to answer it by",
            )
            .into());
        }
        let key = obj.key.clone();
        let budget = self.config.busy_poll_us.saturating_mul(1000);
        self.spin_until = sys::monotonic_ns().saturating_add(budget);
        let conn = self.conns.get_mut(&token).ok_or_else(vanished)?;
        conn.waiting.insert(id, key.clone());
        if let Some(have) = have {
            conn.have.insert(id, have);
        }
        self.waiters.entry(key).or_default().push((token, id));
        Ok(None)
    }

    fn cancel(&mut self, token: u64, request: Entries) -> Result<Reply, Failure> {
        let reference = match Value::get(request, "ref") {
            Some(Value::Int(i)) => Some(RequestId::Int(i.get())),
            Some(Value::Bool(b)) => Some(RequestId::Bool(*b)),
            _ => None,
        };
        let conn = self.conns.get_mut(&token).ok_or_else(vanished)?;
        let key = reference.and_then(|r| conn.waiting.pop(r));
        if let (Some(key), Some(reference)) = (&key, reference) {
            conn.have.pop(reference);
            if let Some(waiters) = self.waiters.get_mut(key) {
                if let Some(at) = waiters
                    .iter()
                    .position(|&(t, i)| t == token && i == reference)
                {
                    waiters.remove(at);
                }
            }
        }
        Ok(Some((Body::Cancelled(key.is_some()), None)))
    }

    fn transfer(&mut self, token: u64, request: Entries) -> Result<Reply, Failure> {
        let key = self.owned(token, request)?;
        let to = Value::get(request, "to");
        // Registered ids passed check_container_id: a hit needs no validation.
        let hit = match to {
            Some(Value::Str(name)) => self.containers.get_key_value(&**name),
            _ => None,
        };
        let to = match hit {
            Some((cid, _)) => cid.clone(),
            None => {
                let name = check_container_id(to.unwrap_or(&NIL))?;
                match self.containers.get_key_value(&*name) {
                    Some((cid, _)) => cid.clone(),
                    None => {
                        return Err(CdiError::unknown_container(format!(
                            "no live container {} is registered with this minion",
                            repr_str(&name)
                        ))
                        .into())
                    }
                }
            }
        };
        if self.objects.get(&key).is_some_and(|o| o.owner != to) {
            self.set_owner(&key, to)?;
        }
        let generation = self.objects.get(&key).ok_or_else(vanished)?.generation;
        Ok(Some((Body::Generation(generation), None)))
    }

    fn copy(&mut self, token: u64, request: Entries) -> Result<Reply, Failure> {
        let key = self.owned(token, request)?;
        let new_key = check_key(arg(request, "new_key"))?;
        if self.objects.contains_key(&*new_key) {
            return Err(CdiError::key_exists(format!(
                "an object with key {} already exists",
                repr_str(&new_key)
            ))
            .into());
        }
        let (size, isolation) = {
            let obj = self.objects.get(&key).ok_or_else(vanished)?;
            (obj.size, obj.isolation)
        };
        let recovery = self.container_of(token)?;
        // Not zeroed: the copy overwrites its bytes (another uid's old bytes are zeroed anyway).
        let mut new = self.new_object(token, &new_key, size, isolation, recovery, &[], false)?;
        if let Some(obj) = self.objects.get(&key) {
            new.segment.copy_from(&obj.segment, size);
        }
        let reply = (grant(&new), Some(new.segment.fd));
        self.insert(new);
        Ok(Some(reply))
    }

    fn resize(&mut self, token: u64, request: Entries) -> Result<Reply, Failure> {
        let key = self.owned(token, request)?;
        let size = check_size(arg(request, "size"), self.config.max_object)?;
        let obj = self.objects.get_mut(&key).ok_or_else(vanished)?;
        if size > obj.segment.capacity {
            let cooperative = obj.isolation == Isolation::Cooperative;
            let mut bigger = self.pool.acquire(size, cooperative, &[], None, true)?;
            bigger.copy_from(&obj.segment, obj.size);
            let old = std::mem::replace(&mut obj.segment, bigger);
            if cooperative {
                self.pool.release(old, obj.size, &obj.writers);
            } else {
                self.pool.discard(old);
            }
        } else if size > obj.size {
            obj.segment.zero(size, obj.size); // growth reads as zeros, not old bytes
        }
        obj.size = size;
        obj.generation += 1;
        obj.updated_at = sys::unix_time();
        let body = grant(obj);
        self.changed(&key);
        Ok(Some((body, None)))
    }

    fn destroy(&mut self, token: u64, request: Entries) -> Result<Reply, Failure> {
        let key = self.owned(token, request)?;
        self.remove(&key);
        Ok(Some((Body::Empty, None)))
    }

    fn set_recovery(&mut self, token: u64, request: Entries) -> Result<Reply, Failure> {
        let key = self.owned(token, request)?;
        let recovery: Rc<str> = Rc::from(&*check_container_id(arg(request, "container"))?);
        self.objects.get_mut(&key).ok_or_else(vanished)?.recovery = recovery.clone();
        Ok(Some((Body::Recovery(recovery), None)))
    }
}

fn encode_id(enc: &mut Enc, id: ReplyId) {
    match id {
        ReplyId::Id(RequestId::Int(i)) => enc.int(i),
        ReplyId::Id(RequestId::Bool(b)) => enc.bool(b),
        ReplyId::Raw(value) => enc.value(value),
    }
}

/// Strict isolation: copy into a new segment and truncate the one the old owner mapped.
fn move_to_fresh_segment(pool: &mut SegmentPool, obj: &mut StoredObject) -> Result<(), Failure> {
    let mut fresh = pool.acquire(obj.size, false, &[], None, true)?;
    if obj.segment.intact(obj.size) {
        fresh.copy_from(&obj.segment, obj.size);
    } else {
        log::warning(format_args!(
            "segment of {} was shrunk by its owner; its data is lost",
            obj.key
        ));
    }
    let old = std::mem::replace(&mut obj.segment, fresh);
    pool.discard(old);
    Ok(())
}

/// An fd kept open to give up when the process runs out of them (see `shed_connection`).
fn open_spare() -> RawFd {
    // SAFETY: a NUL-terminated literal path.
    unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) }
}

//! The sending side of the gateway between hosts (`cdi/remote/PROTOCOL.md`, "Between
//! gateways"), in the minion's own loop: a container's `transfer … via` to a container that is
//! not here leaves through the minion itself. The object goes to a holder of the gateway's
//! (`cdi-gateway.<host>.send`: the sender's views are revoked, exactly one owner), its bytes
//! go from its segment (`sendmsg`, no copy) on a pooled link to the other host's gateway, and
//! only that host's answer decides: committed, the object is destroyed here and the caller's
//! `transfer` answered; refused, it goes back to the caller (or, if the caller is gone, to its
//! recovery container) and the caller hears why. A link that breaks after the whole offer
//! went out leaves the outcome to `resolve`, asked on a new link as the protocol says; with
//! no answer for 10 s the caller hears the outcome is in doubt and the holder keeps asking.
//!
//! Where a container lives is the controller's to say: the minion asks the gateway beside it
//! (over the socket pair it hands channel links on) and keeps the answer for a few seconds.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;

use crate::epoll::Epoll;
use crate::gateway::{bin, mac, random_bytes, read_more, send_frame, tune, LINK, NONCE};
use crate::log;
use crate::msgpack::{unpack, Enc, Value};
use crate::objects::RequestId;
use crate::protocol::CdiError;
use crate::recovery;
use crate::registry::{Entries, Registry};
use crate::replies::Body;
use crate::sys;

/// With `LINK`: the token of a link this side opened.
pub const OUT: u64 = 1 << 60;
const MAX_HEADER: usize = 64 << 10;
const VERSION: u64 = 2;
/// How long a route from the controller is used before it is asked again.
const ROUTE_TTL_NS: u64 = 5_000_000_000;
/// Connecting, and a `resolve`'s answer: as long as this at most.
const RESOLVE_TIMEOUT_NS: u64 = 3_000_000_000;
/// An unanswered `resolve` is asked again for this long before the caller hears "in doubt".
const DOUBT_AFTER_NS: u64 = 10_000_000_000;
const REMEMBERED: usize = 100_000;

/// A `transfer … via` to a container not here: what `ops::transfer` hands the loop.
pub struct Departure {
    pub key: Rc<str>,
    pub to: String,
    /// The caller: the object goes back to it on failure.
    pub back: Rc<str>,
    pub token: u64,
    pub id: RequestId,
    pub compact: bool,
    pub generation: u64,
    pub keep_mapping: bool,
}

/// One transfer in flight.
struct Job {
    d: Departure,
    xfer: String,
    address: Option<SocketAddr>,
    /// Its route was asked anew after the other host did not know `to`.
    fresh: bool,
    /// The next offer goes on a new link (a pooled one failed under it).
    new_link: bool,
    /// Resolving: when the caller hears "in doubt"; the next attempt is due at `retry_at`.
    doubt_at: u64,
    retry_at: u64,
    answered: bool,
}

enum Step {
    Connecting,
    Greeting(Vec<u8>),
    Idle,
    Offering { head: Vec<u8>, sent: u64 },
    Answer,
    Resolving,
}

struct Out {
    fd: RawFd,
    address: SocketAddr,
    step: Step,
    buffer: Vec<u8>,
    /// The offer's head, sent once the handshake is done.
    head: Vec<u8>,
    deadline: u64,
    /// The job it carries, and whether it asks `resolve` for it (else it offers).
    job: Option<u64>,
    resolve: bool,
    pooled: bool,
}

/// How a link ended its part in a job.
enum Ended {
    Answer(Vec<u8>),
    Failed { why: String, refused: bool },
}

pub struct Sender {
    key: Vec<u8>,
    host: String,
    holder: Rc<str>,
    recovery: Rc<str>,
    routes_fd: RawFd,
    timeout_ns: u64,
    links: HashMap<u64, Out>,
    next: u64,
    idle: HashMap<SocketAddr, Vec<u64>>,
    jobs: HashMap<u64, Job>,
    next_job: u64,
    routes: HashMap<String, (u64, SocketAddr)>,
    asking: HashMap<(String, bool), Vec<u64>>,
    /// The recovery container each received object had on its former host.
    theirs: HashMap<Rc<str>, String>,
    order: VecDeque<Rc<str>>,
}

impl Sender {
    pub fn new(key: Vec<u8>, host: &str, routes_fd: RawFd, timeout_ns: u64) -> Sender {
        Sender {
            key,
            host: host.to_owned(),
            holder: holder_of(host),
            recovery: Rc::from(format!("cdi-gateway.{host}.recovery")),
            routes_fd,
            timeout_ns,
            links: HashMap::new(),
            next: 0,
            idle: HashMap::new(),
            jobs: HashMap::new(),
            next_job: 0,
            routes: HashMap::new(),
            asking: HashMap::new(),
            theirs: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn routes_fd(&self) -> RawFd {
        self.routes_fd
    }

    /// A received object's recovery container on its former host, for when it leaves again.
    pub fn arrived(&mut self, key: &str, theirs: &str) {
        let key: Rc<str> = Rc::from(key);
        if theirs.is_empty() {
            self.theirs.remove(&key);
            return;
        }
        if self.theirs.insert(key.clone(), theirs.to_owned()).is_none() {
            self.order.push_back(key);
            while self.order.len() > REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.theirs.remove(&old);
                }
            }
        }
    }

    pub fn depart(&mut self, reg: &mut Registry, epoll: &Epoll, d: Departure) {
        self.next_job += 1;
        let id = self.next_job;
        let xfer: String = random_bytes(12)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let job = Job {
            d,
            xfer,
            address: None,
            fresh: false,
            new_link: false,
            doubt_at: 0,
            retry_at: 0,
            answered: false,
        };
        let to = job.d.to.clone();
        self.jobs.insert(id, job);
        let now = sys::monotonic_ns();
        match self.routes.get(&to) {
            Some((at, address)) if now < at + ROUTE_TTL_NS => {
                let address = *address;
                self.launch(reg, epoll, id, address);
            }
            _ => self.ask(reg, id, to, false),
        }
    }

    /// Ask the gateway beside us where `to` lives (`fresh`: not from its cache).
    fn ask(&mut self, reg: &mut Registry, job: u64, to: String, fresh: bool) {
        let waiting = self.asking.entry((to.clone(), fresh)).or_default();
        waiting.push(job);
        if waiting.len() > 1 {
            return;
        }
        let mut out = Vec::with_capacity(64 + to.len());
        let mut enc = Enc(&mut out);
        enc.map(3);
        enc.str("op");
        enc.str("route");
        enc.str("to");
        enc.str(&to);
        enc.str("fresh");
        enc.bool(fresh);
        if let Err(code) = sys::send_message(self.routes_fd, &out, None) {
            let err = CdiError {
                code: "transfer_failed",
                msg: format!(
                    "this host's gateway does not answer for routes: {}",
                    sys::os_error_text(code)
                ),
            };
            for job in self.asking.remove(&(to, fresh)).unwrap_or_default() {
                self.fail(reg, job, err.clone());
            }
        }
    }

    /// The gateway's answers to `route`.
    pub fn on_routes(&mut self, reg: &mut Registry, epoll: &Epoll) {
        let mut buffer = vec![0u8; 4096];
        loop {
            // SAFETY: buffer is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.routes_fd,
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                if n == 0 {
                    // The gateway is gone: what waits for a route fails, and so do later asks.
                    epoll.unwatch(self.routes_fd);
                    let err = CdiError {
                        code: "transfer_failed",
                        msg: "this host's gateway is gone: no routes to other hosts".to_owned(),
                    };
                    let waiting: Vec<u64> = self.asking.drain().flat_map(|(_, j)| j).collect();
                    for job in waiting {
                        self.fail(reg, job, err.clone());
                    }
                }
                return;
            }
            let Ok(Value::Map(answer)) = unpack(&buffer[..n as usize]) else {
                continue;
            };
            self.routed(reg, epoll, &answer);
        }
    }

    fn routed(&mut self, reg: &mut Registry, epoll: &Epoll, answer: Entries) {
        let to = text(answer, "to");
        let fresh = matches!(Value::get(answer, "fresh"), Some(Value::Bool(true)));
        let waiting = self.asking.remove(&(to.clone(), fresh)).unwrap_or_default();
        let address = match Value::get(answer, "address") {
            Some(Value::Str(a)) => a.parse::<SocketAddr>().map_err(|_| format!("{a:?}")),
            _ => Err(String::new()),
        };
        let address = match address {
            Ok(address) => address,
            Err(bad) => {
                let err = if bad.is_empty() {
                    refusal_error(answer)
                } else {
                    CdiError {
                        code: "transfer_failed",
                        msg: format!("{to:?} has an address the minion cannot dial: {bad}"),
                    }
                };
                for job in waiting {
                    self.fail(reg, job, err.clone());
                }
                return;
            }
        };
        if self.routes.len() > REMEMBERED {
            self.routes.clear();
        }
        self.routes.insert(to, (sys::monotonic_ns(), address));
        for job in waiting {
            let before = self.jobs.get(&job).and_then(|j| j.address);
            if fresh && before == Some(address) {
                // The same host again, which did not know `to`: it is nowhere.
                let err = CdiError::unknown_container(format!(
                    "no live container {:?} is registered on any host",
                    self.jobs.get(&job).map_or("", |j| j.d.to.as_str())
                ));
                self.fail(reg, job, err);
            } else {
                self.launch(reg, epoll, job, address);
            }
        }
    }

    /// Offer the job's object at `address`: on an idle link to it, else a new one.
    fn launch(&mut self, reg: &mut Registry, epoll: &Epoll, job: u64, address: SocketAddr) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.address = Some(address);
        let new_link = std::mem::take(&mut j.new_link);
        let head = match offer_head(reg, j, &self.host, &self.recovery, &self.theirs) {
            Ok(head) => head,
            Err(err) => return self.fail(reg, job, err),
        };
        let pooled = if new_link {
            None
        } else {
            self.idle.get_mut(&address).and_then(Vec::pop)
        };
        let token = match pooled {
            Some(token) => token,
            None => match self.connect(epoll, address, self.timeout_ns) {
                Ok(token) => token,
                Err(why) => {
                    let err = failed(address, &format!("cannot connect: {why}"));
                    return self.fail(reg, job, err);
                }
            },
        };
        let Some(link) = self.links.get_mut(&token) else {
            return;
        };
        link.job = Some(job);
        link.resolve = false;
        if let Step::Idle = link.step {
            link.step = Step::Offering { head, sent: 0 };
            link.deadline = sys::monotonic_ns() + self.timeout_ns;
        } else {
            link.head = head;
        }
        self.drive(reg, epoll, token);
    }

    /// A new link to `address`, connecting; its token.
    fn connect(&mut self, epoll: &Epoll, address: SocketAddr, timeout: u64) -> Result<u64, String> {
        let (storage, length, family) = sockaddr(address);
        // SAFETY: plain system calls; the address is valid for `length` bytes.
        let fd = unsafe {
            libc::socket(
                family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(sys::last_os_error_text());
        }
        tune(fd);
        // SAFETY: as above.
        let rc = unsafe {
            libc::connect(
                fd,
                (&storage as *const libc::sockaddr_storage).cast(),
                length,
            )
        };
        if rc != 0 && sys::errno() != libc::EINPROGRESS {
            let code = sys::errno();
            sys::close(fd);
            return Err(refusal_text(code));
        }
        self.next += 1;
        let token = LINK | OUT | self.next;
        let events = libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET;
        if let Err(why) = epoll.watch(fd, token, events) {
            sys::close(fd);
            return Err(why);
        }
        let link = Out {
            fd,
            address,
            step: Step::Connecting,
            buffer: Vec::new(),
            head: Vec::new(),
            deadline: sys::monotonic_ns() + timeout.min(RESOLVE_TIMEOUT_NS),
            job: None,
            resolve: false,
            pooled: false,
        };
        self.links.insert(token, link);
        Ok(token)
    }

    /// Whatever the link can do now (edge-triggered: until the socket would block).
    pub fn drive(&mut self, reg: &mut Registry, epoll: &Epoll, token: u64) {
        loop {
            let Some(link) = self.links.get_mut(&token) else {
                return;
            };
            let outcome = match link.step {
                Step::Connecting => connected(link, &self.host),
                Step::Greeting(_) => self.greeted(token),
                Step::Idle => idle(link),
                Step::Offering { .. } => offered(
                    reg,
                    link,
                    self.jobs.get(&link.job.unwrap_or(0)),
                    self.timeout_ns,
                ),
                Step::Answer | Step::Resolving => answered(link),
            };
            match outcome {
                Ok(None) => return,
                Ok(Some(Progress::Again)) => {}
                Ok(Some(Progress::Done(ended))) => return self.ended(reg, epoll, token, ended),
                Err(why) => {
                    let refused = why.starts_with("refused:");
                    return self.ended(reg, epoll, token, Ended::Failed { why, refused });
                }
            }
        }
    }

    /// The handshake's answer: check the other side's proof, send ours, then the job's frame.
    fn greeted(&mut self, token: u64) -> Result<Option<Progress>, String> {
        let link = self.links.get_mut(&token).ok_or("gone")?;
        let Some(frame) = take_frame(link)? else {
            return Ok(None);
        };
        let Step::Greeting(ours) = std::mem::replace(&mut link.step, Step::Idle) else {
            return Err("not greeting".to_owned());
        };
        let answer = match unpack(&frame) {
            Ok(Value::Map(entries)) => entries,
            _ => return Err("an undecodable handshake".to_owned()),
        };
        if !matches!(Value::get(&answer, "ok"), Some(Value::Bool(true))) {
            return Err(format!(
                "the handshake was refused: {}",
                refusal_error(&answer).msg
            ));
        }
        let (theirs, proof) = match (Value::get(&answer, "nonce"), Value::get(&answer, "proof")) {
            (Some(Value::Bin(n)), Some(Value::Bin(p))) if (NONCE..=64).contains(&n.len()) => {
                (n.to_vec(), p.to_vec())
            }
            _ => return Err("a handshake without nonce or proof".to_owned()),
        };
        let expected = mac(&self.key, b"server", &[&ours, &theirs]);
        if proof != expected {
            return Err("the other side did not prove that it holds the gateway key".to_owned());
        }
        let shown = mac(
            &self.key,
            b"client",
            &[&theirs, &ours, self.host.as_bytes()],
        );
        let mut out = Vec::with_capacity(64);
        let mut enc = Enc(&mut out);
        enc.map(2);
        enc.str("op");
        enc.str("proof");
        enc.str("proof");
        bin(&mut enc, &shown);
        send_frame(link.fd, &out)?;
        link.deadline = sys::monotonic_ns() + self.timeout_ns;
        if link.resolve {
            let xfer = self
                .jobs
                .get(&link.job.unwrap_or(0))
                .map_or(String::new(), |j| j.xfer.clone());
            let mut out = Vec::with_capacity(64);
            let mut enc = Enc(&mut out);
            enc.map(2);
            enc.str("op");
            enc.str("resolve");
            enc.str("xfer");
            enc.str(&xfer);
            send_frame(link.fd, &out)?;
            link.step = Step::Resolving;
            link.deadline = sys::monotonic_ns() + self.timeout_ns.min(RESOLVE_TIMEOUT_NS);
        } else if link.job.is_some() {
            let head = std::mem::take(&mut link.head);
            link.step = Step::Offering { head, sent: 0 };
        }
        Ok(Some(Progress::Again))
    }

    /// A link is done with its job's step: act on the answer, or on the failure.
    fn ended(&mut self, reg: &mut Registry, epoll: &Epoll, token: u64, ended: Ended) {
        let Some(link) = self.links.get_mut(&token) else {
            return;
        };
        let (job, resolve, pooled, address) =
            (link.job.take(), link.resolve, link.pooled, link.address);
        let answer = match ended {
            Ended::Answer(answer) => {
                if resolve {
                    self.close(epoll, token);
                } else {
                    link.step = Step::Idle;
                    link.deadline = 0;
                    link.pooled = true;
                    self.idle.entry(address).or_default().push(token);
                }
                answer
            }
            Ended::Failed { why, refused } => {
                let offering_started = matches!(link.step, Step::Offering { .. });
                let offering =
                    offering_started || matches!(link.step, Step::Connecting | Step::Greeting(_));
                let all_out = matches!(link.step, Step::Answer);
                self.close(epoll, token);
                let Some(job) = job else {
                    return;
                };
                if resolve {
                    return self.unresolved(reg, epoll, job, refused);
                }
                if all_out {
                    log::info(format_args!(
                        "transfer to {address}: no answer ({why}); resolving"
                    ));
                    return self.resolve_later(reg, epoll, job, true);
                }
                if offering && pooled {
                    // An idle link the other side had closed: the payload did not get through.
                    if let Some(j) = self.jobs.get_mut(&job) {
                        j.new_link = true;
                    }
                    return self.launch(reg, epoll, job, address);
                }
                let what = if offering_started {
                    "the link failed while sending"
                } else {
                    "cannot connect"
                };
                let err = failed(address, &format!("{what}: {why}"));
                return self.fail(reg, job, err);
            }
        };
        let Some(job) = job else {
            return;
        };
        let Ok(Value::Map(entries)) = unpack(&answer) else {
            let err = failed(address, "an undecodable answer");
            return self.fail(reg, job, err);
        };
        if resolve {
            match Value::get(&entries, "state") {
                Some(Value::Str("committed")) => self.succeed(reg, job),
                Some(Value::Str("aborted")) => {
                    let err = failed(address, "the link failed before the other host kept it");
                    self.fail(reg, job, err);
                }
                _ => self.unresolved(reg, epoll, job, false),
            }
            return;
        }
        if matches!(Value::get(&entries, "ok"), Some(Value::Bool(true))) {
            return self.succeed(reg, job);
        }
        let err = refusal_error(&entries);
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if err.code == "unknown_container" && !j.fresh {
            // A route from the cache may be stale: ask once more.
            j.fresh = true;
            j.xfer = random_bytes(12)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let to = j.d.to.clone();
            self.routes.remove(&to);
            return self.ask(reg, job, to, true);
        }
        self.fail(reg, job, err);
    }

    /// No answer to a `resolve` (`refused`: nothing listens there, so nothing there holds the
    /// object): failed, or asked again later.
    fn unresolved(&mut self, reg: &mut Registry, epoll: &Epoll, job: u64, refused: bool) {
        if refused {
            let address = self.jobs.get(&job).and_then(|j| j.address);
            let err = failed_at(
                address,
                "the other host's gateway is gone, and the object with it",
            );
            return self.fail(reg, job, err);
        }
        self.resolve_later(reg, epoll, job, false);
    }

    fn resolve_later(&mut self, reg: &mut Registry, epoll: &Epoll, job: u64, first: bool) {
        let now = sys::monotonic_ns();
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if first {
            j.doubt_at = now + DOUBT_AFTER_NS;
            j.retry_at = now;
            return self.tick(reg, epoll);
        }
        if !j.answered && now >= j.doubt_at {
            j.answered = true;
            let address = j.address.map_or(String::new(), |a| a.to_string());
            let err = CdiError {
                code: "transfer_failed",
                msg: format!(
                    "transfer to the gateway at {address}: the link failed after the bytes \
                     left, and the other host has not said whether it kept the object: the \
                     outcome is in doubt"
                ),
            };
            reg.outbox.push((j.d.token, j.d.id, Body::Error(err), None));
        }
        j.retry_at = now
            + if j.answered {
                1_000_000_000
            } else {
                500_000_000
            };
    }

    /// The job ends: it, and whether its object is still ours to destroy or give back.
    fn finish(&mut self, reg: &Registry, job: u64) -> Option<(Job, bool)> {
        let j = self.jobs.remove(&job)?;
        let held = reg
            .objects
            .get(&j.d.key)
            .is_some_and(|o| o.owner == self.holder);
        Some((j, held))
    }

    /// The other host has it: ours goes, and the caller hears so (unless told "in doubt").
    fn succeed(&mut self, reg: &mut Registry, job: u64) {
        let Some((j, held)) = self.finish(reg, job) else {
            return;
        };
        if held {
            reg.remove(&j.d.key);
        }
        if !j.answered {
            let body = Body::Transferred {
                generation: j.d.generation,
                keep_mapping: j.d.keep_mapping,
                to: Rc::from(j.d.to.as_str()),
                compact: j.d.compact,
            };
            reg.outbox.push((j.d.token, j.d.id, body, None));
        }
    }

    /// It did not happen: the object goes back to the caller (or its recovery container, if
    /// the caller is gone), and the caller hears why.
    fn fail(&mut self, reg: &mut Registry, job: u64, err: CdiError) {
        let Some((j, held)) = self.finish(reg, job) else {
            return;
        };
        if held {
            if reg.containers.contains_key(&j.d.back) {
                if reg.set_owner(&j.d.key, j.d.back.clone()).is_err() {
                    recovery::recover(reg, &j.d.key);
                }
            } else {
                recovery::recover(reg, &j.d.key);
            }
        }
        if !j.answered {
            reg.outbox.push((j.d.token, j.d.id, Body::Error(err), None));
        }
    }

    /// After each turn: links past their deadline fail; resolves that are due are asked.
    pub fn tick(&mut self, reg: &mut Registry, epoll: &Epoll) {
        let now = sys::monotonic_ns();
        let stalled: Vec<u64> = self
            .links
            .iter()
            .filter(|(_, l)| l.deadline > 0 && now >= l.deadline)
            .map(|(t, _)| *t)
            .collect();
        for token in stalled {
            let why = "it stalled".to_owned();
            self.ended(
                reg,
                epoll,
                token,
                Ended::Failed {
                    why,
                    refused: false,
                },
            );
        }
        let due: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.retry_at > 0 && now >= j.retry_at)
            .map(|(id, _)| *id)
            .collect();
        for job in due {
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            j.retry_at = 0;
            let Some(address) = j.address else {
                continue;
            };
            match self.connect(epoll, address, RESOLVE_TIMEOUT_NS) {
                Ok(token) => {
                    if let Some(link) = self.links.get_mut(&token) {
                        link.job = Some(job);
                        link.resolve = true;
                    }
                    self.drive(reg, epoll, token);
                }
                Err(why) => self.unresolved(reg, epoll, job, why.starts_with("refused:")),
            }
        }
    }

    pub fn next_deadline(&self) -> Option<u64> {
        let links = self.links.values().map(|l| l.deadline);
        let jobs = self.jobs.values().map(|j| j.retry_at);
        links.chain(jobs).filter(|d| *d > 0).min()
    }

    fn close(&mut self, epoll: &Epoll, token: u64) {
        let Some(link) = self.links.remove(&token) else {
            return;
        };
        epoll.unwatch(link.fd);
        sys::close(link.fd);
        if let Some(idle) = self.idle.get_mut(&link.address) {
            idle.retain(|t| *t != token);
        }
    }

    pub fn shutdown(&mut self, epoll: &Epoll) {
        let tokens: Vec<u64> = self.links.keys().copied().collect();
        for token in tokens {
            self.close(epoll, token);
        }
    }
}

/// The container that holds an object while it leaves for another host.
pub fn holder_of(host: &str) -> Rc<str> {
    Rc::from(format!("cdi-gateway.{host}.send"))
}

enum Progress {
    Again,
    Done(Ended),
}

type Driven = Result<Option<Progress>, String>;

fn connected(link: &mut Out, host: &str) -> Driven {
    let mut error: libc::c_int = 0;
    let mut size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt with a pointer to an int of the right size.
    unsafe {
        libc::getsockopt(
            link.fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut error as *mut libc::c_int).cast(),
            &mut size,
        );
    }
    if error != 0 {
        return Err(refusal_text(error));
    }
    // SAFETY: an empty address buffer: only whether the socket has a peer is asked.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage is valid for `length` bytes.
    let rc = unsafe {
        libc::getpeername(
            link.fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut length,
        )
    };
    if rc != 0 {
        return Ok(None); // still connecting
    }
    let ours = random_bytes(NONCE);
    let mut out = Vec::with_capacity(96);
    let mut enc = Enc(&mut out);
    enc.map(4);
    enc.str("op");
    enc.str("hello");
    enc.str("from");
    enc.str(host);
    enc.str("nonce");
    bin(&mut enc, &ours);
    enc.str("version");
    enc.uint(VERSION);
    send_frame(link.fd, &out)?;
    link.step = Step::Greeting(ours);
    Ok(Some(Progress::Again))
}

/// An idle pooled link: anything readable is its end (or a protocol error).
fn idle(link: &mut Out) -> Driven {
    let mut byte = [0u8; 1];
    // SAFETY: byte is valid for 1 byte.
    let n = unsafe { libc::recv(link.fd, byte.as_mut_ptr().cast(), 1, libc::MSG_DONTWAIT) };
    match n {
        0 => Err("closed".to_owned()),
        n if n > 0 => Err("unexpected bytes on an idle link".to_owned()),
        _ => again(),
    }
}

/// Send what is left of the offer: its header, then the object's bytes from its segment.
fn offered(reg: &Registry, link: &mut Out, job: Option<&Job>, timeout: u64) -> Driven {
    let job = job.ok_or("no transfer")?;
    let obj = reg.objects.get(&job.d.key).ok_or("the object is gone")?;
    let Step::Offering { head, sent } = &mut link.step else {
        return Ok(None);
    };
    let total = head.len() as u64 + obj.size;
    while *sent < total {
        let n = obj.segment.send_with(link.fd, head, *sent, obj.size);
        if n < 0 {
            return match sys::errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                code => Err(sys::os_error_text(code)),
            };
        }
        *sent += n as u64;
        link.deadline = sys::monotonic_ns() + timeout;
    }
    link.step = Step::Answer;
    Ok(Some(Progress::Again))
}

/// A frame that answers the job's offer or resolve.
fn answered(link: &mut Out) -> Driven {
    match take_frame(link)? {
        Some(frame) => Ok(Some(Progress::Done(Ended::Answer(frame)))),
        None => Ok(None),
    }
}

/// The next whole frame from the link, reading what is there; None once it would block.
fn take_frame(link: &mut Out) -> Result<Option<Vec<u8>>, String> {
    loop {
        if link.buffer.len() >= 4 {
            let length = u32::from_be_bytes([
                link.buffer[0],
                link.buffer[1],
                link.buffer[2],
                link.buffer[3],
            ]) as usize;
            if length > MAX_HEADER {
                return Err(format!("a header of {length} bytes"));
            }
            if link.buffer.len() >= 4 + length {
                let frame: Vec<u8> = link.buffer.drain(..4 + length).skip(4).collect();
                return Ok(Some(frame));
            }
        }
        let n = read_more(link.fd, &mut link.buffer);
        if n == 0 {
            return Err("the link closed before the answer".to_owned());
        }
        if n < 0 {
            return match sys::errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                code => Err(sys::os_error_text(code)),
            };
        }
    }
}

/// An error's text, starting `refused:` when nothing listens there (`resolve`: nothing there
/// holds the object).
fn refusal_text(code: i32) -> String {
    let text = sys::os_error_text(code);
    if code == libc::ECONNREFUSED {
        format!("refused: {text}")
    } else {
        text
    }
}

fn again() -> Driven {
    match sys::errno() {
        libc::EAGAIN | libc::EINTR => Ok(None),
        code => Err(sys::os_error_text(code)),
    }
}

/// The offer's frame head: length and header (the payload follows from the segment).
fn offer_head(
    reg: &Registry,
    job: &Job,
    host: &str,
    recovery: &Rc<str>,
    theirs: &HashMap<Rc<str>, String>,
) -> Result<Vec<u8>, CdiError> {
    let obj = reg
        .objects
        .get(&job.d.key)
        .ok_or_else(|| CdiError::not_found(format!("{:?} is gone", &*job.d.key)))?;
    // The recovery container it should have wherever it goes: its own here, or the one it had
    // on its former host; never a gateway's (two gateways would pass it back and forth).
    let mut back = if obj.recovery == *recovery {
        theirs.get(&job.d.key).map_or("", String::as_str)
    } else {
        &obj.recovery
    };
    if back.starts_with("cdi-gateway.") {
        back = "";
    }
    let mut out = vec![0u8; 4];
    let mut enc = Enc(&mut out);
    enc.map(9);
    enc.str("op");
    enc.str("offer");
    enc.str("xfer");
    enc.str(&job.xfer);
    enc.str("key");
    enc.str(&job.d.key);
    enc.str("size");
    enc.uint(obj.size);
    enc.str("to");
    enc.str(&job.d.to);
    enc.str("recovery");
    enc.str(back);
    enc.str("isolation");
    enc.str(obj.isolation.as_str());
    enc.str("from");
    enc.str(host);
    enc.str("generation");
    enc.uint(job.d.generation);
    let length = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&length.to_be_bytes());
    Ok(out)
}

fn text(entries: Entries, name: &str) -> String {
    match Value::get(entries, name) {
        Some(Value::Str(s)) => s.to_string(),
        _ => String::new(),
    }
}

/// A refusal's error, its code one this side knows (else `cdi_error`).
fn refusal_error(entries: Entries) -> CdiError {
    const CODES: [&str; 8] = [
        "unknown_container",
        "key_exists",
        "out_of_memory",
        "invalid_argument",
        "transfer_failed",
        "unauthenticated",
        "controller_unavailable",
        "not_found",
    ];
    let code = text(entries, "code");
    CdiError {
        code: CODES
            .iter()
            .find(|c| **c == code)
            .copied()
            .unwrap_or("cdi_error"),
        msg: text(entries, "msg"),
    }
}

fn failed(address: SocketAddr, why: &str) -> CdiError {
    failed_at(Some(address), why)
}

fn failed_at(address: Option<SocketAddr>, why: &str) -> CdiError {
    let address = address.map_or(String::new(), |a| a.to_string());
    CdiError {
        code: "transfer_failed",
        msg: format!("transfer to the gateway at {address} failed: {why}"),
    }
}

fn sockaddr(address: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t, libc::c_int) {
    // SAFETY: sockaddr_storage is plain data; zeroed is valid, and large enough for both.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match address {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            (
                storage,
                std::mem::size_of::<libc::sockaddr_in>() as _,
                libc::AF_INET,
            )
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            (
                storage,
                std::mem::size_of::<libc::sockaddr_in6>() as _,
                libc::AF_INET6,
            )
        }
    }
}

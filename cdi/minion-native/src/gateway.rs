//! The receiving side of the gateway between hosts (`cdi/remote/PROTOCOL.md`, "Between
//! gateways"), in the minion's own loop: another host's gateway offers an object, and the
//! minion receives its payload straight into a segment of its pool and creates the object with
//! its new owner in one step, granting an `access` that waits for it at once. No other process
//! is on that path.
//!
//! The launcher binds the TCP socket (it knows the address to advertise) and hands it over
//! with the cluster's gateway key (`--gateway-fd`, `--gateway-key-fd`). Links that ask for a
//! channel (`channel`) are handed, after the handshake, to the gateway beside the minion
//! (`cdi/remote/channels.py`) over `--gateway-channels-fd`, with the request that opened them.
//!
//! Each link is a small state machine driven by the loop: the handshake (both sides prove they
//! hold the key), then frames; an offer's payload is read as it comes, never blocking the loop.
//! A link that ends or stalls mid-payload leaves no object behind; `resolve` fences a transfer
//! not committed by then, and commits and fences both happen in the loop, one at a time.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::rc::Rc;

use crate::epoll::Epoll;
use crate::log;
use crate::msgpack::{unpack, Enc, Value, NIL};
use crate::objects::StoredObject;
use crate::protocol::{check_container_id, check_key, CdiError, Failure, Isolation};
use crate::registry::{Entries, Registry};
use crate::replies::refusal_fields;
use crate::segments::{Segment, UidSet};
use crate::sending::{Sender, OUT};
use crate::sys;

/// Marks a link's epoll token.
pub const LINK: u64 = 1 << 61;
const MAX_HEADER: usize = 64 << 10;
const LABEL: &[u8] = b"cdi-gateway-1\0";
pub const NONCE: usize = 16;
/// This side's protocol version: 2 (objects, and channels through the gateway beside us).
const VERSION: u64 = 2;
const REMEMBERED: usize = 100_000;
const CHUNK: usize = 64 << 10;
const BLOCK: usize = 4 << 20;

pub struct GatewayConfig {
    pub listen_fd: RawFd,
    pub key: Vec<u8>,
    pub channels_fd: Option<RawFd>,
    pub timeout_ns: u64,
    /// The minion itself sends to other hosts (`sending.rs`; routes asked over `channels_fd`).
    pub sends: bool,
}

/// What an offer asks for.
struct Offer {
    xfer: String,
    key: String,
    size: u64,
    to: String,
    isolation: Isolation,
    generation: u64,
    /// The recovery container it had on the sender's host (the gateway beside us sends it
    /// there if its owner here dies).
    theirs: String,
}

enum State {
    Hello,
    Proof {
        theirs: Vec<u8>,
        ours: Vec<u8>,
        host: String,
    },
    Ready,
    /// The offer's payload is coming into `segment`.
    Receiving {
        offer: Offer,
        segment: Segment,
        got: u64,
    },
    /// A refused offer's payload: read and dropped, so the link stays usable.
    Draining(u64),
    /// An object of the key is still here, on its way out through a gateway slot: the offer
    /// waits (the link is not read) until it is gone, or its deadline.
    Parked(Offer),
}

struct Link {
    fd: RawFd,
    state: State,
    buffer: Vec<u8>,
    /// When the link counts as stalled (0: never, an idle link between frames).
    deadline: u64,
    /// Its container id, the creator of what it receives.
    name: Rc<str>,
    watched: bool,
}

pub struct Gateway {
    config: GatewayConfig,
    links: HashMap<u64, Link>,
    next: u64,
    /// Outcomes of transfers: true committed, false fenced; the oldest forgotten past a bound.
    outcomes: HashMap<String, bool>,
    order: VecDeque<String>,
    prefix: String,
    recovery: Rc<str>,
    /// Answers owed to links, sent once the grants the same turn owes are out (`flush`).
    answers: Vec<(u64, Vec<u8>)>,
    /// The sending side, when the minion sends too.
    pub sender: Option<Sender>,
}

impl Gateway {
    pub fn new(config: GatewayConfig, host: &str) -> Gateway {
        let prefix = format!("cdi-gateway.{host}.");
        let sender = match config.channels_fd {
            Some(fd) if config.sends => {
                Some(Sender::new(config.key.clone(), host, fd, config.timeout_ns))
            }
            _ => None,
        };
        Gateway {
            sender,
            config,
            links: HashMap::new(),
            next: 0,
            outcomes: HashMap::new(),
            order: VecDeque::new(),
            recovery: Rc::from(format!("{prefix}recovery")),
            prefix,
            answers: Vec::new(),
        }
    }

    pub fn listen_fd(&self) -> RawFd {
        self.config.listen_fd
    }

    pub fn accept(&mut self, epoll: &Epoll) {
        loop {
            // SAFETY: a plain accept4; the address is not wanted.
            let fd = unsafe {
                libc::accept4(
                    self.config.listen_fd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                return;
            }
            tune(fd);
            self.next += 1;
            let token = LINK | self.next;
            if epoll.watch(fd, token, libc::EPOLLIN).is_err() {
                sys::close(fd);
                continue;
            }
            let name = Rc::from(format!("{}in-native{}", self.prefix, self.next));
            let deadline = sys::monotonic_ns() + self.config.timeout_ns;
            let link = Link {
                fd,
                state: State::Hello,
                buffer: Vec::new(),
                deadline,
                name,
                watched: true,
            };
            self.links.insert(token, link);
        }
    }

    /// The earliest moment a link's deadline passes.
    pub fn next_deadline(&self) -> Option<u64> {
        let sending = self.sender.as_ref().and_then(Sender::next_deadline);
        self.links
            .values()
            .map(|l| l.deadline)
            .filter(|d| *d > 0)
            .chain(sending)
            .min()
    }

    /// After each turn of the loop: offers parked on a key that has left since go on, and
    /// links past their deadline close (a parked offer past it is refused).
    pub fn tick(&mut self, reg: &mut Registry, epoll: &Epoll) {
        if let Some(sender) = self.sender.as_mut() {
            sender.tick(reg, epoll);
        }
        if self.links.is_empty() {
            return;
        }
        let now = sys::monotonic_ns();
        let mut resume = Vec::new();
        let mut refuse = Vec::new();
        let mut stalled = Vec::new();
        for (token, link) in &self.links {
            let expired = link.deadline > 0 && now >= link.deadline;
            match &link.state {
                State::Parked(offer) if !reg.objects.contains_key(offer.key.as_str()) => {
                    resume.push(*token)
                }
                State::Parked(_) if expired => refuse.push(*token),
                _ if expired => stalled.push(*token),
                _ => {}
            }
        }
        for token in stalled {
            self.close(reg, epoll, token, "it stalled");
        }
        for (token, go_on) in resume
            .into_iter()
            .map(|t| (t, true))
            .chain(refuse.into_iter().map(|t| (t, false)))
        {
            let Some(link) = self.links.get_mut(&token) else {
                continue;
            };
            let State::Parked(offer) = std::mem::replace(&mut link.state, State::Ready) else {
                continue;
            };
            if !link.watched && epoll.watch(link.fd, token, libc::EPOLLIN).is_ok() {
                link.watched = true;
            }
            if go_on {
                self.begin(reg, token, offer);
            } else {
                let err = CdiError::key_exists(format!(
                    "an object with key {:?} already exists",
                    offer.key
                ));
                self.refuse(token, offer.size, &err);
            }
            self.on_readable(reg, epoll, token); // bytes already buffered count too
        }
    }

    /// Read what the link has; act on every complete frame and on payload bytes.
    pub fn on_readable(&mut self, reg: &mut Registry, epoll: &Epoll, token: u64) {
        if token & OUT != 0 {
            if let Some(sender) = self.sender.as_mut() {
                sender.drive(reg, epoll, token);
            }
            return;
        }
        loop {
            let Some(link) = self.links.get_mut(&token) else {
                return;
            };
            let progress = match link.state {
                State::Parked(_) => return,
                State::Receiving { .. } | State::Draining(_) => self.payload(reg, token),
                _ => self.frame(reg, epoll, token),
            };
            match progress {
                Ok(true) => {}
                Ok(false) => return,
                Err(why) => {
                    self.close(reg, epoll, token, &why);
                    return;
                }
            }
            if let Some(link) = self.links.get_mut(&token) {
                if let State::Parked(_) = link.state {
                    // Not read until the key is gone: level-triggered epoll would spin.
                    epoll.unwatch(link.fd);
                    link.watched = false;
                    return;
                }
            }
        }
    }

    /// Handle the next whole frame if it is there (reading more when not); Ok(false) once the
    /// socket has nothing more now, Err to close the link.
    fn frame(&mut self, reg: &mut Registry, epoll: &Epoll, token: u64) -> Result<bool, String> {
        let link = self.links.get_mut(&token).ok_or("gone")?;
        let length = if link.buffer.len() >= 4 {
            u32::from_be_bytes([
                link.buffer[0],
                link.buffer[1],
                link.buffer[2],
                link.buffer[3],
            ]) as usize
        } else {
            usize::MAX
        };
        if length != usize::MAX && length > MAX_HEADER {
            return Err(format!("a header of {length} bytes"));
        }
        if length == usize::MAX || link.buffer.len() < 4 + length {
            return fill(link);
        }
        let header: Vec<u8> = link.buffer.drain(..4 + length).skip(4).collect();
        let request = match unpack(&header) {
            Ok(Value::Map(entries)) => entries,
            _ => return Err("an undecodable header".to_owned()),
        };
        match std::mem::replace(&mut link.state, State::Ready) {
            State::Hello => self.hello(token, &request),
            State::Proof { theirs, ours, host } => self.proof(token, &request, theirs, ours, host),
            _ => self.request(reg, epoll, token, &request, &header),
        }
    }

    fn hello(&mut self, token: u64, request: Entries) -> Result<bool, String> {
        let theirs = nonce(request)?;
        let host = match Value::get(request, "from") {
            Some(Value::Str(host)) if !host.is_empty() && host.len() <= 256 => host.to_string(),
            _ => return Err("a link must start with hello".to_owned()),
        };
        if !matches!(Value::get(request, "op"), Some(Value::Str("hello"))) {
            return Err("a link must start with hello".to_owned());
        }
        let ours = random_bytes(NONCE);
        let shown = self.mac(b"server", &[&theirs, &ours]);
        let mut out = Vec::with_capacity(96);
        {
            let mut enc = Enc(&mut out);
            enc.map(4);
            enc.str("ok");
            enc.bool(true);
            enc.str("nonce");
            bin(&mut enc, &ours);
            enc.str("proof");
            bin(&mut enc, &shown);
            enc.str("version");
            enc.uint(VERSION);
        }
        let link = self.links.get_mut(&token).ok_or("gone")?;
        link.state = State::Proof { theirs, ours, host };
        self.answers.push((token, out));
        Ok(true)
    }

    fn proof(
        &mut self,
        token: u64,
        request: Entries,
        theirs: Vec<u8>,
        ours: Vec<u8>,
        host: String,
    ) -> Result<bool, String> {
        let expected = self.mac(b"client", &[&ours, &theirs, host.as_bytes()]);
        let shown = match (Value::get(request, "op"), Value::get(request, "proof")) {
            (Some(Value::Str("proof")), Some(Value::Bin(proof))) => *proof,
            _ => &[][..],
        };
        let link = self.links.get_mut(&token).ok_or("gone")?;
        if !same(shown, &expected) {
            let err = CdiError {
                code: "unauthenticated",
                msg: "this link did not prove that it holds the cluster's gateway key".to_owned(),
            };
            let _ = send_frame(link.fd, &refusal(&err));
            return Err(format!(
                "a link claiming to be host {host:?} did not prove the key"
            ));
        }
        link.deadline = 0;
        Ok(true)
    }

    fn request(
        &mut self,
        reg: &mut Registry,
        epoll: &Epoll,
        token: u64,
        request: Entries,
        raw: &[u8],
    ) -> Result<bool, String> {
        match Value::get(request, "op") {
            Some(Value::Str("resolve")) => {
                let xfer = text(request, "xfer");
                let committed = self.outcomes.get(&xfer) == Some(&true);
                if !committed {
                    self.remember(xfer, false); // fenced: never committed from now on
                }
                let mut out = Vec::with_capacity(32);
                let mut enc = Enc(&mut out);
                enc.map(2);
                enc.str("ok");
                enc.bool(true);
                enc.str("state");
                enc.str(if committed { "committed" } else { "aborted" });
                self.answers.push((token, out));
                Ok(true)
            }
            Some(Value::Str("offer")) => {
                let offer = parse_offer(request)?;
                if offer.size > reg.config.max_object {
                    // Not drained: an absurd size must not make us read forever.
                    return Err(format!("an offer of {} bytes", offer.size));
                }
                self.offer(reg, token, offer);
                Ok(true)
            }
            Some(Value::Str("channel")) => {
                let link = self.links.remove(&token).ok_or("gone")?;
                // Before it goes: the fd stays open in the other process, and with it the watch.
                epoll.unwatch(link.fd);
                self.hand_over(link, raw);
                Ok(false)
            }
            _ => Err("an unknown gateway operation".to_owned()),
        }
    }

    /// A link that carries a channel goes, with its request, to the gateway beside us.
    fn hand_over(&mut self, link: Link, raw: &[u8]) {
        let handed = match self.config.channels_fd {
            Some(to) => sys::send_message(to, raw, Some(link.fd)).is_ok(),
            None => false,
        };
        if !handed {
            let err = CdiError {
                code: "channel_broken",
                msg: "this host's gateway carries no channels".to_owned(),
            };
            let _ = send_frame(link.fd, &refusal(&err));
        }
        sys::close(link.fd);
    }

    fn offer(&mut self, reg: &mut Registry, token: u64, offer: Offer) {
        if let Some(obj) = reg.objects.get(offer.key.as_str()) {
            if obj.owner.starts_with(&self.prefix) {
                // Our copy is on its way out (it is being sent straight back): it goes first.
                if let Some(link) = self.links.get_mut(&token) {
                    link.deadline = sys::monotonic_ns() + self.config.timeout_ns;
                    link.state = State::Parked(offer);
                }
                return;
            }
        }
        self.begin(reg, token, offer);
    }

    /// Take the offer (a segment for its payload) or refuse it (its payload is then dropped).
    fn begin(&mut self, reg: &mut Registry, token: u64, offer: Offer) {
        let size = offer.size;
        match self.segment_for(reg, &offer) {
            Ok(segment) => {
                if let Some(link) = self.links.get_mut(&token) {
                    link.deadline = sys::monotonic_ns() + self.config.timeout_ns;
                    link.state = State::Receiving {
                        offer,
                        segment,
                        got: 0,
                    };
                }
            }
            Err(err) => self.refuse(token, size, &err),
        }
    }

    fn segment_for(&self, reg: &mut Registry, offer: &Offer) -> Result<Segment, CdiError> {
        let uid = owner_uid(reg, &offer.to).ok_or_else(|| {
            CdiError::unknown_container(format!(
                "no live container {:?} is registered with this minion",
                offer.to
            ))
        })?;
        if reg.objects.contains_key(offer.key.as_str()) {
            return Err(CdiError::key_exists(format!(
                "an object with key {:?} already exists",
                offer.key
            )));
        }
        let cooperative = offer.isolation == Isolation::Cooperative;
        // Not zeroed: the payload overwrites `size` bytes (only its new owner's uid had them).
        reg.pool
            .acquire(offer.size, cooperative, &[], Some(uid), false)
            .map_err(|f| match f {
                Failure::Cdi(err) => err,
                Failure::Internal(text) => CdiError::internal(text),
            })
    }

    fn refuse(&mut self, token: u64, size: u64, err: &CdiError) {
        self.answers.push((token, refusal(err)));
        let Some(link) = self.links.get_mut(&token) else {
            return;
        };
        link.deadline = sys::monotonic_ns() + self.config.timeout_ns;
        link.state = State::Draining(size);
    }

    /// Payload bytes: into the segment (committing once all are in), or dropped.
    fn payload(&mut self, reg: &mut Registry, token: u64) -> Result<bool, String> {
        let timeout = self.config.timeout_ns;
        let link = self.links.get_mut(&token).ok_or("gone")?;
        let fd = link.fd;
        let done = match &mut link.state {
            State::Receiving {
                offer,
                segment,
                got,
            } => {
                let want = offer.size - *got;
                if !link.buffer.is_empty() {
                    let n = (want as usize).min(link.buffer.len());
                    segment.write_at(*got, &link.buffer[..n]);
                    link.buffer.drain(..n);
                    *got += n as u64;
                } else if want > 0 {
                    let n = segment.receive_from(fd, *got, want.min(BLOCK as u64));
                    if n == 0 {
                        return Err(format!(
                            "the link closed after {got} of {} bytes",
                            offer.size
                        ));
                    }
                    if n < 0 {
                        return again();
                    }
                    *got += n as u64;
                }
                link.deadline = sys::monotonic_ns() + timeout;
                *got == offer.size
            }
            State::Draining(left) => {
                if !link.buffer.is_empty() {
                    let n = (*left as usize).min(link.buffer.len());
                    link.buffer.drain(..n);
                    *left -= n as u64;
                } else if *left > 0 {
                    let mut scratch = vec![0u8; (*left as usize).min(CHUNK)];
                    // SAFETY: scratch is valid for its length.
                    let n = unsafe {
                        libc::recv(
                            fd,
                            scratch.as_mut_ptr().cast(),
                            scratch.len(),
                            libc::MSG_DONTWAIT,
                        )
                    };
                    if n == 0 {
                        return Err("the link closed".to_owned());
                    }
                    if n < 0 {
                        return again();
                    }
                    *left -= n as u64;
                }
                link.deadline = sys::monotonic_ns() + timeout;
                if *left == 0 {
                    link.state = State::Ready;
                    link.deadline = 0;
                }
                return Ok(true);
            }
            _ => return Ok(true),
        };
        if done {
            let State::Receiving { offer, segment, .. } =
                std::mem::replace(&mut link.state, State::Ready)
            else {
                return Ok(true);
            };
            link.deadline = 0;
            let answer = self.commit(reg, token, offer, segment);
            self.answers.push((token, answer));
        }
        Ok(true)
    }

    /// Every byte is in: the object exists from now on, owned by `to` (whose waiting access
    /// is granted at once), unless the sender gave the transfer up meanwhile.
    fn commit(
        &mut self,
        reg: &mut Registry,
        token: u64,
        offer: Offer,
        segment: Segment,
    ) -> Vec<u8> {
        let refused = |reg: &mut Registry, segment: Segment, err: CdiError| {
            reg.pool.discard(segment);
            refusal(&err)
        };
        if self.outcomes.get(&offer.xfer) == Some(&false) {
            let err = CdiError {
                code: "cdi_error",
                msg: "the sender gave this transfer up".to_owned(),
            };
            return refused(reg, segment, err);
        }
        let Some(uid) = owner_uid(reg, &offer.to) else {
            self.remember(offer.xfer.clone(), false);
            let err = CdiError::unknown_container(format!(
                "no live container {:?} is registered with this minion",
                offer.to
            ));
            return refused(reg, segment, err);
        };
        if reg.objects.contains_key(offer.key.as_str()) {
            self.remember(offer.xfer.clone(), false);
            let err =
                CdiError::key_exists(format!("an object with key {:?} already exists", offer.key));
            return refused(reg, segment, err);
        }
        let owner = reg
            .containers
            .get_key_value(offer.to.as_str())
            .map(|(cid, _)| cid.clone())
            .or_else(|| {
                reg.expected
                    .get_key_value(offer.to.as_str())
                    .map(|(c, _)| c.clone())
            })
            .unwrap_or_else(|| Rc::from(offer.to.as_str()));
        let creator = self
            .links
            .get(&token)
            .map_or_else(|| self.recovery.clone(), |l| l.name.clone());
        let now = sys::unix_time();
        // As if received by a container of ours (one change) and handed on (another).
        let generation = offer.generation.saturating_add(2).min((1 << 63) - 1);
        let obj = StoredObject {
            key: Rc::from(offer.key.as_str()),
            size: offer.size,
            segment,
            owner,
            creator,
            recovery: self.recovery.clone(),
            isolation: offer.isolation,
            generation,
            uids: UidSet::of(uid),
            readers: Vec::new(),
            live: false,
            created_at: now,
            updated_at: now,
            order: reg.next_order(),
        };
        reg.insert(obj);
        self.remember(offer.xfer, true);
        if let Some(sink) = reg.events.as_mut() {
            sink.arrived(&offer.key, &offer.theirs, generation);
        }
        if let Some(sender) = self.sender.as_mut() {
            sender.arrived(&offer.key, &offer.theirs);
        }
        let mut out = Vec::with_capacity(8);
        let mut enc = Enc(&mut out);
        enc.map(1);
        enc.str("ok");
        enc.bool(true);
        out
    }

    fn remember(&mut self, xfer: String, committed: bool) {
        if self.outcomes.insert(xfer.clone(), committed).is_none() {
            self.order.push_back(xfer);
            while self.order.len() > REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.outcomes.remove(&old);
                }
            }
        }
    }

    /// Send the answers owed (after the loop has sent the grants: a new owner waits for its
    /// object, the sending gateway only for word of it); a link that does not take one closes.
    pub fn flush(&mut self, reg: &mut Registry, epoll: &Epoll) {
        for (token, answer) in std::mem::take(&mut self.answers) {
            let Some(link) = self.links.get(&token) else {
                continue;
            };
            if let Err(why) = send_frame(link.fd, &answer) {
                self.close(reg, epoll, token, &why);
            }
        }
    }

    /// Close a link; a payload half received goes with it (no half object).
    pub fn close(&mut self, reg: &mut Registry, epoll: &Epoll, token: u64, why: &str) {
        let Some(link) = self.links.remove(&token) else {
            return;
        };
        if link.watched {
            epoll.unwatch(link.fd);
        }
        sys::close(link.fd);
        if let State::Receiving { segment, .. } = link.state {
            reg.pool.discard(segment);
        }
        if why != "closed" {
            log::info(format_args!("gateway link closed: {why}"));
        }
    }

    fn mac(&self, side: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        mac(&self.config.key, side, parts)
    }

    pub fn shutdown(&mut self, reg: &mut Registry, epoll: &Epoll) {
        let tokens: Vec<u64> = self.links.keys().copied().collect();
        for token in tokens {
            self.close(reg, epoll, token, "closed");
        }
        if let Some(sender) = self.sender.as_mut() {
            sender.shutdown(epoll);
        }
        epoll.unwatch(self.config.listen_fd);
        sys::close(self.config.listen_fd);
        if let Some(fd) = self.config.channels_fd {
            sys::close(fd);
        }
    }
}

fn again() -> Result<bool, String> {
    match sys::errno() {
        libc::EAGAIN | libc::EINTR => Ok(false),
        code => Err(sys::os_error_text(code)),
    }
}

/// More header bytes into the link's buffer; Ok(false) when none are there now.
fn fill(link: &mut Link) -> Result<bool, String> {
    let n = read_more(link.fd, &mut link.buffer);
    if n == 0 {
        return Err("closed".to_owned());
    }
    if n < 0 {
        return again();
    }
    Ok(true)
}

/// Read what the socket has (a chunk at most) onto the end of `buffer`; recv's result.
pub fn read_more(fd: RawFd, buffer: &mut Vec<u8>) -> isize {
    // Into spare capacity, not zeroed first: most reads find a few bytes, or none.
    buffer.reserve(CHUNK);
    let spare = buffer.spare_capacity_mut();
    // SAFETY: the spare capacity is valid for its length; recv writes at most that many.
    let n = unsafe {
        libc::recv(
            fd,
            spare.as_mut_ptr().cast(),
            spare.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n > 0 {
        // SAFETY: recv initialised the first n bytes of the spare capacity.
        unsafe { buffer.set_len(buffer.len() + n as usize) };
    }
    n
}

fn owner_uid(reg: &Registry, to: &str) -> Option<u32> {
    match reg.containers.get(to).and_then(|t| reg.conns.get(t)) {
        Some(conn) => Some(conn.uid),
        None => reg.expected.get(to).map(|e| e.saved.uid),
    }
}

fn text(request: Entries, name: &str) -> String {
    match Value::get(request, name) {
        Some(Value::Str(s)) => s.to_string(),
        _ => String::new(),
    }
}

fn parse_offer(request: Entries) -> Result<Offer, String> {
    let malformed = || "a malformed offer".to_owned();
    let xfer = match Value::get(request, "xfer") {
        Some(Value::Str(x)) => x.to_string(),
        _ => return Err(malformed()),
    };
    let size = match Value::get(request, "size") {
        Some(Value::Int(n)) => u64::try_from(n.get()).map_err(|_| malformed())?,
        _ => return Err(malformed()),
    };
    let key = check_key(Value::get(request, "key").unwrap_or(&NIL))
        .map_err(|e| e.msg)?
        .into_owned();
    let to = check_container_id(Value::get(request, "to").unwrap_or(&NIL))
        .map_err(|e| e.msg)?
        .into_owned();
    let isolation = match Value::field(request, "isolation") {
        Some(Value::Str(name)) => Isolation::parse(name).ok_or_else(malformed)?,
        _ => Isolation::Cooperative,
    };
    // The generation on the sender's host; an offer without one starts here at 1 (as if 0).
    let generation = match Value::field(request, "generation") {
        Some(Value::Int(g)) => u64::try_from(g.get())
            .ok()
            .filter(|g| (1..(1 << 63) - 1).contains(g))
            .unwrap_or(0),
        _ => 0,
    };
    let theirs = text(request, "recovery");
    // Never a gateway's: two gateways would pass it back and forth.
    let theirs = if theirs.starts_with("cdi-gateway.") {
        String::new()
    } else {
        theirs
    };
    Ok(Offer {
        xfer,
        key,
        size,
        to,
        isolation,
        generation,
        theirs,
    })
}

fn nonce(request: Entries) -> Result<Vec<u8>, String> {
    match Value::get(request, "nonce") {
        Some(Value::Bin(n)) if (NONCE..=64).contains(&n.len()) => Ok(n.to_vec()),
        _ => Err("a gateway handshake without a valid nonce".to_owned()),
    }
}

pub fn bin(enc: &mut Enc, data: &[u8]) {
    rmp::encode::write_bin(&mut *enc.0, data).expect("writing to a Vec cannot fail");
}

fn refusal(err: &CdiError) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + err.msg.len());
    let mut enc = Enc(&mut out);
    enc.map(3);
    refusal_fields(&mut enc, err);
    out
}

/// One frame (length, then the header) in one send; answers are small, so a link that does
/// not take one at once is closed rather than waited for.
pub fn send_frame(fd: RawFd, body: &[u8]) -> Result<(), String> {
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
    // SAFETY: frame is valid for its length.
    let sent = unsafe {
        libc::send(
            fd,
            frame.as_ptr().cast(),
            frame.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if sent == frame.len() as isize {
        Ok(())
    } else {
        Err("the link did not take an answer".to_owned())
    }
}

pub fn tune(fd: RawFd) {
    let one: libc::c_int = 1;
    let buffer: libc::c_int = 4 << 20;
    // SAFETY: setsockopt with pointers to ints of the right size.
    unsafe {
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            size,
        );
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&buffer as *const libc::c_int).cast(),
            size,
        );
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&buffer as *const libc::c_int).cast(),
            size,
        );
    }
}

pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        let rest = &mut bytes[filled..];
        // SAFETY: rest is valid for its length.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got > 0 {
            filled += got as usize;
        } else if sys::errno() != libc::EINTR {
            panic!("the kernel gives no random bytes for a handshake");
        }
    }
    bytes
}

/// Whether two byte strings are equal, in time that depends on their length only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// HMAC-SHA256 under `key` of the label, the side and the parts joined by NUL bytes.
pub fn mac(key: &[u8], side: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut message = Vec::with_capacity(128);
    message.extend_from_slice(LABEL);
    message.extend_from_slice(side);
    for part in parts {
        message.push(0);
        message.extend_from_slice(part);
    }
    hmac_sha256(key, &message)
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(message);
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

/// The key, read to its end from the pipe the launcher wrote it to.
pub fn read_key(fd: RawFd) -> Result<Vec<u8>, String> {
    let mut key = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        // SAFETY: chunk is valid for its length.
        let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n == 0 {
            break;
        }
        if n < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            return Err(format!(
                "cannot read the gateway key: {}",
                sys::last_os_error_text()
            ));
        }
        key.extend_from_slice(&chunk[..n as usize]);
    }
    sys::close(fd);
    if key.is_empty() {
        return Err("the gateway key is empty".to_owned());
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test cases 1, 2 and 6 (a key longer than a block).
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    fn offer_of(fields: &[(&str, rmpv::Value)]) -> Result<Offer, String> {
        let map = rmpv::Value::Map(
            fields
                .iter()
                .map(|(k, v)| (rmpv::Value::from(*k), v.clone()))
                .collect(),
        );
        let mut data = Vec::new();
        rmpv::encode::write_value(&mut data, &map).unwrap();
        let Ok(Value::Map(entries)) = unpack(&data) else {
            panic!("not a map");
        };
        parse_offer(&entries)
    }

    #[test]
    fn an_offer_is_read_as_the_protocol_writes_it() {
        let base = [
            ("op", rmpv::Value::from("offer")),
            ("xfer", rmpv::Value::from("x1")),
            ("key", rmpv::Value::from("k")),
            ("size", rmpv::Value::from(10)),
            ("to", rmpv::Value::from("b")),
            ("isolation", rmpv::Value::from("strict")),
            ("generation", rmpv::Value::from(2)),
            ("recovery", rmpv::Value::from("a")),
        ];
        let offer = offer_of(&base).unwrap();
        assert_eq!(
            (offer.xfer.as_str(), offer.key.as_str(), offer.to.as_str()),
            ("x1", "k", "b")
        );
        assert_eq!(
            (offer.size, offer.generation, offer.theirs.as_str()),
            (10, 2, "a")
        );
        assert_eq!(offer.isolation, Isolation::Strict);
        // Without a generation it starts afresh; a gateway's recovery container is never kept.
        let mut bare = base.to_vec();
        bare.retain(|(k, _)| *k != "generation");
        bare.push(("recovery", rmpv::Value::from("cdi-gateway.h1.recovery")));
        let offer = offer_of(&bare).unwrap();
        assert_eq!((offer.generation, offer.theirs.as_str()), (0, ""));
        for (field, wrong) in [
            ("size", rmpv::Value::from(-1)),
            ("xfer", rmpv::Value::from(5)),
            ("key", rmpv::Value::from("has space")),
            ("to", rmpv::Value::Nil),
        ] {
            let mut bad = base.to_vec();
            bad.push((field, wrong));
            assert!(offer_of(&bad).is_err(), "{field}");
        }
    }

    #[test]
    fn equal_strings_only_are_the_same() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd") && !same(b"abc", b"ab") && !same(b"", b"a"));
    }
}

//! What a minion knows about its connections and objects.

use std::os::fd::RawFd;
use std::rc::Rc;

use crate::protocol::Isolation;
use crate::segments::{Segment, UidSet};

/// A request id: any msgpack integer.
pub type RequestId = i128;

/// A small map keyed by request id, in insertion order (a connection has a request or two
/// deferred at a time).
#[derive(Debug)]
pub struct ByRequest<T>(Vec<(RequestId, T)>);

impl<T> Default for ByRequest<T> {
    fn default() -> Self {
        ByRequest(Vec::new())
    }
}

impl<T> ByRequest<T> {
    pub fn insert(&mut self, id: RequestId, value: T) {
        match self.0.iter_mut().find(|(k, _)| *k == id) {
            Some(slot) => slot.1 = value,
            None => self.0.push((id, value)),
        }
    }

    pub fn get(&self, id: RequestId) -> Option<&T> {
        self.0.iter().find(|(k, _)| *k == id).map(|(_, v)| v)
    }

    pub fn pop(&mut self, id: RequestId) -> Option<T> {
        let at = self.0.iter().position(|(k, _)| *k == id)?;
        Some(self.0.remove(at).1)
    }

    pub fn take(&mut self) -> Vec<(RequestId, T)> {
        std::mem::take(&mut self.0)
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// One client socket; at most one container registers through it.
#[derive(Debug)]
pub struct Connection {
    pub fd: RawFd,
    pub pid: i32,
    /// The process's start time (with a state folder: it names the process in the journal).
    pub start: u64,
    pub uid: u32,
    #[allow(dead_code)] // known from SO_PEERCRED like pid and uid; nothing uses it yet
    pub gid: u32,
    pub container: Option<Rc<str>>,
    /// When it registered, to close containers in registration order at shutdown.
    pub registered: u64,
    /// With a state folder: the digest of its container's resume token (`token.rs`).
    pub resume: String,
    /// Deferred `access` requests: request id -> key.
    pub waiting: ByRequest<Rc<str>>,
    /// Deferred `access` requests whose caller still maps a segment: request id -> its id.
    pub have: ByRequest<i128>,
    /// The registered process (SO_PEERPIDFD): its exit ends the connection even while a child
    /// it forked without exec keeps the socket open.
    pub pidfd: Option<RawFd>,
    /// A send to it failed: it gets nothing more and is closed once the request in hand is done.
    pub doomed: bool,
}

/// One CDI object: its memory, who owns it, and who gets it back if the owner dies.
#[derive(Debug)]
pub struct StoredObject {
    pub key: Rc<str>,
    pub size: u64,
    pub segment: Segment,
    pub owner: Rc<str>,
    pub creator: Rc<str>,
    pub recovery: Rc<str>,
    pub isolation: Isolation,
    pub generation: u64,
    /// Uids of every container that created, owned or was granted a share of the object:
    /// besides the minion's own uid and root, only they see it in `use` and `list`.
    pub uids: UidSet,
    pub created_at: f64,
    pub updated_at: f64,
    /// Containers holding a read share, in the order they were granted: while any does, nobody
    /// writes, transfers, resizes or destroys the object.
    pub readers: Vec<Rc<str>>,
    /// A live share (a channel's ring): its owner goes on writing while readers hold it.
    pub live: bool,
    /// Creation order: `list` and recovery follow it.
    pub order: u64,
}

/// A deferred request: an `access` (waits to own the object) or a `read` (waits for a share).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Waiter {
    pub token: u64,
    pub id: RequestId,
    pub read: bool,
    /// Asked in the compact form: granted in it.
    pub compact: bool,
}

impl StoredObject {
    pub fn shared(&self) -> bool {
        !self.readers.is_empty()
    }

    /// Whether its owner may write it now: nobody reads it, or its share is live.
    pub fn writable_by_owner(&self) -> bool {
        !self.shared() || self.live
    }

    /// Whether `container` may read the object now: its owner, or a reader of a share.
    pub fn readable_by(&self, container: &str) -> bool {
        *self.owner == *container || self.readers.iter().any(|r| **r == *container)
    }

    /// The fd to send with a grant: none if the caller still maps this very segment (it says
    /// so in `have`). Strict objects always send it, as before caching existed.
    pub fn grant_fd(&self, have: Option<i128>) -> Option<RawFd> {
        if have == Some(i128::from(self.segment.id)) && self.isolation == Isolation::Cooperative {
            None
        } else {
            Some(self.segment.fd)
        }
    }
}

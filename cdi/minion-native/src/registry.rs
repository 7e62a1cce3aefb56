//! What a minion holds and every change of an object's owner.
//!
//! The registry knows the connections, the registered containers, the objects and the deferred
//! `access` requests. It never touches a socket: a grant or a refusal it owes a waiting
//! container goes to `outbox`, which the loop sends before the reply to the request in hand
//! (so a new owner hears of its object before the old owner hears the transfer is done).

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::rc::Rc;

use crate::args::Config;
use crate::events::EventSink;
use crate::log;
use crate::msgpack::{Value, NIL};
use crate::objects::{Connection, RequestId, StoredObject};
use crate::protocol::{check_key, CdiError, Failure, Isolation};
use crate::replies::Body;
use crate::segments::{SegmentPool, UidSet};
use crate::sys;

pub type Entries<'v, 'a> = &'v [(Value<'a>, Value<'a>)];

/// A message owed to a connection: its token, the request id, the body, at most one fd.
pub type Outgoing = (u64, RequestId, Body, Option<RawFd>);

/// What a new object is to be.
pub struct ObjectSpec<'a> {
    pub key: &'a str,
    pub size: u64,
    pub isolation: Isolation,
    /// Who gets it if its owner's connection closes.
    pub recovery: Rc<str>,
    /// Segment ids the creator still maps: one of them is taken when idle.
    pub prefer: &'a [i128],
    /// False: the creator overwrites `size` bytes, so its own uid's old bytes may stay.
    pub zeroed: bool,
}

pub fn vanished() -> Failure {
    Failure::Internal("object vanished during the operation".to_owned())
}

pub struct Registry {
    pub config: Config,
    pub pool: SegmentPool,
    pub objects: HashMap<Rc<str>, StoredObject>,
    next_order: u64,
    /// Registered container id -> its connection's token.
    pub containers: HashMap<Rc<str>, u64>,
    pub bound_uid: HashMap<Rc<str>, u32>,
    /// key -> (connection, request id) of deferred `access` requests. Lists emptied by a
    /// cancel stay until the next grant (they keep the busy-poll going).
    pub waiters: HashMap<Rc<str>, Vec<(u64, RequestId)>>,
    pub conns: HashMap<u64, Connection>,
    next_registration: u64,
    pub outbox: Vec<Outgoing>,
    pub events: Option<EventSink>,
    /// Monotonic ns until which the loop polls instead of sleeping (a container waits).
    pub spin_until: u64,
}

impl Registry {
    pub fn new(config: Config, events: Option<EventSink>) -> Registry {
        Registry {
            pool: SegmentPool::new(config.memory_limit, config.idle_limit, sys::page_size()),
            config,
            objects: HashMap::new(),
            next_order: 0,
            containers: HashMap::new(),
            bound_uid: HashMap::new(),
            waiters: HashMap::new(),
            conns: HashMap::new(),
            next_registration: 0,
            outbox: Vec::new(),
            events,
            spin_until: 0,
        }
    }

    // ------------------------------------------------------------------ lookups
    pub fn container_of(&self, token: u64) -> Result<Rc<str>, Failure> {
        self.conns
            .get(&token)
            .and_then(|c| c.container.clone())
            .ok_or_else(|| Failure::Internal("connection is not registered".to_owned()))
    }

    pub fn lookup(&self, request: Entries) -> Result<&StoredObject, Failure> {
        let key = Value::get(request, "key");
        // Every stored key passed check_key when it was created: a hit needs no validation.
        if let Some(Value::Str(key)) = key {
            if let Some(obj) = self.objects.get(&**key) {
                return Ok(obj);
            }
        }
        let key = check_key(key.unwrap_or(&NIL))?;
        Err(CdiError::not_found(format!("no object with key {key:?}")).into())
    }

    /// The key of the requested object if the caller's container owns it, else `NotOwner`.
    pub fn owned(&self, token: u64, request: Entries) -> Result<Rc<str>, Failure> {
        let obj = self.lookup(request)?;
        let container = self.conns.get(&token).and_then(|c| c.container.as_ref());
        if container != Some(&obj.owner) {
            let who = container.map_or("(none)", |c| &**c);
            return Err(CdiError::not_owner(format!(
                "container {who} does not own {:?}",
                &*obj.key
            ))
            .into());
        }
        Ok(obj.key.clone())
    }

    // ------------------------------------------------------------------ objects
    /// A new object owned by the caller (not yet inserted).
    pub fn new_object(&mut self, token: u64, spec: ObjectSpec) -> Result<StoredObject, Failure> {
        let ObjectSpec {
            key,
            size,
            isolation,
            recovery,
            prefer,
            zeroed,
        } = spec;
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

    pub fn insert(&mut self, obj: StoredObject) -> Rc<str> {
        let key = obj.key.clone();
        self.objects.insert(key.clone(), obj);
        self.changed(&key);
        key
    }

    pub fn set_owner(&mut self, key: &Rc<str>, owner: Rc<str>) -> Result<(), Failure> {
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
        let Some(obj) = self.objects.get(key) else {
            return;
        };
        let mut keep = Vec::new();
        for (token, id) in waiters {
            match self.conns.get_mut(&token) {
                Some(conn) if !conn.doomed && conn.container.as_ref() == Some(&obj.owner) => {
                    conn.waiting.pop(id);
                    let fd = obj.grant_fd(conn.have.pop(id));
                    self.outbox.push((token, id, Body::grant(obj), fd));
                }
                _ => keep.push((token, id)),
            }
        }
        if keep.is_empty() {
            self.waiters.remove(key);
        } else {
            self.waiters.insert(key.clone(), keep);
        }
    }

    pub fn remove(&mut self, key: &Rc<str>) {
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
        let destroyed = CdiError::not_found(format!("{:?} was destroyed", &**key));
        for (token, id) in self.waiters.remove(key).unwrap_or_default() {
            if let Some(conn) = self.conns.get_mut(&token) {
                conn.waiting.pop(id);
                conn.have.pop(id);
            }
            let body = Body::Error(destroyed.clone());
            self.outbox.push((token, id, body, None));
        }
        if let Some(sink) = self.events.as_mut() {
            sink.removed(key);
        }
    }

    pub fn changed(&mut self, key: &str) {
        if let (Some(sink), Some(obj)) = (self.events.as_mut(), self.objects.get(key)) {
            sink.changed(&obj.key, obj.size, &obj.owner, obj.generation);
        }
    }

    // ------------------------------------------------------------------ containers
    pub fn register(&mut self, token: u64, cid: Rc<str>) {
        self.next_registration += 1;
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.container = Some(cid.clone());
        conn.registered = self.next_registration;
        let (pid, uid) = (conn.pid, conn.uid);
        self.containers.insert(cid.clone(), token);
        if let Some(sink) = self.events.as_mut() {
            sink.registered(&cid, pid, uid);
        }
    }

    /// Defer an `access` until the connection's container owns `key`.
    pub fn wait(&mut self, token: u64, id: RequestId, key: Rc<str>, have: Option<i128>) {
        let budget = self.config.busy_poll_us.saturating_mul(1000);
        self.spin_until = sys::monotonic_ns().saturating_add(budget);
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.waiting.insert(id, key.clone());
            if let Some(have) = have {
                conn.have.insert(id, have);
            }
        }
        self.waiters.entry(key).or_default().push((token, id));
    }

    /// Withdraw a deferred access; whether one was waiting.
    pub fn cancel(&mut self, token: u64, id: RequestId) -> bool {
        let Some(conn) = self.conns.get_mut(&token) else {
            return false;
        };
        let Some(key) = conn.waiting.pop(id) else {
            return false;
        };
        conn.have.pop(id);
        if let Some(waiters) = self.waiters.get_mut(&key) {
            if let Some(at) = waiters.iter().position(|&(t, i)| t == token && i == id) {
                waiters.remove(at);
            }
        }
        true
    }

    /// A connection closed: forget it and its deferred accesses; its objects go to their
    /// recovery containers (`reclaim`) or stay for the minion's shutdown. Returns its fd.
    pub fn disconnect(&mut self, token: u64, reclaim: bool) -> Option<RawFd> {
        let mut conn = self.conns.remove(&token)?;
        for (id, key) in conn.waiting.take() {
            if let Some(waiters) = self.waiters.get_mut(&key) {
                if let Some(at) = waiters.iter().position(|&(t, i)| t == token && i == id) {
                    waiters.remove(at);
                }
            }
        }
        conn.have.clear();
        if let Some(cid) = conn.container.take() {
            if self.containers.get(&cid) == Some(&token) {
                self.containers.remove(&cid);
                if let Some(sink) = self.events.as_mut() {
                    sink.gone(&cid);
                }
                if reclaim {
                    self.recover_objects_of(&cid);
                }
            }
        }
        Some(conn.fd)
    }

    /// Objects of a dead owner go back to their recovery container, else are reclaimed. One
    /// at a time: one that cannot move (a strict object needs a fresh segment, and memory may
    /// have run out) is reclaimed, and the rest are still recovered.
    fn recover_objects_of(&mut self, dead: &Rc<str>) {
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
                    // set_owner fails only before the hand-over.
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
    }

    /// Registered connections' tokens in registration order (closed in it at shutdown).
    pub fn registered_tokens(&self) -> Vec<u64> {
        let mut registered: Vec<(u64, u64)> = self
            .containers
            .values()
            .filter_map(|t| self.conns.get(t).map(|conn| (conn.registered, *t)))
            .collect();
        registered.sort_unstable();
        registered.into_iter().map(|(_, t)| t).collect()
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

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
use crate::journal::{Journal, Record, SavedContainer, SavedObject};
use crate::log;
use crate::msgpack::{Value, NIL};
use crate::objects::{Connection, RequestId, StoredObject, Waiter};
use crate::protocol::{check_key, CdiError, Failure, Isolation};
use crate::recovery;
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
    /// 1, or the generation a gateway carries an object on with from another host.
    pub generation: u64,
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
    /// The minion's effective uid.
    pub own_uid: u32,
    /// Connections that registered in the request in hand: the loop watches their processes.
    pub registered_now: Vec<u64>,
    /// key -> deferred `access` and `read` requests. Lists emptied by a cancel stay until the
    /// next grant (they keep the busy-poll going).
    pub waiters: HashMap<Rc<str>, Vec<Waiter>>,
    /// Deferred accesses of keys that did not exist: (deadline ns, token, request id, key).
    pub arrivals: Vec<(u64, u64, RequestId, Rc<str>)>,
    pub conns: HashMap<u64, Connection>,
    next_registration: u64,
    pub outbox: Vec<Outgoing>,
    pub events: Option<EventSink>,
    /// Monotonic ns until which the loop polls instead of sleeping (a container waits).
    pub spin_until: u64,
    /// With a state folder: the journal, what changed since it was last written (objects;
    /// containers registered or gone), and this boot of the host.
    pub journal: Option<Journal>,
    pub dirty: Vec<Rc<str>>,
    pub dirty_containers: Vec<(Rc<str>, bool)>,
    pub boot_id: String,
    /// The id of the objects this minion holds (`register`'s `store`) with a state folder,
    /// carried on by its journal; empty without one (the objects end with the process).
    pub store: String,
    /// With a state folder: how many minions took its store over from another (this one
    /// included; 0 when this one began it), and the objects this one found again at start.
    pub restarts: u64,
    pub kept_objects: u64,
    /// After a restart: containers registered with the minion that went before, not yet
    /// registered again (their processes run, or cannot be seen from here).
    pub expected: HashMap<Rc<str>, Expected>,
    /// Containers whose process ended while no minion ran (or before they came back): their
    /// objects go to recovery once the others had `resume_until` to come back.
    pub pending_gone: Vec<SavedContainer>,
    pub resume_until: u64,
    /// The same for the containers it cannot see (`--resume-grace-unseen-ms`).
    pub resume_unseen_until: u64,
    /// With the minion sending to other hosts: the container that holds an object meanwhile,
    /// and the transfers to start after the request in hand (`sending.rs`).
    pub holder: Option<Rc<str>>,
    pub departures: Vec<crate::sending::Departure>,
    /// After a restart: objects the minion before was sending to another host. Whether that
    /// host kept them is not known here; they follow the recovery rule with the containers
    /// that ended meanwhile.
    pub stranded: Vec<Rc<str>>,
}

/// A container of the minion that went before whose process may still come back.
#[derive(Debug)]
pub struct Expected {
    pub saved: SavedContainer,
    /// Watched until it comes back; None: a process not seen from here (pid 0).
    pub pidfd: Option<RawFd>,
    /// The loop's token for the pidfd.
    pub token: u64,
}

impl Registry {
    pub fn new(config: Config, events: Option<EventSink>) -> Registry {
        Registry {
            pool: SegmentPool::new(config.memory_limit, config.idle_limit, sys::page_size()),
            config,
            objects: HashMap::new(),
            next_order: 0,
            containers: HashMap::new(),
            // SAFETY: geteuid cannot fail.
            own_uid: unsafe { libc::geteuid() },
            registered_now: Vec::new(),
            waiters: HashMap::new(),
            arrivals: Vec::new(),
            conns: HashMap::new(),
            next_registration: 0,
            outbox: Vec::new(),
            events,
            spin_until: 0,
            journal: None,
            dirty: Vec::new(),
            dirty_containers: Vec::new(),
            boot_id: String::new(),
            store: String::new(),
            restarts: 0,
            kept_objects: 0,
            expected: HashMap::new(),
            pending_gone: Vec::new(),
            resume_until: 0,
            resume_unseen_until: 0,
            holder: None,
            departures: Vec::new(),
            stranded: Vec::new(),
        }
    }

    /// The creation order of a new object.
    pub fn next_order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order
    }

    /// Count on from a restored object's creation order.
    pub fn restore_order(&mut self, order: u64) {
        self.next_order = self.next_order.max(order);
    }

    /// Count on from a restored container's registration order.
    pub fn restore_registration(&mut self, registered: u64) {
        self.next_registration = self.next_registration.max(registered);
    }

    // ------------------------------------------------------------------ journal
    /// Note that `key` changed (or is gone), for the journal.
    pub fn mark(&mut self, key: &Rc<str>) {
        if self.journal.is_some() {
            self.dirty.push(key.clone());
        }
    }

    /// Write what changed to the journal, before any reply or grant that tells of it.
    pub fn persist(&mut self) {
        let Some(journal) = self.journal.as_mut() else {
            return;
        };
        if self.pool.next_id >= journal.ids {
            journal.add(&Record::Ids(self.pool.next_id + crate::journal::ID_BLOCK));
        }
        for (cid, registered) in std::mem::take(&mut self.dirty_containers) {
            let record = match self.containers.get(&cid).and_then(|t| self.conns.get(t)) {
                Some(conn) if registered => Record::Registered(SavedContainer {
                    id: cid.to_string(),
                    pid: conn.pid,
                    start: conn.start,
                    uid: conn.uid,
                    registered: conn.registered,
                    resume: conn.resume.clone(),
                }),
                _ => Record::Gone(cid.to_string()),
            };
            journal.add(&record);
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for key in dirty {
            journal.add(&match self.objects.get(&key) {
                Some(obj) => Record::Put(saved(obj)),
                None => Record::Del(key.to_string()),
            });
        }
        let written = if journal.wants_compaction() {
            let path = journal.path().to_path_buf();
            let records = self.snapshot();
            Journal::rewrite(&path, &records).map(|fresh| self.journal = Some(fresh))
        } else {
            journal.flush()
        };
        let Some(journal) = self.journal.as_ref() else {
            return;
        };
        if let Err(err) = written {
            // A journal that misses a change could give an object back to a former owner:
            // none is better. A restart then loses the objects, as without a state folder.
            let path = journal.path().to_path_buf();
            log::error(format_args!(
                "cannot write the journal {} ({err}); removing it: objects will not outlive \
                 this minion",
                path.display()
            ));
            let _ = std::fs::remove_file(&path);
            self.journal = None;
        }
    }

    /// Everything the journal needs, as records (its snapshot).
    pub fn snapshot(&self) -> Vec<Record> {
        let mut records = vec![Record::Boot {
            boot_id: self.boot_id.clone(),
            store: self.store.clone(),
            restarts: self.restarts,
        }];
        let reserved = self.journal.as_ref().map_or(0, |j| j.ids);
        records.push(Record::Ids(
            reserved.max(self.pool.next_id + crate::journal::ID_BLOCK),
        ));
        for (cid, token) in &self.containers {
            if let Some(conn) = self.conns.get(token) {
                records.push(Record::Registered(SavedContainer {
                    id: cid.to_string(),
                    pid: conn.pid,
                    start: conn.start,
                    uid: conn.uid,
                    registered: conn.registered,
                    resume: conn.resume.clone(),
                }));
            }
        }
        for expected in self.expected.values() {
            records.push(Record::Registered(expected.saved.clone()));
        }
        // Dead ones stay in the journal until their objects are recovered.
        records.extend(self.pending_gone.iter().cloned().map(Record::Registered));
        let mut objects: Vec<&StoredObject> = self.objects.values().collect();
        objects.sort_unstable_by_key(|o| o.order);
        records.extend(objects.into_iter().map(|o| Record::Put(saved(o))));
        records
    }

    // ------------------------------------------------------------------ lookups
    pub fn container_of(&self, token: u64) -> Result<Rc<str>, Failure> {
        self.conns
            .get(&token)
            .and_then(|c| c.container.clone())
            .ok_or_else(|| Failure::Internal("connection is not registered".to_owned()))
    }

    /// The requested object, if the connection may see it (`waiting`: or may wait for it: an
    /// access or read that waits is answered when granted, so it is deferred even for an
    /// object the caller cannot see yet).
    pub fn lookup(
        &self,
        request: Entries,
        token: u64,
        waiting: bool,
    ) -> Result<&StoredObject, Failure> {
        let key = Value::get(request, "key");
        // Every stored key passed check_key when it was created: a hit needs no validation.
        if let Some(Value::Str(key)) = key {
            if let Some(obj) = self.objects.get(&**key) {
                if waiting || self.visible(token, obj) {
                    return Ok(obj);
                }
            }
        }
        let key = check_key(key.unwrap_or(&NIL))?;
        Err(CdiError::not_found(format!("no object with key {key:?}")).into())
    }

    /// Whether the connection may see `obj`: the minion's uid and root see everything, others
    /// the objects their uid created, owned or read, or whose recovery container they are.
    pub fn visible(&self, token: u64, obj: &StoredObject) -> bool {
        let Some(conn) = self.conns.get(&token) else {
            return false;
        };
        let container = conn.container.as_deref();
        obj.uids.contains(conn.uid)
            || self.is_operator(conn.uid)
            || container
                .is_some_and(|c| *obj.recovery == *c || obj.readers.iter().any(|r| **r == *c))
    }

    /// The minion's own uid and root: they see every object and container.
    pub fn is_operator(&self, uid: u32) -> bool {
        uid == 0 || uid == self.own_uid
    }

    /// The key of the requested object if the caller's container owns it, else `NotOwner`.
    pub fn owned(&self, token: u64, request: Entries) -> Result<Rc<str>, Failure> {
        let obj = self.lookup(request, token, false)?;
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
            generation,
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
            generation,
            uids: UidSet::of(uid),
            readers: Vec::new(),
            live: false,
            created_at: now,
            updated_at: now,
            order: self.next_order,
        })
    }

    pub fn insert(&mut self, obj: StoredObject) -> Rc<str> {
        let key = obj.key.clone();
        self.objects.insert(key.clone(), obj);
        self.grant_waiters(&key); // its owner may have waited for it to arrive
        self.changed(&key);
        key
    }

    /// Make `owner` the owner. A strict object moves to a fresh segment first, unless it is
    /// shared: readers map it then, and it moves when the share ends.
    pub fn set_owner(&mut self, key: &Rc<str>, owner: Rc<str>) -> Result<(), Failure> {
        let obj = self.objects.get_mut(key).ok_or_else(vanished)?;
        if obj.isolation == Isolation::Strict && owner != obj.owner && !obj.shared() {
            move_to_fresh_segment(&mut self.pool, obj)?;
        }
        let uid = match self.containers.get(&owner).and_then(|t| self.conns.get(t)) {
            Some(conn) => Some(conn.uid),
            None => self.expected.get(&owner).map(|e| e.saved.uid),
        };
        if let Some(uid) = uid {
            obj.uids.add(uid);
            obj.segment.uids.add(uid);
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

    /// Answer the deferred requests of `key` that can be granted now: an `access` of its
    /// owner while nobody reads it, a `read` of its owner or of a reader of its share.
    pub fn grant_waiters(&mut self, key: &Rc<str>) {
        let Some(waiters) = self.waiters.get_mut(key) else {
            return;
        };
        if waiters.is_empty() {
            return;
        }
        let waiters = std::mem::take(waiters);
        let Some(obj) = self.objects.get_mut(key) else {
            return;
        };
        let mut keep = Vec::new();
        for waiter in waiters {
            let conn = self.conns.get_mut(&waiter.token);
            let granted = conn.as_ref().is_some_and(|conn| {
                let Some(container) = conn.container.as_deref() else {
                    return false;
                };
                !conn.doomed
                    && if waiter.read {
                        obj.readable_by(container)
                    } else {
                        *obj.owner == *container && obj.writable_by_owner()
                    }
            });
            let Some(conn) = conn.filter(|_| granted) else {
                keep.push(waiter);
                continue;
            };
            conn.waiting.pop(waiter.id);
            let have = conn.have.pop(waiter.id);
            let fd = if waiter.read {
                obj.uids.add(conn.uid);
                obj.segment.uids.add(conn.uid);
                if self.journal.is_some() {
                    self.dirty.push(key.clone());
                }
                match obj.segment.read_only_fd() {
                    Ok(fd) => Some(fd),
                    Err(Failure::Cdi(err)) => {
                        self.outbox
                            .push((waiter.token, waiter.id, Body::Error(err), None));
                        continue;
                    }
                    Err(Failure::Internal(text)) => {
                        log::error(format_args!("{text}"));
                        let err = CdiError::internal(text);
                        self.outbox
                            .push((waiter.token, waiter.id, Body::Error(err), None));
                        continue;
                    }
                }
            } else {
                obj.grant_fd(have)
            };
            let body = Body::grant(obj).compact(waiter.compact);
            self.outbox.push((waiter.token, waiter.id, body, fd));
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
        self.mark(key);
        let StoredObject {
            segment,
            size,
            isolation,
            ..
        } = obj;
        match isolation {
            Isolation::Strict => self.pool.discard(segment),
            Isolation::Cooperative => self.pool.release(segment, size),
        }
        let destroyed = CdiError::not_found(format!("{:?} was destroyed", &**key));
        for waiter in self.waiters.remove(key).unwrap_or_default() {
            if let Some(conn) = self.conns.get_mut(&waiter.token) {
                conn.waiting.pop(waiter.id);
                conn.have.pop(waiter.id);
            }
            let body = Body::Error(destroyed.clone());
            self.outbox.push((waiter.token, waiter.id, body, None));
        }
        if let Some(sink) = self.events.as_mut() {
            sink.removed(key);
        }
    }

    pub fn changed(&mut self, key: &str) {
        if let Some(obj) = self.objects.get(key) {
            if let Some(sink) = self.events.as_mut() {
                sink.changed(
                    &obj.key,
                    obj.size,
                    &obj.owner,
                    obj.generation,
                    obj.created_at,
                );
            }
            if self.journal.is_some() {
                self.dirty.push(obj.key.clone());
            }
        }
    }

    // ------------------------------------------------------------------ containers
    /// Bind the connection to `cid`. With a state folder, the container keeps the resume
    /// token whose digest `kept` is (it came back with it), or gets a new one: returned, for
    /// the reply only.
    pub fn register(&mut self, token: u64, cid: Rc<str>, kept: String) -> Option<String> {
        self.next_registration += 1;
        let conn = self.conns.get_mut(&token)?;
        conn.container = Some(cid.clone());
        conn.registered = self.next_registration;
        let mut given = None;
        if self.journal.is_some() {
            conn.resume = kept;
            if conn.resume.is_empty() {
                given = crate::token::new_token();
                conn.resume = given
                    .as_deref()
                    .map(crate::token::digest)
                    .unwrap_or_default();
            }
        }
        let (pid, uid) = (conn.pid, conn.uid);
        if self.journal.is_some() {
            conn.start = sys::process_start(conn.pid).unwrap_or(0);
            self.dirty_containers.push((cid.clone(), true));
        }
        self.containers.insert(cid.clone(), token);
        self.registered_now.push(token);
        if let Some(sink) = self.events.as_mut() {
            sink.registered(&cid, pid, uid);
        }
        given
    }

    /// Defer an `access` (until the connection's container owns `key` and nobody reads it) or
    /// a `read` (until it may read it).
    pub fn wait(&mut self, waiter: Waiter, key: Rc<str>, have: Option<i128>) {
        let budget = self.config.busy_poll_us.saturating_mul(1000);
        self.spin_until = sys::monotonic_ns().saturating_add(budget);
        self.defer(waiter, key, have);
    }

    fn defer(&mut self, waiter: Waiter, key: Rc<str>, have: Option<i128>) {
        let Waiter { token, id, .. } = waiter;
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.waiting.insert(id, key.clone());
            if let Some(have) = have {
                conn.have.insert(id, have);
            }
        }
        self.waiters.entry(key).or_default().push(waiter);
    }

    /// Defer an `access` of a key that does not exist yet (`wait`), for `budget_ns`: if no
    /// object of that key exists by then, it is answered `not_found` (`expire_arrivals`).
    pub fn wait_arriving(
        &mut self,
        waiter: Waiter,
        key: Rc<str>,
        have: Option<i128>,
        budget_ns: u64,
    ) {
        let until = sys::monotonic_ns().saturating_add(budget_ns);
        self.arrivals
            .push((until, waiter.token, waiter.id, key.clone()));
        // No busy-poll: the object comes over a link, whose bytes wake the loop anyway, and a
        // poll would take a core from the processes sending it.
        self.defer(waiter, key, have);
    }

    /// When the next deferred access of a missing key runs out (monotonic ns).
    pub fn next_arrival_deadline(&self) -> Option<u64> {
        self.arrivals.iter().map(|a| a.0).min()
    }

    /// Answer `not_found` to the deferred accesses whose key still does not exist at their
    /// deadline (an object created meanwhile keeps them waiting, as any access).
    pub fn expire_arrivals(&mut self) {
        if self.arrivals.is_empty() {
            return;
        }
        let now = sys::monotonic_ns();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.arrivals)
            .into_iter()
            .partition(|a| a.0 <= now);
        self.arrivals = later;
        for (_, token, id, key) in due {
            if self.objects.contains_key(&key) {
                continue;
            }
            let waited = self
                .conns
                .get(&token)
                .and_then(|c| c.waiting.get(id))
                .is_some_and(|k| **k == *key);
            if !waited || !self.cancel(token, id) {
                continue;
            }
            if self.waiters.get(&key).is_some_and(Vec::is_empty) {
                self.waiters.remove(&key);
            }
            let err = CdiError::not_found(format!("no object with key {:?} arrived", &*key));
            self.outbox.push((token, id, Body::Error(err), None));
        }
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
            waiters.retain(|w| !(w.token == token && w.id == id));
        }
        true
    }

    /// A connection closed: forget it and its deferred accesses; its objects go to their
    /// recovery containers (`reclaim`) or stay for the minion's shutdown. Returns its fd.
    pub fn disconnect(&mut self, token: u64, reclaim: bool) -> Option<RawFd> {
        let mut conn = self.conns.remove(&token)?;
        for (id, key) in conn.waiting.take() {
            if let Some(waiters) = self.waiters.get_mut(&key) {
                waiters.retain(|w| !(w.token == token && w.id == id));
            }
        }
        conn.have.clear();
        if let Some(cid) = conn.container.take() {
            if self.containers.get(&cid) == Some(&token) {
                self.containers.remove(&cid);
                if let Some(sink) = self.events.as_mut() {
                    sink.gone(&cid);
                }
                if self.journal.is_some() && reclaim {
                    self.dirty_containers.push((cid.clone(), false));
                }
                if reclaim {
                    recovery::recover_objects_of(self, &cid);
                    recovery::release_shares_of(self, &cid);
                }
            }
        }
        Some(conn.fd)
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

/// An object as the journal keeps it.
pub fn saved(obj: &StoredObject) -> SavedObject {
    SavedObject {
        key: obj.key.to_string(),
        size: obj.size,
        segment: obj.segment.id,
        capacity: obj.segment.capacity,
        isolation: obj.isolation,
        owner: obj.owner.to_string(),
        creator: obj.creator.to_string(),
        recovery: obj.recovery.to_string(),
        generation: obj.generation,
        uids: obj.uids.as_slice().to_vec(),
        segment_uids: obj.segment.uids.as_slice().to_vec(),
        readers: obj.readers.iter().map(|r| r.to_string()).collect(),
        live: obj.live,
        created_at: obj.created_at,
        updated_at: obj.updated_at,
        order: obj.order,
    }
}

/// Strict isolation: copy into a new segment and truncate the one the old owner mapped.
pub fn move_to_fresh_segment(
    pool: &mut SegmentPool,
    obj: &mut StoredObject,
) -> Result<(), Failure> {
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

//! Concurrent read-only sharing: `share`, `read` and `release` (`cdi/PROTOCOL.md`).
//!
//! The owner grants several containers read access at once. While any of them holds its share,
//! nobody writes: the owner's `access` waits (or is refused with `shared`), and its `transfer`,
//! `resize` and `destroy` are refused with `shared`. Readers get a read-only fd (opened
//! through /proc/self/fd, so the kernel refuses a writable mapping of it). When the last reader
//! releases (or dies), the object is its owner's alone again. A *live* share (a channel's
//! ring) lets the owner go on writing while readers hold it; transfer, resize and destroy
//! still wait for their release.

use std::rc::Rc;

use crate::msgpack::Value;
use crate::objects::{RequestId, StoredObject, Waiter};
use crate::ops::{arg, optional_bool, Reply};
use crate::protocol::{check_container_ids, CdiError, Failure, Isolation};
use crate::recovery;
use crate::registry::{move_to_fresh_segment, vanished, Entries, Registry};
use crate::replies::Body;

/// The refusal of a write, transfer, resize or destroy while readers hold the object.
pub fn shared_error(obj: &StoredObject) -> CdiError {
    CdiError::shared(format!(
        "{:?} is shared with {} reader(s); it is writable, and can be transferred, resized or \
         destroyed, once they have released it",
        &*obj.key,
        obj.readers.len()
    ))
}

/// The key of the requested object if the caller owns it and nobody reads it.
pub fn owned_alone(reg: &Registry, token: u64, request: Entries) -> Result<Rc<str>, Failure> {
    let key = reg.owned(token, request)?;
    let obj = reg.objects.get(&key).ok_or_else(vanished)?;
    if obj.shared() {
        return Err(shared_error(obj).into());
    }
    Ok(key)
}

pub fn share(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let key = reg.owned(token, request)?;
    let names = check_container_ids(arg(request, "readers"))?;
    let live = optional_bool(request, "live", false)?;
    let owner = reg.container_of(token)?;
    let mut readers: Vec<Rc<str>> = Vec::with_capacity(names.len());
    for name in &names {
        let known = reg
            .containers
            .get_key_value(&**name)
            .map(|(cid, _)| cid)
            .or_else(|| reg.expected.get_key_value(&**name).map(|(cid, _)| cid)); // not back yet
        let Some(cid) = known else {
            return Err(CdiError::unknown_container(format!(
                "no live container {name:?} is registered with this minion"
            ))
            .into());
        };
        if *cid == owner {
            return Err(CdiError::invalid_argument(
                "the owner reads its own object without a share; name other containers",
            )
            .into());
        }
        if !readers.contains(cid) {
            readers.push(cid.clone());
        }
    }
    let obj = reg.objects.get_mut(&key).ok_or_else(vanished)?;
    if obj.shared() && obj.live != live {
        return Err(CdiError::invalid_argument(format!(
            "{:?} is already shared {}; a second share must be of the same kind",
            &*obj.key,
            if obj.live {
                "live"
            } else {
                "read-only (not live)"
            }
        ))
        .into());
    }
    obj.live = live;
    if !obj.shared() && obj.isolation == Isolation::Strict {
        // The owner's mapping is of the old segment, which is truncated: it cannot write on.
        move_to_fresh_segment(&mut reg.pool, obj)?;
    }
    for reader in readers {
        if !obj.readers.contains(&reader) {
            let uid = match reg.containers.get(&reader).and_then(|t| reg.conns.get(t)) {
                Some(conn) => conn.uid,
                None => reg
                    .expected
                    .get(&reader)
                    .map_or(reg.own_uid, |e| e.saved.uid),
            };
            obj.uids.add(uid); // it sees the object now
            obj.readers.push(reader);
        }
    }
    let body = Body::Readers(obj.readers.clone());
    reg.mark(&key);
    reg.grant_waiters(&key);
    Ok(Some((body, None)))
}

pub fn read(
    reg: &mut Registry,
    token: u64,
    id: RequestId,
    request: Entries,
) -> Result<Reply, Failure> {
    let wait = optional_bool(request, "wait", true)?;
    let key = reg.lookup(request, token, wait)?.key.clone();
    let container = reg.container_of(token)?;
    let obj = reg.objects.get_mut(&key).ok_or_else(vanished)?;
    if obj.readable_by(&container) {
        let fd = obj.segment.read_only_fd()?;
        if let Some(conn) = reg.conns.get(&token) {
            obj.uids.add(conn.uid);
            obj.segment.uids.add(conn.uid);
        }
        let reply = (Body::grant(obj), Some(fd));
        reg.mark(&key);
        return Ok(Some(reply));
    }
    if !wait {
        return Err(CdiError::not_owner(format!(
            "container {container} neither owns {:?} nor holds a share of it",
            &*key
        ))
        .into());
    }
    if Value::field(request, "id").is_none() {
        return Err(
            CdiError::protocol("a request that waits needs a request id to answer it by").into(),
        );
    }
    let waiter = Waiter {
        token,
        id,
        read: true,
        compact: false,
    };
    reg.wait(waiter, key, None);
    Ok(None)
}

pub fn release(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let key = reg.lookup(request, token, false)?.key.clone();
    let container = reg.container_of(token)?;
    let released = recovery::release_share(reg, &key, &container);
    let readers = reg.objects.get(&key).map_or(0, |o| o.readers.len());
    Ok(Some((Body::Released { released, readers }, None)))
}

//! The minion's operations, one function each, as `cdi/PROTOCOL.md` defines them.
//!
//! Each takes the registry, the caller's connection token and the decoded request, and answers
//! a reply body with at most one fd, or `None` when the reply is deferred (a waiting `access`).

use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use crate::args::uid_for;
use crate::compact;
use crate::log;
use crate::msgpack::{unpack, Value, NIL};
use crate::objects::{RequestId, StoredObject, Waiter};
use crate::protocol::{
    check_container_id, check_key, check_segment_ids, check_size, CdiError, Failure, Isolation, Op,
};
use crate::registry::{vanished, Entries, ObjectSpec, Registry};
use crate::replies::Body;
use crate::segments::SegmentPool;
use crate::sharing;

/// What an operation answers: a body and at most one fd; `None` defers the reply (`access`).
pub type Reply = Option<(Body, Option<RawFd>)>;

pub fn arg<'v, 'a>(request: Entries<'v, 'a>, name: &str) -> &'v Value<'a> {
    Value::get(request, name).unwrap_or(&NIL)
}

/// An optional boolean field: absent or nil gives `default`.
pub fn optional_bool(request: Entries, name: &str, default: bool) -> Result<bool, CdiError> {
    match Value::field(request, name) {
        None => Ok(default),
        Some(Value::Bool(value)) => Ok(*value),
        Some(other) => Err(CdiError::invalid_argument(format!(
            "{name} must be true or false, got {}",
            other.kind()
        ))),
    }
}

/// An optional integer field.
fn optional_int(request: Entries, name: &str) -> Result<Option<i128>, CdiError> {
    match Value::field(request, name) {
        None => Ok(None),
        Some(Value::Int(value)) => Ok(Some(value.get())),
        Some(other) => Err(CdiError::invalid_argument(format!(
            "{name} must be an integer, got {}",
            other.kind()
        ))),
    }
}

/// One message from the connection `token`: decode it, check its id, run its operation. The
/// reply to send (with the id to send it under), or `None` when it is deferred.
pub fn answer(reg: &mut Registry, token: u64, message: &[u8]) -> (RequestId, Reply) {
    let refused = |err| (0, Some((Body::Error(err), None)));
    let compact = compact::is_compact(message);
    let decoded = if compact {
        compact::decode(message)
    } else {
        match unpack(message) {
            Ok(Value::Map(entries)) => Ok(entries),
            Ok(_) => return refused(CdiError::protocol("a message must be a map")),
            Err(text) => Err(text),
        }
    };
    let request = match decoded {
        Ok(entries) => entries,
        Err(text) => return refused(CdiError::protocol(format!("undecodable message: {text}"))),
    };
    let id = match Value::field(&request, "id") {
        None => 0,
        Some(Value::Int(i)) => i.get(),
        Some(_) => return refused(CdiError::protocol("request id must be an integer")),
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        dispatch(reg, token, id, &request, compact)
    }));
    let text = match outcome {
        Ok(Ok(reply)) => return (id, reply),
        Ok(Err(Failure::Cdi(err))) => return (id, Some((Body::Error(err), None))),
        Ok(Err(Failure::Internal(text))) => text,
        Err(panic) => panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_owned()),
    };
    // A bug must not take the whole host's objects down: log it, tell the caller.
    let pid = reg.conns.get(&token).map_or(0, |c| c.pid);
    log::error(format_args!(
        "minion failed on a request from pid {pid}: {text}"
    ));
    (id, Some((Body::Error(CdiError::internal(text)), None)))
}

/// Check registration and run the operation `op` names; `compact`: the request came in the
/// compact form, and a success is answered in it.
fn dispatch(
    reg: &mut Registry,
    token: u64,
    id: RequestId,
    request: Entries,
    compact: bool,
) -> Result<Reply, Failure> {
    let op = match Value::get(request, "op") {
        Some(Value::Str(name)) => Op::parse(name)
            .ok_or_else(|| CdiError::protocol(format!("unknown operation {name:?}")))?,
        other => {
            let kind = other.map_or("nothing", Value::kind);
            return Err(
                CdiError::protocol(format!("op must name an operation, got {kind}")).into(),
            );
        }
    };
    let registered = reg.conns.get(&token).is_some_and(|c| c.container.is_some());
    if !registered && !op.is_open() {
        return Err(CdiError::not_registered("register(container_id) before using objects").into());
    }
    match op {
        Op::Register => register(reg, token, request),
        Op::Create => create(reg, token, request),
        Op::Use => use_(reg, token, request),
        Op::Copy => copy(reg, token, request),
        Op::Access => access(reg, token, id, request, compact),
        Op::Cancel => cancel(reg, token, request),
        Op::Transfer => transfer(reg, token, id, request, compact),
        Op::Resize => resize(reg, token, request),
        Op::Destroy => destroy(reg, token, request),
        Op::SetRecovery => set_recovery(reg, token, request),
        Op::Share => sharing::share(reg, token, request),
        Op::Read => sharing::read(reg, token, id, request),
        Op::Release => sharing::release(reg, token, request),
        Op::Stat => Ok(Some((Body::Stat, None))),
        Op::List => {
            let key = match Value::field(request, "key") {
                None => None,
                Some(key) => Some(Rc::from(&*check_key(key)?)),
            };
            Ok(Some((Body::List(key), None)))
        }
    }
}

fn register(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let cid = check_container_id(arg(request, "container"))?;
    let conn = reg.conns.get(&token).ok_or_else(vanished)?;
    if let Some(current) = &conn.container {
        let current = &**current;
        return Err(CdiError::protocol(format!(
            "this connection is already registered as {current:?}"
        ))
        .into());
    }
    let allowed = uid_for(&reg.config.names, &cid, reg.own_uid);
    if conn.uid != allowed {
        return Err(CdiError::name_not_allowed(format!(
            "container id {cid:?} is reserved for uid {allowed} by the minion's configuration \
             (--names), not uid {}",
            conn.uid
        ))
        .into());
    }
    if let Some(other) = reg.containers.get(&*cid).and_then(|t| reg.conns.get(t)) {
        return Err(CdiError::container_exists(format!(
            "container id {cid:?} is in use by a live process (pid {})",
            other.pid
        ))
        .into());
    }
    let resume = match Value::field(request, "resume") {
        None => None,
        Some(Value::Str(text)) if crate::token::well_formed(text) => Some(&**text),
        Some(_) => {
            return Err(CdiError::invalid_argument(
                "resume must be the token register gave (64 hex digits)",
            )
            .into());
        }
    };
    let (pid, uid) = (conn.pid, conn.uid);
    let kept = crate::resume::come_back(reg, &cid, pid, uid, resume)
        .map_err(CdiError::container_exists)?;
    let given = reg.register(token, Rc::from(&*cid), kept);
    let resume = crate::token::Secret(given.unwrap_or_default());
    Ok(Some((Body::Registered { resume }, None)))
}

fn create(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let key = check_key(arg(request, "key"))?;
    let size = check_size(arg(request, "size"), reg.config.max_object)?;
    let isolation = isolation(reg, request)?;
    let recovery = match Value::field(request, "recovery") {
        Some(value) => Rc::from(&*check_container_id(value)?),
        None => reg.container_of(token)?,
    };
    let have = check_segment_ids(Value::field(request, "have"))?;
    let zeroed = optional_bool(request, "zeroed", true)?;
    let generation = first_generation(reg, token, request)?;
    if reg.objects.contains_key(&*key) {
        return Err(
            CdiError::key_exists(format!("an object with key {key:?} already exists")).into(),
        );
    }
    let spec = ObjectSpec {
        key: &key,
        size,
        isolation,
        recovery,
        prefer: &have,
        zeroed,
        generation,
    };
    let obj = reg.new_object(token, spec)?;
    // No fd if the creator still maps the segment it got (a pooled one it used before).
    let segment = i128::from(obj.segment.id);
    let reply = (
        Body::grant(&obj),
        obj.grant_fd(have.contains(&segment).then_some(segment)),
    );
    reg.insert(obj);
    Ok(Some(reply))
}

/// `generation`: where a gateway carries an object on from another host. Only the minion's
/// own uid and root may set it: the directory orders an object's homes by it.
fn first_generation(reg: &Registry, token: u64, request: Entries) -> Result<u64, Failure> {
    let Some(value) = optional_int(request, "generation")? else {
        return Ok(1);
    };
    let generation = u64::try_from(value)
        .ok()
        .filter(|g| (1..1 << 63).contains(g))
        .ok_or_else(|| {
            CdiError::invalid_argument(format!(
                "generation must be between 1 and 2**63 - 1, got {value}"
            ))
        })?;
    let uid = reg.conns.get(&token).map_or(0, |c| c.uid);
    if !reg.is_operator(uid) {
        return Err(CdiError::invalid_argument(
            "only the minion's own uid or root may set a generation",
        )
        .into());
    }
    Ok(generation)
}

fn isolation(reg: &Registry, request: Entries) -> Result<Isolation, Failure> {
    match Value::field(request, "isolation") {
        None => Ok(reg.config.isolation),
        Some(Value::Str(name)) if Isolation::parse(name).is_some() => {
            Ok(Isolation::parse(name).unwrap_or(reg.config.isolation))
        }
        Some(other) => Err(CdiError::invalid_argument(format!(
            "isolation must be 'cooperative' or 'strict', got {}",
            match other {
                Value::Str(name) => format!("{name:?}"),
                other => other.kind().to_owned(),
            }
        ))
        .into()),
    }
}

fn use_(reg: &Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let obj = reg.lookup(request, token, false)?;
    let body = Body::Use {
        size: obj.size,
        owner: obj.owner.clone(),
        isolation: obj.isolation,
        recovery: obj.recovery.clone(),
        generation: obj.generation,
    };
    Ok(Some((body, None)))
}

fn access(
    reg: &mut Registry,
    token: u64,
    id: RequestId,
    request: Entries,
    compact: bool,
) -> Result<Reply, Failure> {
    let have = optional_int(request, "have")?;
    let wait = optional_bool(request, "wait", true)?;
    let arriving = arriving_budget(request)?;
    let obj = match reg.lookup(request, token, wait) {
        Ok(obj) => obj,
        // An object on its way from another host: wait here for it to be created (by the
        // gateway receiving it), for `arriving` seconds at most, then `not_found`.
        Err(Failure::Cdi(err)) if wait && arriving > 0 && err.code == "not_found" => {
            if Value::field(request, "id").is_none() {
                return Err(CdiError::protocol(
                    "a request that waits needs a request id to answer it by",
                )
                .into());
            }
            let key: Rc<str> = Rc::from(&*check_key(arg(request, "key"))?);
            let waiter = Waiter {
                token,
                id,
                read: false,
                compact,
            };
            reg.wait_arriving(waiter, key, have, arriving);
            return Ok(None);
        }
        Err(err) => return Err(err),
    };
    let container = reg.conns.get(&token).and_then(|c| c.container.as_ref());
    let owner = container == Some(&obj.owner);
    if owner && obj.writable_by_owner() {
        return Ok(Some((
            Body::grant(obj).compact(compact),
            obj.grant_fd(have),
        )));
    }
    if !wait {
        return Err(if owner {
            sharing::shared_error(obj)
        } else {
            let who = container.map_or("(none)", |c| &**c);
            CdiError::not_owner(format!("container {who} does not own {:?}", &*obj.key))
        }
        .into());
    }
    if Value::field(request, "id").is_none() {
        return Err(
            CdiError::protocol("a request that waits needs a request id to answer it by").into(),
        );
    }
    let key = obj.key.clone();
    let waiter = Waiter {
        token,
        id,
        read: false,
        compact,
    };
    reg.wait(waiter, key, have);
    Ok(None)
}

/// `arriving`: how long (seconds, at most an hour) an `access` of a key that does not exist
/// waits for it to be created; 0 (the default): `not_found` at once.
fn arriving_budget(request: Entries) -> Result<u64, CdiError> {
    let seconds = match Value::field(request, "arriving") {
        None => return Ok(0),
        Some(Value::Float(value)) => *value,
        Some(Value::Int(value)) => value.get() as f64,
        Some(other) => {
            return Err(CdiError::invalid_argument(format!(
                "arriving must be a number of seconds, got {}",
                other.kind()
            )))
        }
    };
    if !(0.0..=3600.0).contains(&seconds) {
        return Err(CdiError::invalid_argument(format!(
            "arriving must be between 0 and 3600 seconds, got {seconds}"
        )));
    }
    Ok((seconds * 1e9) as u64)
}

fn cancel(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let Some(Value::Int(reference)) = Value::field(request, "ref") else {
        return Err(CdiError::invalid_argument("ref must be the id of an access").into());
    };
    let cancelled = reg.cancel(token, reference.get());
    Ok(Some((Body::Cancelled(cancelled), None)))
}

fn transfer(
    reg: &mut Registry,
    token: u64,
    id: RequestId,
    request: Entries,
    compact: bool,
) -> Result<Reply, Failure> {
    let key = sharing::owned_alone(reg, token, request)?;
    let to = Value::get(request, "to");
    // `via`: where the object goes when `to` is not here (a gateway's slot, which sends it
    // on to `to`'s host), saving the caller a failed transfer.
    let via = match Value::field(request, "via") {
        Some(value) => Some(check_container_id(value)?),
        None => None,
    };
    // Registered ids passed check_container_id: a hit needs no validation.
    let hit = match to {
        Some(Value::Str(name)) => reg.containers.get_key_value(&**name),
        _ => None,
    };
    let to = match hit {
        Some((cid, _)) => cid.clone(),
        None => {
            let name = check_container_id(to.unwrap_or(&NIL))?;
            // A container of the minion before this one, not back yet, gets it as it would
            // have (a restart is no reason for a hand-over to fail).
            let expected = reg
                .expected
                .get_key_value(&*name)
                .map(|(cid, _)| cid.clone());
            match reg.containers.get_key_value(&*name) {
                Some((cid, _)) => cid.clone(),
                None if expected.is_some() => expected.unwrap_or_default(),
                // Through a gateway, and the minion sends itself: the reply waits for the
                // other host's answer.
                None if via.is_some() && reg.holder.is_some() => {
                    return depart(reg, token, id, key, &name, compact);
                }
                None => match via.as_deref().and_then(|v| reg.containers.get_key_value(v)) {
                    Some((cid, _)) => cid.clone(),
                    None => {
                        return Err(CdiError::unknown_container(format!(
                            "no live container {name:?} is registered with this minion"
                        ))
                        .into())
                    }
                },
            }
        }
    };
    if reg.objects.get(&key).is_some_and(|o| o.owner != to) {
        reg.set_owner(&key, to)?;
    }
    let obj = reg.objects.get(&key).ok_or_else(vanished)?;
    // The sender may keep its mapping for reuse only if no other uid was ever handed this
    // memory (the receiver included): else it unmaps, and the segment is never reused.
    let body = Body::Transferred {
        generation: obj.generation,
        keep_mapping: keeps_mapping(reg, token, obj),
        to: obj.owner.clone(),
        compact,
    };
    Ok(Some((body, None)))
}

/// Hand `key` to the holder of objects leaving for another host (`sending.rs`), which sends
/// it to `to` there; the caller's reply follows the other host's answer.
fn depart(
    reg: &mut Registry,
    token: u64,
    id: RequestId,
    key: Rc<str>,
    to: &str,
    compact: bool,
) -> Result<Reply, Failure> {
    let holder = reg.holder.clone().ok_or_else(vanished)?;
    let back = reg.container_of(token)?;
    let keep_mapping = keeps_mapping(reg, token, reg.objects.get(&key).ok_or_else(vanished)?);
    reg.set_owner(&key, holder)?;
    let generation = reg.objects.get(&key).ok_or_else(vanished)?.generation;
    reg.departures.push(crate::sending::Departure {
        key,
        to: to.to_owned(),
        back,
        token,
        id,
        compact,
        generation,
        keep_mapping,
    });
    Ok(None)
}

fn copy(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let key = reg.owned(token, request)?;
    let new_key = check_key(arg(request, "new_key"))?;
    if reg.objects.contains_key(&*new_key) {
        return Err(
            CdiError::key_exists(format!("an object with key {new_key:?} already exists")).into(),
        );
    }
    let (size, isolation) = {
        let obj = reg.objects.get(&key).ok_or_else(vanished)?;
        (obj.size, obj.isolation)
    };
    let recovery = reg.container_of(token)?;
    // Not zeroed: the copy overwrites its bytes (another uid's old bytes are zeroed anyway).
    let spec = ObjectSpec {
        key: &new_key,
        size,
        isolation,
        recovery,
        prefer: &[],
        zeroed: false,
        generation: 1,
    };
    let mut new = reg.new_object(token, spec)?;
    if let Some(obj) = reg.objects.get(&key) {
        new.segment.copy_from(&obj.segment, size);
    }
    let reply = (Body::grant(&new), Some(new.segment.fd));
    reg.insert(new);
    Ok(Some(reply))
}

fn resize(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let key = sharing::owned_alone(reg, token, request)?;
    let size = check_size(arg(request, "size"), reg.config.max_object)?;
    let obj = reg.objects.get_mut(&key).ok_or_else(vanished)?;
    if size > obj.segment.capacity {
        let cooperative = obj.isolation == Isolation::Cooperative;
        let mut bigger = reg.pool.acquire(size, cooperative, &[], None, true)?;
        bigger.copy_from(&obj.segment, obj.size);
        let old = std::mem::replace(&mut obj.segment, bigger);
        if cooperative {
            reg.pool.release(old, obj.size);
        } else {
            reg.pool.discard(old);
        }
    } else if size > obj.size {
        obj.segment.zero(size, obj.size); // growth reads as zeros, not old bytes
    }
    obj.size = size;
    obj.generation += 1;
    obj.updated_at = crate::sys::unix_time();
    let body = Body::grant(obj);
    reg.changed(&key);
    Ok(Some((body, None)))
}

fn destroy(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let key = sharing::owned_alone(reg, token, request)?;
    // Cached only if the segment goes back to our uid's pool (nobody else was handed it).
    let obj = reg.objects.get(&key).ok_or_else(vanished)?;
    let keep_mapping = keeps_mapping(reg, token, obj);
    reg.remove(&key);
    Ok(Some((Body::Destroyed { keep_mapping }, None)))
}

/// Whether the caller may keep its mapping of `obj`'s memory once the object is no longer
/// its: only if nobody of another uid was ever handed it (it then serves only our uid again).
fn keeps_mapping(reg: &Registry, token: u64, obj: &StoredObject) -> bool {
    let uid = reg.conns.get(&token).map(|c| c.uid);
    obj.isolation == Isolation::Cooperative
        && uid.is_some_and(|uid| SegmentPool::returns_to(&obj.segment, uid))
}

fn set_recovery(reg: &mut Registry, token: u64, request: Entries) -> Result<Reply, Failure> {
    let key = reg.owned(token, request)?;
    let recovery: Rc<str> = Rc::from(&*check_container_id(arg(request, "container"))?);
    reg.objects.get_mut(&key).ok_or_else(vanished)?.recovery = recovery.clone();
    reg.mark(&key);
    Ok(Some((Body::Recovery(recovery), None)))
}

//! Reply bodies and their encoding, with the fields `cdi/PROTOCOL.md` lists for each operation.

use std::rc::Rc;

use crate::compact;
use crate::msgpack::Enc;
use crate::objects::{RequestId, StoredObject};
use crate::protocol::{CdiError, Isolation};
use crate::registry::Registry;

/// What a successful operation answers (besides `id` and `ok`), or an error.
#[derive(Debug)]
pub enum Body {
    Grant {
        size: u64,
        capacity: u64,
        generation: u64,
        isolation: Isolation,
        segment: u64,
        /// Answered in the compact form (`compact.rs`).
        compact: bool,
    },
    /// `resume`: the container's new resume token, or empty (it keeps the one it has).
    Registered {
        resume: crate::token::Secret,
    },
    Use {
        size: u64,
        owner: Rc<str>,
        isolation: Isolation,
        recovery: Rc<str>,
        generation: u64,
    },
    Cancelled(bool),
    Transferred {
        generation: u64,
        keep_mapping: bool,
        to: Rc<str>,
        compact: bool,
    },
    Destroyed {
        keep_mapping: bool,
    },
    Recovery(Rc<str>),
    Readers(Vec<Rc<str>>),
    Released {
        released: bool,
        readers: usize,
    },
    Stat,
    /// Every object the caller may see, or only the one of this key.
    List(Option<Rc<str>>),
    Error(CdiError),
}

impl Body {
    /// The grant fields of an object: what a client maps, and how.
    pub fn grant(obj: &StoredObject) -> Body {
        Body::Grant {
            size: obj.size,
            capacity: obj.segment.capacity,
            generation: obj.generation,
            isolation: obj.isolation,
            segment: obj.segment.id,
            compact: false,
        }
    }

    /// The same grant, in the compact form if `yes` (asked in it).
    pub fn compact(mut self, yes: bool) -> Body {
        if let Body::Grant { compact, .. } = &mut self {
            *compact = yes;
        }
        self
    }
}

/// The three entries of a refusal: `ok` (false), `code`, `msg` (the gateway's answers too).
pub fn refusal_fields(enc: &mut Enc, err: &CdiError) {
    enc.str("ok");
    enc.bool(false);
    enc.str("code");
    enc.str(err.code);
    enc.str("msg");
    enc.str(&err.msg);
}

/// Write the reply `{"id": id, "ok": …, …body}` to the connection `token` into `out`.
pub fn encode(out: &mut Vec<u8>, reg: &Registry, token: u64, body: &Body, id: RequestId) {
    if compact::encode(out, body, id) {
        return; // a reply to a compact request
    }
    let mut enc = Enc(out);
    if let Body::Error(err) = body {
        enc.map(4);
        enc.str("id");
        enc.int(id);
        refusal_fields(&mut enc, err);
        return;
    }
    let fields = match body {
        Body::Grant { .. } => 5,
        Body::Registered { .. } => 7,
        Body::Use { .. } => 5,
        Body::Stat => 11,
        Body::Transferred { .. } => 3,
        Body::Released { .. } => 2,
        _ => 1,
    };
    enc.map(fields + 2);
    enc.str("id");
    enc.int(id);
    enc.str("ok");
    enc.bool(true);
    match body {
        Body::Grant {
            size,
            capacity,
            generation,
            isolation,
            segment,
            ..
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
        Body::Registered { resume } => {
            enc.str("host");
            enc.str(&reg.config.host);
            enc.str("minion_pid");
            enc.uint(u64::from(std::process::id()));
            enc.str("max_object");
            enc.uint(reg.config.max_object);
            enc.str("isolation");
            enc.str(reg.config.isolation.as_str());
            enc.str("store");
            enc.str(&reg.store);
            enc.str("resume");
            enc.str(&resume.0);
            enc.str("compact");
            enc.uint(u64::from(compact::VERSION));
        }
        Body::Use {
            size,
            owner,
            isolation,
            recovery,
            generation,
        } => {
            enc.str("size");
            enc.uint(*size);
            enc.str("owner");
            enc.str(owner);
            enc.str("isolation");
            enc.str(isolation.as_str());
            enc.str("recovery");
            enc.str(recovery);
            enc.str("generation");
            enc.uint(*generation);
        }
        Body::Cancelled(cancelled) => {
            enc.str("cancelled");
            enc.bool(*cancelled);
        }
        Body::Transferred {
            generation,
            keep_mapping,
            to,
            ..
        } => {
            enc.str("generation");
            enc.uint(*generation);
            enc.str("keep_mapping");
            enc.bool(*keep_mapping);
            enc.str("to");
            enc.str(to);
        }
        Body::Destroyed { keep_mapping } => {
            enc.str("keep_mapping");
            enc.bool(*keep_mapping);
        }
        Body::Recovery(recovery) => {
            enc.str("recovery");
            enc.str(recovery);
        }
        Body::Readers(readers) => {
            enc.str("readers");
            enc.array(readers.len());
            for reader in readers {
                enc.str(reader);
            }
        }
        Body::Released { released, readers } => {
            enc.str("released");
            enc.bool(*released);
            enc.str("readers");
            enc.uint(*readers as u64);
        }
        Body::Stat => encode_stat(&mut enc, reg, token),
        Body::List(key) => encode_list(&mut enc, reg, token, key.as_deref()),
        Body::Error(_) => {}
    }
}

/// The counters, and the containers the caller may see: all for the minion's uid and root,
/// else those of its own uid.
fn encode_stat(enc: &mut Enc, reg: &Registry, token: u64) {
    let pool = &reg.pool;
    enc.str("host");
    enc.str(&reg.config.host);
    enc.str("objects");
    enc.uint(reg.objects.len() as u64);
    let uid = reg.conns.get(&token).map(|c| c.uid);
    let all = uid.is_some_and(|uid| reg.is_operator(uid));
    let mut containers: Vec<&str> = reg
        .containers
        .iter()
        .filter(|(_, t)| all || reg.conns.get(t).map(|c| c.uid) == uid)
        .map(|(c, _)| &**c)
        .collect();
    containers.sort_unstable();
    enc.str("containers");
    enc.array(containers.len());
    for container in containers {
        enc.str(container);
    }
    let waiters = reg.waiters.values().map(|w| w.len() as u64).sum();
    for (name, value) in [
        ("used_bytes", pool.used_bytes),
        ("used_segments", pool.used_segments),
        ("idle_bytes", pool.idle_bytes),
        ("allocations", pool.allocations),
        ("reuses", pool.reuses),
        ("zeroed_bytes", pool.zeroed_bytes),
        ("waiters", waiters),
        ("memory_limit", pool.memory_limit),
    ] {
        enc.str(name);
        enc.uint(value);
    }
}

/// The objects the caller may see, in creation order.
fn encode_list(enc: &mut Enc, reg: &Registry, token: u64, key: Option<&str>) {
    let mut objects: Vec<&StoredObject> = match key {
        // One key: a lookup, whatever the number of objects here.
        Some(key) => reg.objects.get(key).into_iter().collect(),
        None => reg.objects.values().collect(),
    };
    objects.retain(|o| reg.visible(token, o));
    objects.sort_unstable_by_key(|o| o.order);
    enc.str("objects");
    enc.array(objects.len());
    for o in objects {
        enc.map(13);
        for (name, text) in [
            ("key", &*o.key),
            ("owner", &*o.owner),
            ("creator", &*o.creator),
            ("recovery", &*o.recovery),
            ("isolation", o.isolation.as_str()),
            ("host", &*reg.config.host),
        ] {
            enc.str(name);
            enc.str(text);
        }
        for (name, value) in [
            ("size", o.size),
            ("capacity", o.segment.capacity),
            ("generation", o.generation),
            ("segment", o.segment.id),
        ] {
            enc.str(name);
            enc.uint(value);
        }
        enc.str("readers");
        enc.array(o.readers.len());
        for reader in &o.readers {
            enc.str(reader);
        }
        enc.str("created_at");
        enc.float(o.created_at);
        enc.str("updated_at");
        enc.float(o.updated_at);
    }
}

//! What happens to objects when a container goes: its own objects go to their recovery
//! container (or are reclaimed), and the shares it held end as if released.

use std::rc::Rc;

use crate::log;
use crate::protocol::{Failure, Isolation};
use crate::registry::{move_to_fresh_segment, Registry};

/// Objects of a dead owner go back to their recovery container, else are reclaimed; one
/// at a time, in creation order.
pub fn recover_objects_of(reg: &mut Registry, dead: &Rc<str>) {
    let mut theirs: Vec<(u64, Rc<str>)> = reg
        .objects
        .values()
        .filter(|o| o.owner == *dead)
        .map(|o| (o.order, o.key.clone()))
        .collect();
    theirs.sort_unstable();
    for (_, key) in theirs {
        recover(reg, &key);
    }
}

/// An object whose owner is gone goes to its recovery container if that one is live, else
/// it is reclaimed; a shared one without a live recovery container stays until its share
/// ends (its readers still map it). One that cannot move (a strict object needs a fresh
/// segment, and memory may have run out) is reclaimed.
pub fn recover(reg: &mut Registry, key: &Rc<str>) {
    let Some(obj) = reg.objects.get(key) else {
        return;
    };
    let dead = obj.owner.clone();
    let recovery = reg
        .containers
        .get_key_value(&obj.recovery)
        .map(|(k, _)| k.clone())
        .filter(|recovery| *recovery != dead);
    let Some(recovery) = recovery else {
        if obj.shared() {
            log::info(format_args!(
                "owner {dead} of {key} died; it goes when its readers release it"
            ));
        } else {
            log::info(format_args!(
                "owner {dead} of {key} died and nobody can recover it; reclaiming"
            ));
            reg.remove(key);
        }
        return;
    };
    log::info(format_args!(
        "owner {dead} of {key} died; returning it to {recovery}"
    ));
    // set_owner fails only before the hand-over.
    if let Err(failure) = reg.set_owner(key, recovery.clone()) {
        let why = match failure {
            Failure::Cdi(err) => err.msg,
            Failure::Internal(msg) => msg,
        };
        log::warning(format_args!(
            "cannot return {key} to {recovery} ({why}); reclaiming it"
        ));
        reg.remove(key);
    }
}

/// A reader is gone: its shares end as if it had released them.
pub fn release_shares_of(reg: &mut Registry, dead: &Rc<str>) {
    let mut held: Vec<(u64, Rc<str>)> = reg
        .objects
        .values()
        .filter(|o| o.readers.contains(dead))
        .map(|o| (o.order, o.key.clone()))
        .collect();
    held.sort_unstable();
    for (_, key) in held {
        release_share(reg, &key, dead);
    }
}

/// `reader` gives up its share of `key`; whether it held one. When the last reader goes,
/// the object is its owner's alone again: a strict one moves to a fresh segment (so no
/// reader's mapping sees the owner's next writes), a waiting access of its owner is
/// granted, and one whose owner died meanwhile is recovered.
pub fn release_share(reg: &mut Registry, key: &Rc<str>, reader: &str) -> bool {
    let Some(obj) = reg.objects.get_mut(key) else {
        return false;
    };
    let before = obj.readers.len();
    obj.readers.retain(|r| **r != *reader);
    if obj.readers.len() == before {
        return false;
    }
    if reg.journal.is_some() {
        reg.dirty.push(key.clone());
    }
    if obj.shared() {
        return true;
    }
    obj.live = false;
    if obj.isolation == Isolation::Strict {
        if let Err(failure) = move_to_fresh_segment(&mut reg.pool, obj) {
            let why = match failure {
                Failure::Cdi(err) => err.msg,
                Failure::Internal(msg) => msg,
            };
            log::warning(format_args!(
                "cannot move {key} out of its readers' segment ({why}); they keep a \
                 read-only mapping of it"
            ));
        }
    }
    if reg.containers.contains_key(&obj.owner) {
        reg.grant_waiters(key);
    } else {
        recover(reg, key);
    }
    true
}

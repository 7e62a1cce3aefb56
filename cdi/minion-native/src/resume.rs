//! A minion with a state folder (`--state-dir`) finds again what the minion before it held.
//!
//! At start it takes the folder's lock (a minion still stopping holds it for a moment), reads
//! the journal (`journal.rs`), maps each object's segment file again and forgets segment files
//! nobody holds. The containers that were registered are *expected*: each comes back by
//! registering again from the same process (pid, start time and uid as journaled), and owns
//! its objects and shares as before. A container whose process ended while no minion ran (or
//! ends before it comes back) is gone: once the others had the resume grace to come back (so
//! that a recovery container is there to take them), its objects go to their recovery
//! containers and its shares end, by the rule for any container that dies. A process that
//! cannot be seen from here (pid 0: another pid namespace) has the grace to come back, and
//! proves it is the container by its resume token (`token.rs`).

use std::collections::HashSet;
use std::os::fd::RawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::journal::{self, Journal, SavedContainer};
use crate::log;
use crate::objects::StoredObject;
use crate::protocol::Isolation;
use crate::recovery;
use crate::registry::{Expected, Registry};
use crate::segments::{segment_id, Segment, UidSet};
use crate::sys;

/// How long `open` waits for a minion that is stopping to let go of the folder.
const LOCK_WAIT_MS: u64 = 10_000;

/// The file in the state folder that names the segment folder (its path and a newline), so
/// that whoever stops the minion for good finds what to remove even when the minion could
/// not (`cdi/minion/state.py`).
pub const SEGMENTS_FILE: &str = "segments";

/// Where the segment files of the minion of `state_dir` are: a folder of the minion's uid
/// under /dev/shm (memory: nothing there survives a reboot).
pub fn segment_dir(state_dir: &Path) -> PathBuf {
    let name = state_dir.as_os_str().as_encoded_bytes();
    let hash = name.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/dev/shm/cdi-minion-{uid}-{hash:016x}"))
}

/// A folder of ours only (mode 0700), made if missing; an error if someone else's.
fn private_dir(path: &Path) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(format!("cannot make {}: {err}", path.display())),
    }
    let meta = std::fs::symlink_metadata(path)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != uid {
        return Err(format!(
            "{} is not a folder of the minion's uid {uid}",
            path.display()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(|err| format!("cannot make {} private: {err}", path.display()))?;
    }
    Ok(())
}

/// Hold the folder's lock for the life of the process (the fd is never closed), its holder's
/// pid written in it. A minion that holds it is asked to hand over (SIGUSR2: it records what
/// it has and stops, keeping its objects), so a restart costs the clients milliseconds.
fn lock(state_dir: &Path) -> Result<(), String> {
    let path = state_dir.join("lock");
    let name = sys::c_path(&path).map_err(|_| format!("bad path {}", path.display()))?;
    // SAFETY: name is NUL-terminated.
    let fd = unsafe {
        libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(format!(
            "cannot open {}: {}",
            path.display(),
            sys::last_os_error_text()
        ));
    }
    let deadline = sys::monotonic_ns() + LOCK_WAIT_MS * 1_000_000;
    let mut asked = false;
    // SAFETY: flock on the fd just opened.
    while unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if sys::monotonic_ns() > deadline {
            sys::close(fd);
            return Err(format!(
                "another minion holds the state folder {} (its lock)",
                state_dir.display()
            ));
        }
        if !asked {
            asked = ask_to_hand_over(&path);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let pid = format!("{}\n", std::process::id());
    // SAFETY: fd is ours and open for writing; pid is valid for its length.
    unsafe {
        libc::ftruncate(fd, 0);
        libc::pwrite(fd, pid.as_ptr().cast(), pid.len(), 0);
    }
    Ok(())
}

/// Write the segment folder's path into the state folder (before the folder is made: a
/// minion killed in between leaves a name, never a folder nobody knows of).
fn record_segment_dir(state_dir: &Path, segments: &Path) -> Result<(), String> {
    let path = state_dir.join(SEGMENTS_FILE);
    let mut text = segments.as_os_str().as_encoded_bytes().to_vec();
    text.push(b'\n');
    if std::fs::read(&path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(&path, &text).map_err(|err| format!("cannot write {}: {err}", path.display()))
}

/// SIGUSR2 to the minion whose pid the lock file names, if it is one; whether it was sent.
fn ask_to_hand_over(lock: &Path) -> bool {
    let Some(pid) = std::fs::read_to_string(lock)
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok())
        .filter(|pid| *pid > 0 && *pid as u32 != std::process::id())
    else {
        // Its holder has not written its pid yet: look again. (Or the pid is ours: a holder
        // in another pid namespace, which only its own ending lets go of.)
        return false;
    };
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim() != "cdi-minion" {
        return false;
    }
    log::info(format_args!(
        "minion {pid} holds the state folder; asking it to hand over"
    ));
    // SAFETY: a plain system call.
    unsafe { libc::kill(pid, libc::SIGUSR2) == 0 }
}

/// Take the state folder: restore what the journal holds, start a fresh journal.
pub fn open(reg: &mut Registry, state_dir: &Path) -> Result<(), String> {
    private_dir(state_dir)?;
    lock(state_dir)?;
    let segments = segment_dir(state_dir);
    record_segment_dir(state_dir, &segments)?;
    private_dir(&segments)?;
    reg.pool.dir = Some(segments.clone());
    reg.boot_id = sys::boot_id();
    let path = state_dir.join(journal::FILE);
    let mut state = journal::read(&path)
        .map_err(|err| format!("cannot read the journal {}: {err}", path.display()))?;
    if state.boot_id != reg.boot_id {
        if !state.objects.is_empty() {
            log::info(format_args!(
                "the journal is from an earlier boot of the host: its {} objects did not \
                 survive the reboot",
                state.objects.len()
            ));
        }
        state = journal::State::default();
    }
    // The same objects: clients carry on with them. A new store otherwise.
    (reg.store, reg.restarts) = if state.store.is_empty() {
        (sys::random_id(), 0)
    } else {
        (state.store.clone(), state.restarts + 1)
    };
    let mut saved: Vec<_> = state.objects.into_values().collect();
    saved.sort_unstable_by_key(|o| o.order);
    let mut kept = HashSet::new();
    let mut lost = 0;
    for o in saved {
        let poolable = o.isolation == Isolation::Cooperative;
        let Some(mut segment) = Segment::reopen(&segments, o.segment, o.capacity, poolable) else {
            lost += 1;
            continue;
        };
        segment.uids = UidSet::from_list(&o.segment_uids);
        reg.pool.adopt(&segment);
        kept.insert(o.segment);
        reg.restore_order(o.order);
        let key: Rc<str> = Rc::from(o.key.as_str());
        reg.objects.insert(
            key.clone(),
            StoredObject {
                key,
                size: o.size,
                segment,
                owner: Rc::from(o.owner.as_str()),
                creator: Rc::from(o.creator.as_str()),
                recovery: Rc::from(o.recovery.as_str()),
                isolation: o.isolation,
                generation: o.generation,
                uids: UidSet::from_list(&o.uids),
                created_at: o.created_at,
                updated_at: o.updated_at,
                readers: o.readers.iter().map(|r| Rc::from(r.as_str())).collect(),
                live: o.live,
                order: o.order,
            },
        );
    }
    if lost > 0 {
        log::warning(format_args!(
            "{lost} objects of the journal have no segment file any more; they are gone"
        ));
    }
    let holder = crate::sending::holder_of(&reg.config.host);
    reg.stranded = reg
        .objects
        .values()
        .filter(|o| o.owner == holder)
        .map(|o| o.key.clone())
        .collect();
    forget_unheld_segments(&segments, &kept);
    reg.pool.next_id = reg.pool.next_id.max(state.ids);
    let mut containers: Vec<SavedContainer> = state.containers.into_values().collect();
    containers.sort_unstable_by_key(|c| c.registered);
    for c in containers {
        reg.restore_registration(c.registered);
        let id: Rc<str> = Rc::from(c.id.as_str());
        match watch(&c) {
            Watch::Running(pidfd) => {
                reg.expected.insert(
                    id,
                    Expected {
                        saved: c,
                        pidfd,
                        token: 0,
                    },
                );
            }
            Watch::Ended => reg.pending_gone.push(c),
        }
    }
    let now = sys::monotonic_ns();
    let grace = reg.config.resume_grace_ms.saturating_mul(1_000_000);
    reg.resume_until = now.saturating_add(grace);
    let unseen = reg.config.resume_grace_unseen_ms.saturating_mul(1_000_000);
    reg.resume_unseen_until = now.saturating_add(unseen);
    reg.kept_objects = reg.objects.len() as u64;
    let keys: Vec<Rc<str>> = reg.objects.keys().cloned().collect();
    for key in &keys {
        reg.changed(key); // the directory learns of them again
    }
    if let Some(sink) = reg.events.as_mut() {
        sink.store(&reg.store, reg.restarts, reg.kept_objects);
        for (cid, expected) in &reg.expected {
            sink.registered(cid, expected.saved.pid, expected.saved.uid);
        }
    }
    reg.dirty.clear();
    reg.journal = Some(
        Journal::rewrite(&path, &reg.snapshot())
            .map_err(|err| format!("cannot write the journal {}: {err}", path.display()))?,
    );
    if !reg.objects.is_empty() || !reg.expected.is_empty() || !reg.pending_gone.is_empty() {
        log::info(format_args!(
            "resumed {} objects; {} containers may come back, {} ended meanwhile",
            reg.objects.len(),
            reg.expected.len(),
            reg.pending_gone.len()
        ));
    }
    Ok(())
}

enum Watch {
    /// Its process runs (a pidfd to watch it by), or cannot be seen from here (None).
    Running(Option<RawFd>),
    Ended,
}

fn watch(c: &SavedContainer) -> Watch {
    if c.pid <= 0 {
        return Watch::Running(None);
    }
    let Some(pidfd) = sys::pidfd_open(c.pid) else {
        return Watch::Ended;
    };
    // Checked after the pidfd is open: it then names this very process, not a successor.
    if sys::process_start(c.pid) != Some(c.start) {
        sys::close(pidfd);
        return Watch::Ended;
    }
    Watch::Running(Some(pidfd))
}

/// Remove the segment files no restored object uses (idle ones, or a dead minion's leftovers).
fn forget_unheld_segments(dir: &Path, kept: &HashSet<u64>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let held = name
            .to_str()
            .and_then(segment_id)
            .is_some_and(|id| kept.contains(&id));
        if !held {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether `cid` registering from this process, with this resume token, is the container
/// that went away: `Ok` with the digest of the token it keeps (empty: it gets a new one), or
/// an `Err` naming why it may not have the name yet. A process the minion sees must be the
/// journaled one (pid, start time; a token it presents must be its own too); one it cannot
/// see (pid 0) must present the container's token, unless the journal holds none (a minion
/// of before tokens registered it: its uid decides then). A different process takes a name
/// only once the old one has ended (its objects are recovered first, as when any container
/// dies). No error names the token.
pub fn come_back(
    reg: &mut Registry,
    cid: &str,
    pid: i32,
    uid: u32,
    resume: Option<&str>,
) -> Result<String, String> {
    let Some(expected) = reg.expected.get(cid) else {
        if let Some(at) = reg.pending_gone.iter().position(|c| c.id == cid) {
            let dead = reg.pending_gone.remove(at);
            gone(reg, &dead);
        }
        return Ok(String::new());
    };
    let saved = &expected.saved;
    let seen = saved.pid > 0;
    let token_fits = match resume {
        Some(token) => crate::token::matches(token, &saved.resume),
        None => false,
    };
    let wrong_token = resume.is_some() && !saved.resume.is_empty() && !token_fits;
    let same = saved.uid == uid
        && !wrong_token
        && if seen {
            saved.pid == pid && sys::process_start(pid) == Some(saved.start)
        } else {
            token_fits || saved.resume.is_empty()
        };
    let running = seen && sys::process_start(saved.pid) == Some(saved.start);
    if !same && (running || !seen) {
        let (who, again) = if seen {
            (
                format!("pid {}", saved.pid),
                "that process may register it again",
            )
        } else {
            (
                "a process in another pid namespace".to_owned(),
                "that container may register it again, with its resume token",
            )
        };
        return Err(format!(
            "container id {cid:?} was registered by {who} before the minion restarted; {again}, \
             another process once it has ended"
        ));
    }
    let Some(expected) = reg.expected.remove(cid) else {
        return Ok(String::new());
    };
    if let Some(pidfd) = expected.pidfd {
        sys::close(pidfd); // closing it takes it out of the epoll set
    }
    if !same {
        gone(reg, &expected.saved);
        return Ok(String::new());
    }
    Ok(expected.saved.resume)
}

/// An expected container's process ended (its pidfd told, by `token`).
pub fn exited(reg: &mut Registry, token: u64) -> bool {
    let Some(cid) = reg
        .expected
        .iter()
        .find(|(_, e)| e.pidfd.is_some() && e.token == token)
        .map(|(cid, _)| cid.clone())
    else {
        return false;
    };
    if let Some(expected) = reg.expected.remove(&cid) {
        if let Some(pidfd) = expected.pidfd {
            sys::close(pidfd);
        }
        log::info(format_args!(
            "container {cid} (pid {}) ended before it came back",
            expected.saved.pid
        ));
        reg.pending_gone.push(expected.saved);
    }
    true
}

/// When the grace is over (or nobody more can come back): the ended containers' objects go
/// to recovery, and containers not seen from here that did not come back within theirs
/// (`--resume-grace-unseen-ms`) count as ended. Returns the monotonic ns at which to call
/// again, if any.
pub fn settle(reg: &mut Registry) -> Option<u64> {
    let now = sys::monotonic_ns();
    if now >= reg.resume_unseen_until {
        let unseen: Vec<Rc<str>> = reg
            .expected
            .iter()
            .filter(|(_, e)| e.pidfd.is_none())
            .map(|(cid, _)| cid.clone())
            .collect();
        for cid in unseen {
            if let Some(expected) = reg.expected.remove(&cid) {
                reg.pending_gone.push(expected.saved);
            }
        }
    }
    let unseen_left = reg.expected.values().any(|e| e.pidfd.is_none());
    // While one not seen from here may still come back, the ended wait for it too: it may
    // be their recovery container.
    let until = if unseen_left {
        reg.resume_until.max(reg.resume_unseen_until)
    } else {
        reg.resume_until
    };
    let orphans = !reg.pending_gone.is_empty() || !reg.stranded.is_empty();
    if now < until && (unseen_left || (orphans && !reg.expected.is_empty())) {
        return Some(until);
    }
    let mut ended = std::mem::take(&mut reg.pending_gone);
    ended.sort_unstable_by_key(|c| c.registered);
    for dead in ended {
        gone(reg, &dead);
    }
    let holder = crate::sending::holder_of(&reg.config.host);
    for key in std::mem::take(&mut reg.stranded) {
        if reg.objects.get(&key).is_some_and(|o| o.owner == holder) {
            recovery::recover(reg, &key);
        }
    }
    None
}

/// A container of the minion before is gone for good: the recovery rule for its objects.
fn gone(reg: &mut Registry, dead: &SavedContainer) {
    let cid: Rc<str> = Rc::from(dead.id.as_str());
    log::info(format_args!(
        "container {cid} ended while the minion was away; recovering its objects"
    ));
    if let Some(sink) = reg.events.as_mut() {
        sink.gone(&cid);
    }
    recovery::recover_objects_of(reg, &cid);
    recovery::release_shares_of(reg, &cid);
    if reg.journal.is_some() {
        reg.dirty_containers.push((cid, false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token;

    fn registry() -> Registry {
        let args = "cdi-minion --socket /tmp/cdi-resume-test.sock --host h --memory-limit \
                    1000000 --max-object 500000 --idle-limit 0 --isolation strict \
                    --busy-poll-us 0 --socket-mode 600";
        Registry::new(crate::args::parse(args.split_whitespace()).unwrap(), None)
    }

    /// `cid` registered before the restart by `pid` (0: not seen from here), started at
    /// `start`, of uid 1000, with the token whose digest is `resume`.
    fn expect(reg: &mut Registry, cid: &str, pid: i32, start: u64, resume: &str) {
        let saved = SavedContainer {
            id: cid.to_owned(),
            pid,
            start,
            uid: 1000,
            registered: 1,
            resume: resume.to_owned(),
        };
        let expected = Expected {
            saved,
            pidfd: None,
            token: 0,
        };
        reg.expected.insert(Rc::from(cid), expected);
    }

    #[test]
    fn an_object_the_minion_before_was_sending_waits_out_the_grace_then_is_recovered() {
        let mut reg = registry();
        expect(&mut reg, "sender", 0, 0, "");
        let segment = match reg.pool.acquire(100, false, &[], None, true) {
            Ok(segment) => segment,
            Err(_) => panic!("no segment"),
        };
        let key: Rc<str> = Rc::from("k");
        reg.objects.insert(
            key.clone(),
            StoredObject {
                key: key.clone(),
                size: 100,
                segment,
                owner: crate::sending::holder_of("h"),
                creator: Rc::from("sender"),
                recovery: Rc::from("sender"),
                isolation: Isolation::Strict,
                generation: 2,
                uids: UidSet::of(1000),
                created_at: 0.0,
                updated_at: 0.0,
                readers: Vec::new(),
                live: false,
                order: 1,
            },
        );
        reg.stranded.push(key.clone());
        let now = sys::monotonic_ns();
        reg.resume_until = now + 60_000_000_000;
        reg.resume_unseen_until = now - 1;
        reg.expected.get_mut("sender").unwrap().pidfd = Some(-1); // seen: only the grace waits
        assert_eq!(settle(&mut reg), Some(reg.resume_until));
        assert!(
            reg.objects.contains_key("k"),
            "'sender' may come back to recover it"
        );
        reg.resume_until = now - 1;
        assert_eq!(settle(&mut reg), None);
        // Its recovery container did not come back: reclaimed, as a dead owner's would be.
        assert!(!reg.objects.contains_key("k") && reg.stranded.is_empty());
    }

    #[test]
    fn a_container_not_seen_from_here_comes_back_with_its_token_only() {
        let mut reg = registry();
        let secret = token::new_token().unwrap();
        let other = token::new_token().unwrap();
        let digest = token::digest(&secret);
        expect(&mut reg, "far", 0, 0, &digest);
        for (uid, presented) in [(1000, None), (1000, Some(&*other)), (1001, Some(&*secret))] {
            let refused = come_back(&mut reg, "far", 0, uid, presented).unwrap_err();
            assert!(!refused.contains(&secret) && !refused.contains(&digest));
            assert!(reg.expected.contains_key("far"), "still expected");
        }
        // Its token and uid: the same container, which keeps its token.
        assert_eq!(
            come_back(&mut reg, "far", 0, 1000, Some(&secret)),
            Ok(digest)
        );
        assert!(reg.expected.is_empty());
    }

    #[test]
    fn a_container_not_seen_from_here_has_a_longer_grace_and_the_ended_wait_for_it() {
        let mut reg = registry();
        expect(&mut reg, "far", 0, 0, "");
        let ended = SavedContainer {
            id: "dead".to_owned(),
            pid: 4_000_000,
            start: 0,
            uid: 1000,
            registered: 2,
            resume: String::new(),
        };
        reg.pending_gone.push(ended);
        let now = sys::monotonic_ns();
        reg.resume_until = now - 1; // the seen ones' grace is over
        reg.resume_unseen_until = now + 60_000_000_000;
        assert_eq!(settle(&mut reg), Some(reg.resume_unseen_until));
        assert!(reg.expected.contains_key("far"), "still expected");
        assert_eq!(
            reg.pending_gone.len(),
            1,
            "the ended wait: 'far' may recover them"
        );
        reg.resume_unseen_until = now - 1;
        assert_eq!(settle(&mut reg), None);
        assert!(reg.expected.is_empty() && reg.pending_gone.is_empty());
    }

    #[test]
    fn a_journal_of_before_tokens_knows_an_unseen_container_by_its_uid() {
        let mut reg = registry();
        expect(&mut reg, "old", 0, 0, "");
        assert!(come_back(&mut reg, "old", 0, 1001, None).is_err());
        assert_eq!(come_back(&mut reg, "old", 0, 1000, None), Ok(String::new()));
    }

    #[test]
    fn a_process_seen_from_here_must_be_the_journaled_one() {
        let mut reg = registry();
        let me = std::process::id() as i32;
        let start = sys::process_start(me).unwrap();
        let secret = token::new_token().unwrap();
        let digest = token::digest(&secret);
        expect(&mut reg, "near", me, start, &digest);
        // The token does not stand in for the process while the journaled one runs, and a
        // wrong token from the right process is refused.
        assert!(come_back(&mut reg, "near", me + 1, 1000, Some(&secret)).is_err());
        let wrong = token::new_token().unwrap();
        assert!(come_back(&mut reg, "near", me, 1000, Some(&wrong)).is_err());
        // The journaled process, with its token or without (an old client): itself.
        assert_eq!(
            come_back(&mut reg, "near", me, 1000, None),
            Ok(digest.clone())
        );
        expect(&mut reg, "near", me, start, &digest);
        assert_eq!(
            come_back(&mut reg, "near", me, 1000, Some(&secret)),
            Ok(digest)
        );
    }

    #[test]
    fn a_name_whose_process_ended_is_taken_anew_without_its_token() {
        let mut reg = registry();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let start = sys::process_start(pid).unwrap_or(1);
        child.wait().unwrap();
        expect(&mut reg, "ended", pid, start, &token::digest("x"));
        // A new registration: no token kept (a new one is given), the old one's objects
        // recovered first.
        assert_eq!(
            come_back(&mut reg, "ended", 4_000_000, 1000, None),
            Ok(String::new())
        );
        assert!(reg.expected.is_empty());
    }

    #[test]
    fn the_state_folder_names_its_segment_folder() {
        let dir = std::env::temp_dir().join(format!("cdi-resume-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let segments = segment_dir(&dir);
        assert!(segments.starts_with("/dev/shm"));
        assert_ne!(segments, segment_dir(&dir.join("other")));
        record_segment_dir(&dir, &segments).unwrap();
        record_segment_dir(&dir, &segments).unwrap(); // a restart finds it already there
        let text = std::fs::read_to_string(dir.join(SEGMENTS_FILE)).unwrap();
        assert_eq!(text, format!("{}\n", segments.display()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The journal: what a minion with a state folder (`--state-dir`) needs to find its objects
//! again after its process ends (a crash, a kill, an upgrade) — their owners, generations,
//! shares and segments, and the containers registered with it.
//!
//! The object's bytes are in segment files under /dev/shm (`segments.rs`); the journal is an
//! append-only file of records in the state folder, each framed as a little-endian u32 length,
//! a u32 FNV-1a checksum of the payload and the payload (a msgpack map). Replay takes the
//! records in order and stops at the first torn or damaged one (a write the process did not
//! finish). A record is written before any reply or grant that depends on the change it
//! records, so a restarted minion never knows less than a client was told. The file is
//! rewritten as a snapshot (written aside, then renamed over) at start and when it has grown
//! to several times the state it describes.
//!
//! Durability: records are written with write(2) and never fsynced. The journal has to outlive
//! the minion's process, not the host: the page cache keeps a write once write(2) returns,
//! whatever then happens to the process, and the memory the records describe (/dev/shm) does
//! not survive a reboot either. A journal from another boot (its `boot_id`) is discarded.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::msgpack::{unpack, Enc, Value};
use crate::protocol::Isolation;

/// The journal's file name in the state folder.
pub const FILE: &str = "journal";
/// Segment ids are reserved in blocks this large: a restarted minion starts above every id a
/// client may still hold a mapping of.
pub const ID_BLOCK: u64 = 1024;
/// Rewrite the journal once it holds this many bytes beyond this many times its live state.
const COMPACT_SLACK: u64 = 1 << 20;
const COMPACT_RATIO: u64 = 4;

/// An object as the journal keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedObject {
    pub key: String,
    pub size: u64,
    pub segment: u64,
    pub capacity: u64,
    pub isolation: Isolation,
    pub owner: String,
    pub creator: String,
    pub recovery: String,
    pub generation: u64,
    pub uids: Vec<u32>,
    pub segment_uids: Vec<u32>,
    pub readers: Vec<String>,
    pub live: bool,
    pub created_at: f64,
    pub updated_at: f64,
    pub order: u64,
}

/// A registered container: its process (pid and start time name it), uid, and the SHA-256
/// of its resume token (`token.rs`; empty: none was given, as by a minion of before tokens).
#[derive(Clone, PartialEq)]
pub struct SavedContainer {
    pub id: String,
    pub pid: i32,
    pub start: u64,
    pub uid: u32,
    pub registered: u64,
    pub resume: String,
}

/// Without the token's digest: nothing prints what would let a guess be checked offline.
impl std::fmt::Debug for SavedContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavedContainer")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .field("start", &self.start)
            .field("uid", &self.uid)
            .field("registered", &self.registered)
            .field("resume", &!self.resume.is_empty())
            .finish()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// First in every journal: the boot it was written in, the store's id (the same for
    /// every minion that takes the store on: clients tell a resumed minion by it), and how
    /// many minions took the store over from another (0 for the one that began it).
    Boot {
        boot_id: String,
        store: String,
        restarts: u64,
    },
    /// Segment ids below this may be in use.
    Ids(u64),
    Put(SavedObject),
    Del(String),
    Registered(SavedContainer),
    Gone(String),
}

/// What a journal says, replayed.
#[derive(Debug, Default, PartialEq)]
pub struct State {
    pub boot_id: String,
    pub store: String,
    pub restarts: u64,
    pub ids: u64,
    pub objects: BTreeMap<String, SavedObject>,
    pub containers: BTreeMap<String, SavedContainer>,
}

impl State {
    pub fn apply(&mut self, record: Record) {
        match record {
            Record::Boot {
                boot_id,
                store,
                restarts,
            } => {
                self.boot_id = boot_id;
                self.store = store;
                self.restarts = restarts;
            }
            Record::Ids(n) => self.ids = self.ids.max(n),
            Record::Put(obj) => {
                self.objects.insert(obj.key.clone(), obj);
            }
            Record::Del(key) => {
                self.objects.remove(&key);
            }
            Record::Registered(c) => {
                self.containers.insert(c.id.clone(), c);
            }
            Record::Gone(id) => {
                self.containers.remove(&id);
            }
        }
    }
}

fn checksum(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5u32, |hash, &byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

fn strs(enc: &mut Enc, items: &[String]) {
    enc.array(items.len());
    for item in items {
        enc.str(item);
    }
}

fn uints(enc: &mut Enc, items: &[u32]) {
    enc.array(items.len());
    for &item in items {
        enc.uint(u64::from(item));
    }
}

/// Append one framed record to `out`.
pub fn encode(out: &mut Vec<u8>, record: &Record) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    let mut enc = Enc(out);
    match record {
        Record::Boot {
            boot_id,
            store,
            restarts,
        } => {
            enc.map(4);
            enc.str("t");
            enc.str("boot");
            enc.str("boot_id");
            enc.str(boot_id);
            enc.str("store");
            enc.str(store);
            enc.str("restarts");
            enc.uint(*restarts);
        }
        Record::Ids(n) => {
            enc.map(2);
            enc.str("t");
            enc.str("ids");
            enc.str("below");
            enc.uint(*n);
        }
        Record::Put(o) => {
            enc.map(17);
            enc.str("t");
            enc.str("put");
            enc.str("key");
            enc.str(&o.key);
            enc.str("size");
            enc.uint(o.size);
            enc.str("segment");
            enc.uint(o.segment);
            enc.str("capacity");
            enc.uint(o.capacity);
            enc.str("isolation");
            enc.str(o.isolation.as_str());
            enc.str("owner");
            enc.str(&o.owner);
            enc.str("creator");
            enc.str(&o.creator);
            enc.str("recovery");
            enc.str(&o.recovery);
            enc.str("generation");
            enc.uint(o.generation);
            enc.str("uids");
            uints(&mut enc, &o.uids);
            enc.str("segment_uids");
            uints(&mut enc, &o.segment_uids);
            enc.str("readers");
            strs(&mut enc, &o.readers);
            enc.str("live");
            enc.bool(o.live);
            enc.str("created_at");
            enc.float(o.created_at);
            enc.str("updated_at");
            enc.float(o.updated_at);
            enc.str("order");
            enc.uint(o.order);
        }
        Record::Del(key) => {
            enc.map(2);
            enc.str("t");
            enc.str("del");
            enc.str("key");
            enc.str(key);
        }
        Record::Registered(c) => {
            enc.map(7);
            enc.str("t");
            enc.str("registered");
            enc.str("id");
            enc.str(&c.id);
            enc.str("pid");
            enc.int(i128::from(c.pid));
            enc.str("start");
            enc.uint(c.start);
            enc.str("uid");
            enc.uint(u64::from(c.uid));
            enc.str("registered");
            enc.uint(c.registered);
            enc.str("resume");
            enc.str(&c.resume);
        }
        Record::Gone(id) => {
            enc.map(2);
            enc.str("t");
            enc.str("gone");
            enc.str("id");
            enc.str(id);
        }
    }
    let payload = &out[start + 8..];
    let (length, sum) = (payload.len() as u32, checksum(payload));
    out[start..start + 4].copy_from_slice(&length.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&sum.to_le_bytes());
}

type Entries<'v, 'a> = &'v [(Value<'a>, Value<'a>)];

fn text(entries: Entries, name: &str) -> Option<String> {
    match Value::get(entries, name)? {
        Value::Str(s) => Some((*s).to_owned()),
        _ => None,
    }
}

fn uint(entries: Entries, name: &str) -> Option<u64> {
    match Value::get(entries, name)? {
        Value::Int(i) => u64::try_from(i.get()).ok(),
        _ => None,
    }
}

fn float(entries: Entries, name: &str) -> Option<f64> {
    match Value::get(entries, name)? {
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

fn list<T>(entries: Entries, name: &str, item: impl Fn(&Value) -> Option<T>) -> Option<Vec<T>> {
    match Value::get(entries, name)? {
        Value::Array(items) => items.iter().map(item).collect(),
        _ => None,
    }
}

fn decode_payload(payload: &[u8]) -> Option<Record> {
    let Ok(Value::Map(e)) = unpack(payload) else {
        return None;
    };
    Some(match text(&e, "t")?.as_str() {
        "boot" => Record::Boot {
            boot_id: text(&e, "boot_id")?,
            store: text(&e, "store")?,
            restarts: uint(&e, "restarts").unwrap_or(0), // not in a journal of before it
        },
        "ids" => Record::Ids(uint(&e, "below")?),
        "del" => Record::Del(text(&e, "key")?),
        "gone" => Record::Gone(text(&e, "id")?),
        "registered" => Record::Registered(SavedContainer {
            id: text(&e, "id")?,
            pid: match Value::get(&e, "pid")? {
                Value::Int(i) => i32::try_from(i.get()).ok()?,
                _ => return None,
            },
            start: uint(&e, "start")?,
            uid: u32::try_from(uint(&e, "uid")?).ok()?,
            registered: uint(&e, "registered")?,
            resume: text(&e, "resume").unwrap_or_default(), // not in a journal of before it
        }),
        "put" => {
            let uid = |v: &Value| match v {
                Value::Int(i) => u32::try_from(i.get()).ok(),
                _ => None,
            };
            let name = |v: &Value| match v {
                Value::Str(s) => Some((*s).to_owned()),
                _ => None,
            };
            Record::Put(SavedObject {
                key: text(&e, "key")?,
                size: uint(&e, "size")?,
                segment: uint(&e, "segment")?,
                capacity: uint(&e, "capacity")?,
                isolation: Isolation::parse(&text(&e, "isolation")?)?,
                owner: text(&e, "owner")?,
                creator: text(&e, "creator")?,
                recovery: text(&e, "recovery")?,
                generation: uint(&e, "generation")?,
                uids: list(&e, "uids", uid)?,
                segment_uids: list(&e, "segment_uids", uid)?,
                readers: list(&e, "readers", name)?,
                live: matches!(Value::get(&e, "live")?, Value::Bool(true)),
                created_at: float(&e, "created_at")?,
                updated_at: float(&e, "updated_at")?,
                order: uint(&e, "order")?,
            })
        }
        _ => return None,
    })
}

/// The records of a journal's bytes, up to the first torn or damaged one; and how many bytes
/// they take (the rest is to be cut off).
pub fn decode_all(mut data: &[u8]) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut used = 0;
    while data.len() >= 8 {
        let length = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let sum = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        let Some(payload) = data.get(8..8 + length) else {
            break;
        };
        if checksum(payload) != sum {
            break;
        }
        let Some(record) = decode_payload(payload) else {
            break;
        };
        records.push(record);
        used += 8 + length;
        data = &data[8 + length..];
    }
    (records, used)
}

/// What a journal file says; an empty state if there is none.
pub fn read(path: &Path) -> std::io::Result<State> {
    let mut data = Vec::new();
    match File::open(path) {
        Ok(mut file) => {
            file.read_to_end(&mut data)?;
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
        Err(err) => return Err(err),
    }
    let mut state = State::default();
    for record in decode_all(&data).0 {
        state.apply(record);
    }
    Ok(state)
}

/// The open journal, appended to.
pub struct Journal {
    path: PathBuf,
    file: File,
    buffer: Vec<u8>,
    /// Bytes in the file, and in its last snapshot.
    length: u64,
    snapshot: u64,
    /// Segment ids below this are reserved.
    pub ids: u64,
}

impl Journal {
    /// Write `records` as the whole journal at `path` (aside first, then renamed over it) and
    /// open it for appending.
    pub fn rewrite(path: &Path, records: &[Record]) -> std::io::Result<Journal> {
        let mut data = Vec::new();
        let mut ids = 0;
        for record in records {
            if let Record::Ids(n) = record {
                ids = ids.max(*n);
            }
            encode(&mut data, record);
        }
        let aside = path.with_extension("new");
        {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&aside)?;
            file.write_all(&data)?;
        }
        std::fs::rename(&aside, path)?;
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Journal {
            path: path.to_path_buf(),
            file,
            buffer: Vec::with_capacity(4096),
            length: data.len() as u64,
            snapshot: data.len() as u64,
            ids,
        })
    }

    /// Queue a record; `flush` writes what is queued.
    pub fn add(&mut self, record: &Record) {
        if let Record::Ids(n) = record {
            self.ids = self.ids.max(*n);
        }
        encode(&mut self.buffer, record);
    }

    /// Write the queued records in one write(2).
    pub fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let written = self.file.write_all(&self.buffer);
        self.length += self.buffer.len() as u64;
        self.buffer.clear();
        written
    }

    /// Whether the file has grown enough beyond its state to be rewritten.
    pub fn wants_compaction(&self) -> bool {
        self.length > COMPACT_SLACK.max(self.snapshot.saturating_mul(COMPACT_RATIO))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(key: &str, owner: &str, generation: u64) -> SavedObject {
        SavedObject {
            key: key.to_owned(),
            size: 100,
            segment: 7,
            capacity: 4096,
            isolation: Isolation::Strict,
            owner: owner.to_owned(),
            creator: "a".to_owned(),
            recovery: "a".to_owned(),
            generation,
            uids: vec![1000, 1001],
            segment_uids: vec![1000],
            readers: vec!["r1".to_owned(), "r2".to_owned()],
            live: true,
            created_at: 1.5,
            updated_at: 2.25,
            order: 3,
        }
    }

    fn boot(id: &str) -> Record {
        Record::Boot {
            boot_id: id.to_owned(),
            store: "s".to_owned(),
            restarts: 2,
        }
    }

    fn container(id: &str) -> SavedContainer {
        SavedContainer {
            id: id.to_owned(),
            pid: 4242,
            start: 99,
            uid: 1000,
            registered: 1,
            resume: "ab".repeat(32),
        }
    }

    #[test]
    fn every_record_reads_back_as_written() {
        let records = vec![
            boot("b-1"),
            Record::Ids(2048),
            Record::Put(object("k", "a", 1)),
            Record::Del("k".to_owned()),
            Record::Registered(container("a")),
            Record::Gone("a".to_owned()),
        ];
        let mut data = Vec::new();
        for record in &records {
            encode(&mut data, record);
        }
        assert_eq!(decode_all(&data), (records, data.len()));
    }

    #[test]
    fn replay_keeps_the_last_word_on_each_object_and_container() {
        let mut data = Vec::new();
        for record in [
            boot("b"),
            Record::Registered(container("a")),
            Record::Registered(container("b")),
            Record::Put(object("k", "a", 1)),
            Record::Put(object("gone", "a", 1)),
            Record::Ids(1024),
            Record::Put(object("k", "b", 2)),
            Record::Del("gone".to_owned()),
            Record::Gone("a".to_owned()),
            Record::Ids(2048),
        ] {
            encode(&mut data, &record);
        }
        let mut state = State::default();
        for record in decode_all(&data).0 {
            state.apply(record);
        }
        assert_eq!((state.boot_id.as_str(), state.store.as_str()), ("b", "s"));
        assert_eq!(state.ids, 2048);
        assert_eq!(state.objects.len(), 1);
        assert_eq!(state.objects["k"], object("k", "b", 2));
        assert_eq!(state.containers.keys().collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn a_torn_or_damaged_tail_is_cut_off() {
        let mut data = Vec::new();
        encode(&mut data, &Record::Put(object("k", "a", 1)));
        let whole = data.len();
        encode(&mut data, &Record::Put(object("k", "b", 2)));
        for cut in [whole + 3, whole + 8, data.len() - 1] {
            let (records, used) = decode_all(&data[..cut]);
            assert_eq!((records.len(), used), (1, whole), "cut at {cut}");
        }
        let mut damaged = data.clone();
        let last = damaged.len() - 2;
        damaged[last] ^= 0x40;
        assert_eq!(decode_all(&damaged).1, whole);
        assert_eq!(decode_all(&[]), (vec![], 0));
    }

    #[test]
    fn a_journal_is_rewritten_then_appended_to_and_read_back() {
        let dir = std::env::temp_dir().join(format!("cdi-journal-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILE);
        assert_eq!(read(&path).unwrap(), State::default()); // none yet
        let mut journal = Journal::rewrite(
            &path,
            &[
                boot("b"),
                Record::Ids(ID_BLOCK),
                Record::Put(object("k", "a", 1)),
            ],
        )
        .unwrap();
        assert_eq!(journal.ids, ID_BLOCK);
        journal.add(&Record::Put(object("k", "b", 2)));
        journal.add(&Record::Ids(2 * ID_BLOCK));
        journal.flush().unwrap();
        assert!(journal.buffer.is_empty() && !journal.wants_compaction());
        let state = read(&path).unwrap();
        assert_eq!(state.objects["k"].owner, "b");
        assert_eq!((state.ids, journal.ids), (2 * ID_BLOCK, 2 * ID_BLOCK));
        // A torn write at the end (the process died in it) costs only that record.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&[200, 0, 0, 0, 1, 2]).unwrap();
        assert_eq!(read(&path).unwrap(), state);
        assert!(!path.with_extension("new").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_journal_that_grew_far_beyond_its_state_asks_to_be_rewritten() {
        let dir = std::env::temp_dir().join(format!("cdi-journal-grow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILE);
        let mut journal = Journal::rewrite(&path, &[boot("b")]).unwrap();
        let mut n = 0;
        while !journal.wants_compaction() {
            journal.add(&Record::Put(object("k", "a", n)));
            journal.flush().unwrap();
            n += 1;
        }
        assert!(journal.length > COMPACT_SLACK);
        assert_eq!(read(journal.path()).unwrap().objects["k"].generation, n - 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The compact form of `access` and `transfer` (`cdi/PROTOCOL.md`, *Compact form*), the
//! client's side: the requests it sends and the success replies it reads. Anything else that
//! arrives (an error map, a reply to another request) is left to the Python client to read.

#[path = "../../minion-native/src/compact_layout.rs"]
mod layout;

use layout::MAGIC;
use layout::{
    HAVE, HEADER, KIND_GRANT, KIND_TRANSFERRED as KIND_MOVED, NO_WAIT, OP_ACCESS, OP_TRANSFER,
    VERSION,
};

/// A grant, the reply to `access`.
const GRANT: usize = 44;
/// A transfer's reply up to its `to`.
const MOVED: usize = 22;

/// A grant's fields.
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    pub id: i64,
    pub size: u64,
    pub capacity: u64,
    pub generation: u64,
    pub segment: u64,
    pub strict: bool,
}

/// A transfer's reply's fields.
#[derive(Debug, PartialEq, Eq)]
pub struct Moved<'a> {
    pub id: i64,
    pub generation: u64,
    pub keep_mapping: bool,
    pub to: &'a str,
}

/// A compact success reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    Grant(Grant),
    Moved(Moved<'a>),
}

impl Reply<'_> {
    pub fn id(&self) -> i64 {
        match self {
            Reply::Grant(grant) => grant.id,
            Reply::Moved(moved) => moved.id,
        }
    }
}

fn request(out: &mut Vec<u8>, op: u8, flags: u8, id: i64, have: i64, texts: [&str; 3]) -> bool {
    if texts.iter().any(|text| text.len() > usize::from(u16::MAX)) {
        return false; // no room for its length: the client sends a map
    }
    out.clear();
    out.reserve(HEADER + texts.iter().map(|text| text.len()).sum::<usize>());
    out.extend_from_slice(&[MAGIC, VERSION, op, flags]);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&have.to_le_bytes());
    for text in texts {
        // Checked above: each length fits in 16 bits.
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    }
    for text in texts {
        out.extend_from_slice(text.as_bytes());
    }
    true
}

/// A `transfer` into `out`; false when a string is too long for the form.
pub fn transfer(out: &mut Vec<u8>, id: i64, key: &str, to: &str, via: &str) -> bool {
    request(out, OP_TRANSFER, 0, id, 0, [key, to, via])
}

/// An `access` into `out`; false when the key is too long for the form.
pub fn access(out: &mut Vec<u8>, id: i64, key: &str, wait: bool, have: Option<i64>) -> bool {
    let mut flags = if wait { 0 } else { NO_WAIT };
    if have.is_some() {
        flags |= HAVE;
    }
    request(out, OP_ACCESS, flags, id, have.unwrap_or(0), [key, "", ""])
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// A compact success reply (the whole message); `None` for anything else.
pub fn decode(data: &[u8]) -> Option<Reply<'_>> {
    if data.len() < 4 || data[0] != MAGIC || data[1] != VERSION {
        return None;
    }
    let (kind, flags) = (data[2], data[3]);
    let id = u64_at(data, 4) as i64;
    if kind == KIND_GRANT && data.len() == GRANT {
        return Some(Reply::Grant(Grant {
            id,
            size: u64_at(data, 12),
            capacity: u64_at(data, 20),
            generation: u64_at(data, 28),
            segment: u64_at(data, 36),
            strict: flags & 1 != 0,
        }));
    }
    if kind == KIND_MOVED && data.len() >= MOVED {
        let length = usize::from(u16::from_le_bytes([data[20], data[21]]));
        if MOVED + length == data.len() {
            let to = std::str::from_utf8(&data[MOVED..]).ok()?;
            return Some(Reply::Moved(Moved {
                id,
                generation: u64_at(data, 12),
                keep_mapping: flags & 1 != 0,
                to,
            }));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_is_the_documented_header_and_its_strings() {
        let mut out = Vec::new();
        assert!(transfer(&mut out, 7, "k", "to", "via"));
        let mut expected = vec![MAGIC, 1, 2, 0, 7, 0, 0, 0, 0, 0, 0, 0];
        expected.extend_from_slice(&[0; 8]);
        expected.extend_from_slice(&[1, 0, 2, 0, 3, 0]);
        expected.extend_from_slice(b"ktovia");
        assert_eq!(out, expected);
    }

    #[test]
    fn an_access_carries_its_flags_and_have() {
        let mut out = Vec::new();
        assert!(access(&mut out, -1, "key", false, Some(9)));
        assert_eq!(&out[..4], &[MAGIC, 1, 1, NO_WAIT | HAVE]);
        assert_eq!(&out[4..12], &(-1i64).to_le_bytes());
        assert_eq!(&out[12..20], &9i64.to_le_bytes());
        assert_eq!(&out[20..26], &[3, 0, 0, 0, 0, 0]);
        assert_eq!(&out[26..], b"key");
    }

    #[test]
    fn a_string_longer_than_a_u16_is_left_to_a_map() {
        let long = "k".repeat(usize::from(u16::MAX) + 1);
        assert!(!transfer(&mut Vec::new(), 1, &long, "to", ""));
        assert!(!access(&mut Vec::new(), 1, &long, true, None));
    }

    #[test]
    fn replies_decode_and_anything_else_does_not() {
        let mut grant = vec![MAGIC, 1, KIND_GRANT, 1];
        for value in [5u64, 10, 4096, 3, 42] {
            grant.extend_from_slice(&value.to_le_bytes());
        }
        let expected = Reply::Grant(Grant {
            id: 5,
            size: 10,
            capacity: 4096,
            generation: 3,
            segment: 42,
            strict: true,
        });
        assert_eq!(decode(&grant), Some(expected));
        assert_eq!(decode(&grant[..43]), None);
        let mut moved = vec![MAGIC, 1, KIND_MOVED, 0];
        moved.extend_from_slice(&6u64.to_le_bytes());
        moved.extend_from_slice(&8u64.to_le_bytes());
        moved.extend_from_slice(&[1, 0, b'b']);
        let expected = Reply::Moved(Moved {
            id: 6,
            generation: 8,
            keep_mapping: false,
            to: "b",
        });
        assert_eq!(decode(&moved), Some(expected));
        moved[22] = 0xFF; // not UTF-8
        assert_eq!(decode(&moved), None);
        assert_eq!(decode(&[0x83, 1, 2, 3]), None); // a map
    }
}

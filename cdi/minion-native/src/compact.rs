//! The compact form of the two hot operations (`cdi/PROTOCOL.md`, *Compact form*): an `access`
//! or a `transfer` as a fixed binary header instead of a MessagePack map, and the success
//! replies to them likewise. A compact request decodes to the fields a map would carry, so
//! every rule of the operation applies unchanged; errors are answered as maps.

use crate::msgpack::{Int, Value};
use crate::objects::RequestId;
use crate::protocol::Isolation;
use crate::replies::Body;

pub use crate::compact_layout::VERSION;
use crate::compact_layout::{
    HAVE, HEADER, KIND_GRANT, KIND_TRANSFERRED, MAGIC, NO_WAIT, OP_ACCESS, OP_TRANSFER,
};

pub fn is_compact(message: &[u8]) -> bool {
    message.first() == Some(&MAGIC)
}

fn u16_at(data: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([data[at], data[at + 1]]))
}

fn i64_at(data: &[u8], at: usize) -> i64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&data[at..at + 8]);
    i64::from_le_bytes(bytes)
}

fn text(bytes: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(bytes).map_err(|err| format!("str is not UTF-8: {err}"))
}

/// A compact request as the map it stands for; `Err` holds why it is refused (a `protocol`
/// error with id 0, as for an undecodable map).
pub fn decode(data: &[u8]) -> Result<Vec<(Value<'_>, Value<'_>)>, String> {
    if data.len() < HEADER {
        return Err(format!("a compact request is at least {HEADER} bytes"));
    }
    if data[1] != VERSION {
        return Err(format!("unknown compact form version {}", data[1]));
    }
    let (op, flags) = (data[2], data[3]);
    let lengths = [u16_at(data, 20), u16_at(data, 22), u16_at(data, 24)];
    if HEADER + lengths.iter().sum::<usize>() != data.len() {
        return Err("the compact request's lengths do not add up to its size".to_owned());
    }
    let key = text(&data[HEADER..HEADER + lengths[0]])?;
    let to_at = HEADER + lengths[0];
    let to = text(&data[to_at..to_at + lengths[1]])?;
    let via = text(&data[to_at + lengths[1]..])?;
    let id = Value::Int(Int::from(i128::from(i64_at(data, 4))));
    let mut entries = vec![(Value::Str("id"), id), (Value::Str("key"), Value::Str(key))];
    match op {
        OP_ACCESS if flags & !(NO_WAIT | HAVE) == 0 && lengths[1] + lengths[2] == 0 => {
            entries.push((Value::Str("op"), Value::Str("access")));
            entries.push((Value::Str("wait"), Value::Bool(flags & NO_WAIT == 0)));
            if flags & HAVE != 0 {
                let have = Value::Int(Int::from(i128::from(i64_at(data, 12))));
                entries.push((Value::Str("have"), have));
            }
        }
        OP_TRANSFER if flags == 0 => {
            entries.push((Value::Str("op"), Value::Str("transfer")));
            entries.push((Value::Str("to"), Value::Str(to)));
            if !via.is_empty() {
                entries.push((Value::Str("via"), Value::Str(via)));
            }
        }
        OP_ACCESS | OP_TRANSFER => {
            return Err("a compact request with a flag or field its operation lacks".to_owned())
        }
        other => return Err(format!("unknown compact operation {other}")),
    }
    Ok(entries)
}

/// Write `body` in the compact form if it answers a compact request (a grant or a transfer);
/// whether it did.
pub fn encode(out: &mut Vec<u8>, body: &Body, id: RequestId) -> bool {
    let head = |out: &mut Vec<u8>, kind: u8, flag: bool| {
        out.extend_from_slice(&[MAGIC, VERSION, kind, u8::from(flag)]);
        out.extend_from_slice(&(id as i64).to_le_bytes()); // a compact request's id is an i64
    };
    match body {
        &Body::Grant {
            compact: true,
            isolation,
            size,
            capacity,
            generation,
            segment,
        } => {
            head(out, KIND_GRANT, isolation == Isolation::Strict);
            for word in [size, capacity, generation, segment] {
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
        Body::Transferred {
            compact: true,
            keep_mapping,
            generation,
            to,
        } => {
            head(out, KIND_TRANSFERRED, *keep_mapping);
            out.extend_from_slice(&generation.to_le_bytes());
            // A container id is at most 256 characters: its length fits a u16.
            out.extend_from_slice(&(to.len() as u16).to_le_bytes());
            out.extend_from_slice(to.as_bytes());
        }
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: u8, flags: u8, id: i64, have: i64, parts: [&[u8]; 3]) -> Vec<u8> {
        let mut data = vec![MAGIC, VERSION, op, flags];
        data.extend_from_slice(&id.to_le_bytes());
        data.extend_from_slice(&have.to_le_bytes());
        for part in parts {
            data.extend_from_slice(&(part.len() as u16).to_le_bytes());
        }
        for part in parts {
            data.extend_from_slice(part);
        }
        data
    }

    #[test]
    fn requests_decode_to_the_fields_of_their_map() {
        let data = request(OP_ACCESS, NO_WAIT | HAVE, 9, 4, [b"k", b"", b""]);
        let entries = decode(&data).unwrap();
        assert_eq!(Value::get(&entries, "op"), Some(&Value::Str("access")));
        assert_eq!(Value::get(&entries, "id"), Some(&Value::Int(9.into())));
        assert_eq!(Value::get(&entries, "key"), Some(&Value::Str("k")));
        assert_eq!(Value::get(&entries, "wait"), Some(&Value::Bool(false)));
        assert_eq!(Value::get(&entries, "have"), Some(&Value::Int(4.into())));
        let data = request(OP_ACCESS, 0, 1, 4, [b"k", b"", b""]);
        let entries = decode(&data).unwrap();
        assert_eq!(Value::get(&entries, "have"), None);
        assert_eq!(Value::get(&entries, "wait"), Some(&Value::Bool(true)));
        let data = request(OP_TRANSFER, 0, -3, 0, [b"k", b"b", b""]);
        let entries = decode(&data).unwrap();
        assert_eq!(Value::get(&entries, "op"), Some(&Value::Str("transfer")));
        assert_eq!(Value::get(&entries, "id"), Some(&Value::Int((-3).into())));
        assert_eq!(Value::get(&entries, "to"), Some(&Value::Str("b")));
        assert_eq!(Value::get(&entries, "via"), None);
        let data = request(OP_TRANSFER, 0, 1, 0, [b"k", b"b", b"slot"]);
        let entries = decode(&data).unwrap();
        assert_eq!(Value::get(&entries, "via"), Some(&Value::Str("slot")));
    }

    #[test]
    fn malformed_requests_are_refused() {
        let good = request(OP_TRANSFER, 0, 1, 0, [b"k", b"b", b""]);
        let mut longer = good.clone();
        longer.push(0);
        let mut version = good.clone();
        version[1] = 2;
        for data in [
            good[..HEADER - 1].to_vec(),
            good[..good.len() - 1].to_vec(),
            longer,
            version,
            request(3, 0, 1, 0, [b"k", b"", b""]),
            request(OP_TRANSFER, NO_WAIT, 1, 0, [b"k", b"b", b""]),
            request(OP_ACCESS, 4, 1, 0, [b"k", b"", b""]),
            request(OP_ACCESS, 0, 1, 0, [b"k", b"b", b""]),
            request(OP_TRANSFER, 0, 1, 0, [b"\xff", b"b", b""]),
        ] {
            assert!(decode(&data).is_err(), "{data:?}");
        }
    }

    #[test]
    fn replies_have_their_fixed_layout() {
        let mut out = Vec::new();
        let grant = Body::Grant {
            size: 1,
            capacity: 4096,
            generation: 2,
            isolation: Isolation::Strict,
            segment: 9,
            compact: true,
        };
        assert!(encode(&mut out, &grant, 7));
        assert_eq!(out.len(), 44);
        assert_eq!(&out[..4], &[MAGIC, VERSION, KIND_GRANT, 1]);
        assert_eq!((i64_at(&out, 4), i64_at(&out, 36)), (7, 9));
        out.clear();
        let moved = Body::Transferred {
            generation: 3,
            keep_mapping: true,
            to: "peer".into(),
            compact: true,
        };
        assert!(encode(&mut out, &moved, 8));
        assert_eq!(&out[..4], &[MAGIC, VERSION, KIND_TRANSFERRED, 1]);
        assert_eq!((i64_at(&out, 12), u16_at(&out, 20)), (3, 4));
        assert_eq!(&out[22..], b"peer");
        out.clear();
        assert!(!encode(&mut out, &grant.compact(false), 7) && out.is_empty());
    }
}

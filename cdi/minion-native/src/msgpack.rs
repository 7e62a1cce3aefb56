//! MessagePack for the minion: requests decoded with `rmpv`, replies written with `rmp`.
//!
//! `unpack` decodes one message and refuses what `cdi/PROTOCOL.md` calls undecodable: bytes
//! left after the value, a str that is not UTF-8, a map key that is neither str nor bin. Ints
//! become one `Int` (any msgpack int fits an i128); extension types stay opaque (no field of
//! the protocol holds one).
//!
//! Limits on hostile input: a message is at most `MAX_MESSAGE` (1 MiB) bytes; rmpv never
//! reserves memory for the length a header announces (it grows each array and map as items
//! actually decode, msgpack-rust issue 151), so a message decodes to at most one value per byte;
//! its recursion is bounded by `read_value_ref_with_max_depth` (`MAX_DEPTH`), and so is ours
//! (conversion, drop), since we only ever walk what rmpv accepted.

use std::fmt;
use std::mem::{align_of, size_of};

use rmp::encode;
use rmpv::ValueRef;

/// One decoded value; strings and byte strings borrow the receive buffer.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    Int(Int),
    Float(f64),
    Str(&'a str),
    Bin(&'a [u8]),
    Array(Vec<Value<'a>>),
    /// Entries in wire order, duplicates included; `get` takes the last.
    Map(Vec<(Value<'a>, Value<'a>)>),
    Ext(i8, &'a [u8]),
}

pub static NIL: Value<'static> = Value::Nil;

/// Every msgpack int (-2^63 ..= 2^64-1): an `i128` stored at 8-byte alignment, so that `Value`
/// has the layout of rmpv's `ValueRef` and `convert` turns rmpv's arrays and maps into ours in
/// place instead of allocating a second tree for every request.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(8))]
pub struct Int(i128);

// What the in-place conversion needs; should an rmpv upgrade change its layout, this fails the
// build rather than quietly doubling the memory and time of every decode.
const _: () = assert!(
    size_of::<Value>() == size_of::<ValueRef>() && align_of::<Value>() == align_of::<ValueRef>()
);

impl Int {
    pub fn get(self) -> i128 {
        self.0
    }
}

impl From<i128> for Int {
    fn from(value: i128) -> Self {
        Int(value)
    }
}

impl fmt::Display for Int {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

impl fmt::Debug for Int {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

impl<'a> Value<'a> {
    /// A field of a decoded map: the last entry with that str key, as `cdi/PROTOCOL.md` says.
    pub fn get<'v>(entries: &'v [(Value<'a>, Value<'a>)], name: &str) -> Option<&'v Value<'a>> {
        entries
            .iter()
            .rev()
            .find(|(k, _)| matches!(k, Value::Str(s) if *s == name))
            .map(|(_, v)| v)
    }

    /// A field that is absent or nil is `None` (the protocol treats them alike).
    pub fn field<'v>(entries: &'v [(Value<'a>, Value<'a>)], name: &str) -> Option<&'v Value<'a>> {
        Self::get(entries, name).filter(|v| !matches!(v, Value::Nil))
    }

    /// The MessagePack type's name, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "boolean",
            Value::Int(_) => "integer",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::Bin(_) => "binary",
            Value::Array(_) => "array",
            Value::Map(_) => "map",
            Value::Ext(..) => "extension",
        }
    }
}

/// rmpv's depth budget: it spends about two units per nested array or map, so this refuses
/// messages nested some 1,000 levels deep (no request nests more than two).
const MAX_DEPTH: usize = 2048;

/// Decode one message; `Err` holds why it is refused.
pub fn unpack(data: &[u8]) -> Result<Value<'_>, String> {
    let mut rest = data;
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut rest, MAX_DEPTH)
        .map_err(|err| err.to_string())?;
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes of extra data after the value",
            rest.len()
        ));
    }
    convert(value)
}

/// rmpv's value as ours, refusing a str that is not UTF-8 and a map key that is not str or bin.
fn convert(value: ValueRef<'_>) -> Result<Value<'_>, String> {
    Ok(match value {
        ValueRef::Nil => Value::Nil,
        ValueRef::Boolean(b) => Value::Bool(b),
        ValueRef::Integer(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::Int(Int(i.into())),
            (None, Some(u)) => Value::Int(Int(u.into())),
            (None, None) => unreachable!("a msgpack int is an i64 or a u64"),
        },
        ValueRef::F32(f) => Value::Float(f.into()),
        ValueRef::F64(f) => Value::Float(f),
        ValueRef::String(s) => match s.as_err() {
            Some(err) => return Err(format!("str is not UTF-8: {err}")),
            None => Value::Str(s.into_str().unwrap_or_default()), // Some: the str is UTF-8
        },
        ValueRef::Binary(b) => Value::Bin(b),
        // Collected in place: each Vec of rmpv's becomes ours, no new allocation.
        ValueRef::Array(items) => {
            Value::Array(items.into_iter().map(convert).collect::<Result<_, _>>()?)
        }
        ValueRef::Map(entries) => {
            let entries = entries.into_iter().map(|(key, value)| {
                let key = convert(key)?;
                if !matches!(key, Value::Str(_) | Value::Bin(_)) {
                    return Err(format!("a map key must be a string, not {}", key.kind()));
                }
                Ok((key, convert(value)?))
            });
            Value::Map(entries.collect::<Result<_, _>>()?)
        }
        ValueRef::Ext(code, data) => Value::Ext(code, data),
    })
}

/// rmp writes through `std::io::Write`, which cannot fail on a `Vec` (it grows or aborts).
fn written<T, E: std::fmt::Debug>(result: Result<T, E>) {
    result.expect("writing to a Vec cannot fail");
}

/// Appends msgpack to a reused buffer, each value in its smallest form.
pub struct Enc<'b>(pub &'b mut Vec<u8>);

impl Enc<'_> {
    pub fn bool(&mut self, value: bool) {
        written(encode::write_bool(self.0, value));
    }

    pub fn uint(&mut self, value: u64) {
        written(encode::write_uint(self.0, value));
    }

    /// Any int a message can carry; non-negative ones in the unsigned forms.
    pub fn int(&mut self, value: i128) {
        match u64::try_from(value) {
            Ok(value) => self.uint(value),
            Err(_) => written(encode::write_sint(self.0, value as i64)),
        }
    }

    pub fn float(&mut self, value: f64) {
        written(encode::write_f64(self.0, value));
    }

    pub fn str(&mut self, value: &str) {
        written(encode::write_str(self.0, value));
    }

    pub fn array(&mut self, len: usize) {
        written(encode::write_array_len(self.0, len as u32));
    }

    pub fn map(&mut self, len: usize) {
        written(encode::write_map_len(self.0, len as u32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(data: &[u8]) -> String {
        unpack(data).unwrap_err()
    }

    fn nested(depth: usize, leaf: &[u8]) -> Vec<u8> {
        let mut data = vec![0x91u8; depth];
        data.extend_from_slice(leaf);
        data
    }

    #[test]
    fn undecodable_messages_are_refused() {
        for data in [
            &b"\x81\xa2id"[..],           // truncated
            b"\xa5ab",                    // str shorter than announced
            b"\xdd\xff\xff\xff\xff",      // an array announcing 2^32-1 items: nothing reserved
            b"\xdf\xff\xff\xff\xff\xa1a", // the same for a map
            b"",
        ] {
            assert!(!refused(data).is_empty(), "{data:?}");
        }
        assert_eq!(
            refused(b"\x01\x02"),
            "1 bytes of extra data after the value"
        );
        assert_eq!(
            refused(b"\x81\x01\x02"),
            "a map key must be a string, not integer"
        );
        assert!(refused(b"\x81\xa1k\xa2\xff\xfe").starts_with("str is not UTF-8: "));
    }

    #[test]
    fn deep_nesting_is_refused_without_deep_recursion() {
        // On a stack the size of the minion's main thread (8 MiB): a debug build's frames
        // outgrow the 2 MiB of a test thread at the 900 levels the protocol allows.
        std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(|| {
                assert!(unpack(&nested(900, b"\x01")).is_ok());
                assert!(unpack(&nested(1100, b"\x01")).is_err());
                assert!(unpack(&nested(1 << 20, b"\x01")).is_err());
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn values_decode_and_fields_read_the_last_entry() {
        let data = b"\x84\xa2op\xa4stat\xa2id\xcd\x01\x00\xa1f\xca\x3f\x80\x00\x00\xa2op\xa4list";
        let value = unpack(data).unwrap();
        let Value::Map(entries) = &value else {
            panic!()
        };
        assert_eq!(Value::get(entries, "op"), Some(&Value::Str("list")));
        assert_eq!(Value::get(entries, "id"), Some(&Value::Int(256.into())));
        assert_eq!(Value::get(entries, "f"), Some(&Value::Float(1.0)));
        let data = b"\x97\xc0\xc3\xcf\xff\xff\xff\xff\xff\xff\xff\xff\xd3\x80\x00\x00\x00\x00\x00\x00\x00\xa2\xc3\xa9\xc4\x01\x00\xd4\x05\x07";
        let expected = Value::Array(vec![
            Value::Nil,
            Value::Bool(true),
            Value::Int(i128::from(u64::MAX).into()),
            Value::Int(i128::from(i64::MIN).into()),
            Value::Str("é"),
            Value::Bin(b"\x00"),
            Value::Ext(5, b"\x07"),
        ]);
        assert_eq!(unpack(data), Ok(expected));
        let entries = [(Value::Str("a"), Value::Nil)];
        assert_eq!(Value::field(&entries, "a"), None);
    }

    #[test]
    fn ints_and_lengths_use_the_smallest_form() {
        let mut out = Vec::new();
        let mut enc = Enc(&mut out);
        for value in [
            0i128,
            127,
            128,
            255,
            256,
            65536,
            1 << 40,
            -1,
            -32,
            -33,
            -129,
            -40000,
            -(1 << 40),
        ] {
            enc.int(value);
        }
        let expected: &[u8] = b"\x00\x7f\xcc\x80\xcc\xff\xcd\x01\x00\xce\x00\x01\x00\x00\xcf\x00\x00\x01\x00\x00\x00\x00\x00\xff\xe0\xd0\xdf\xd1\xff\x7f\xd2\xff\xff\x63\xc0\xd3\xff\xff\xff\x00\x00\x00\x00\x00";
        assert_eq!(out, expected);
        let mut out = Vec::new();
        let mut enc = Enc(&mut out);
        enc.str(&"s".repeat(31));
        enc.str(&"s".repeat(32));
        enc.array(16);
        enc.map(15);
        let mut expected = vec![0xbf];
        expected.extend_from_slice(&[b's'; 31]);
        expected.extend_from_slice(&[0xd9, 32]);
        expected.extend_from_slice(&[b's'; 32]);
        expected.extend_from_slice(b"\xdc\x00\x10\x8f");
        assert_eq!(out, expected);
    }
}

//! MessagePack as the Python minion sees it, on top of `rmpv` (decoding) and `rmp` (encoding).
//!
//! `unpack` decodes with rmpv, then maps its values to what msgpack-python's
//! `unpackb(data, raw=False, strict_map_key=True)` hands the Python minion: one `Int` for every
//! int, a float32 as a double, ext type -1 as a `Timestamp`. What that call refuses is refused
//! here too (the minion answers `undecodable message: <text>`, with rmpv's text or ours, not
//! msgpack-python's): bytes left after the value, a str that is not UTF-8, a map key other than
//! str or bytes, a malformed timestamp, more than 1024 nested arrays and maps. One exception:
//! rmpv reads the reserved byte 0xc1 as nil where msgpack-python refuses the message.
//!
//! Limits on hostile input: a message is at most `MAX_MESSAGE` (1 MiB) bytes; rmpv never
//! reserves memory for the length a header announces (it grows each array and map as items
//! actually decode, msgpack-rust issue 151), so a message decodes to at most one value per byte;
//! its recursion is bounded by `read_value_ref_with_max_depth` (see `RMPV_DEPTH`), and so is
//! ours (conversion, `repr`, drop), since we only ever walk what rmpv accepted.
//!
//! `Enc` writes with rmp's smallest-form functions, which are the forms of msgpack-python's
//! `Packer(use_bin_type=True)`: the smallest int (unsigned if non-negative), str8 for 32..=255
//! bytes, bin for bytes, floats as float64.

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
    /// Entries in wire order, duplicates included; see `get` for Python's dict semantics.
    Map(Vec<(Value<'a>, Value<'a>)>),
    Ext(i8, &'a [u8]),
    Timestamp {
        seconds: i64,
        nanoseconds: u32,
    },
}

pub static NIL: Value<'static> = Value::Nil;

/// Every msgpack int (-2^63 ..= 2^64-1), as one Python int: an `i128` stored at 8-byte
/// alignment, so that `Value` has the layout of rmpv's `ValueRef` and `convert` turns rmpv's
/// arrays and maps into ours in place instead of allocating a second tree for every request.
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
    /// `dict.get(name)` on a decoded map: the last entry with that str key wins, as in Python.
    pub fn get<'v>(entries: &'v [(Value<'a>, Value<'a>)], name: &str) -> Option<&'v Value<'a>> {
        entries
            .iter()
            .rev()
            .find(|(k, _)| matches!(k, Value::Str(s) if *s == name))
            .map(|(_, v)| v)
    }
}

/// Open containers msgpack-python's unpacker allows (its stack size).
const MAX_OPEN: usize = 1024;

/// The depth budget given to rmpv. It spends one unit per value plus one per array or map
/// (two per container) and up to three on a leaf (a str: value, str, bytes), so `MAX_OPEN`
/// containers around any leaf fit; the exact `MAX_OPEN` rule is checked in `convert`.
const RMPV_DEPTH: usize = 2 * MAX_OPEN + 3;

/// Decode one message; `Err` holds why it is refused.
pub fn unpack(data: &[u8]) -> Result<Value<'_>, String> {
    let mut rest = data;
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut rest, RMPV_DEPTH)
        .map_err(|err| err.to_string())?;
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes of extra data after the value",
            rest.len()
        ));
    }
    convert(value, 0)
}

/// rmpv's value as msgpack-python decodes it; `open` counts the enclosing arrays and maps.
fn convert(value: ValueRef<'_>, open: usize) -> Result<Value<'_>, String> {
    let container = |open: usize| {
        if open < MAX_OPEN {
            Ok(open + 1)
        } else {
            Err(format!("more than {MAX_OPEN} nested arrays and maps"))
        }
    };
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
            let open = container(open)?;
            let items = items.into_iter().map(|item| convert(item, open));
            Value::Array(items.collect::<Result<_, _>>()?)
        }
        ValueRef::Map(entries) => {
            let open = container(open)?;
            let entries = entries.into_iter().map(|(key, value)| {
                let key = convert(key, open)?;
                if !matches!(key, Value::Str(_) | Value::Bin(_)) {
                    return Err(format!(
                        "{} is not allowed for map key when strict_map_key=True",
                        crate::pyrepr::type_name(&key)
                    ));
                }
                Ok((key, convert(value, open)?))
            });
            Value::Map(entries.collect::<Result<_, _>>()?)
        }
        ValueRef::Ext(-1, data) => timestamp(data)?,
        ValueRef::Ext(code, data) => Value::Ext(code, data),
    })
}

/// The msgpack timestamp extension (type -1) in its three forms, as msgpack-python reads it.
fn timestamp(data: &[u8]) -> Result<Value<'static>, String> {
    let (seconds, nanoseconds) = if let Ok(secs) = <[u8; 4]>::try_from(data) {
        (u32::from_be_bytes(secs).into(), 0)
    } else if let Ok(both) = <[u8; 8]>::try_from(data) {
        let both = u64::from_be_bytes(both);
        ((both & ((1 << 34) - 1)) as i64, (both >> 34) as u32)
    } else if let Ok([n0, n1, n2, n3, secs @ ..]) = <[u8; 12]>::try_from(data) {
        (
            i64::from_be_bytes(secs),
            u32::from_be_bytes([n0, n1, n2, n3]),
        )
    } else {
        return Err(format!("invalid timestamp data (length {})", data.len()));
    };
    if nanoseconds > 999_999_999 {
        return Err("timestamp nanoseconds above 999999999".to_owned());
    }
    Ok(Value::Timestamp {
        seconds,
        nanoseconds,
    })
}

/// rmp writes through `std::io::Write`, which cannot fail on a `Vec` (it grows or aborts).
fn written<T, E: std::fmt::Debug>(result: Result<T, E>) {
    result.expect("writing to a Vec cannot fail");
}

/// Appends msgpack to a reused buffer, in msgpack-python's `Packer(use_bin_type=True)` forms.
pub struct Enc<'b>(pub &'b mut Vec<u8>);

impl Enc<'_> {
    pub fn nil(&mut self) {
        written(encode::write_nil(self.0));
    }

    pub fn bool(&mut self, value: bool) {
        written(encode::write_bool(self.0, value));
    }

    pub fn uint(&mut self, value: u64) {
        written(encode::write_uint(self.0, value));
    }

    /// Any int a message can carry; non-negative ones in the unsigned forms, as Python packs.
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

    pub fn bin(&mut self, value: &[u8]) {
        written(encode::write_bin(self.0, value));
    }

    pub fn array(&mut self, len: usize) {
        written(encode::write_array_len(self.0, len as u32));
    }

    pub fn map(&mut self, len: usize) {
        written(encode::write_map_len(self.0, len as u32));
    }

    pub fn ext(&mut self, code: i8, data: &[u8]) {
        written(encode::write_ext_meta(self.0, data.len() as u32, code));
        self.0.extend_from_slice(data);
    }

    /// A decoded value as Python packs it back after the round trip: maps without duplicate
    /// keys (dict semantics), floats as float64, timestamps in their smallest form.
    pub fn value(&mut self, value: &Value) {
        match value {
            Value::Nil => self.nil(),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(i.get()),
            Value::Float(f) => self.float(*f),
            Value::Str(s) => self.str(s),
            Value::Bin(b) => self.bin(b),
            Value::Array(items) => {
                self.array(items.len());
                for item in items {
                    self.value(item);
                }
            }
            Value::Map(entries) => {
                let unique = dict_entries(entries);
                self.map(unique.len());
                for (key, value) in unique {
                    self.value(key);
                    self.value(value);
                }
            }
            Value::Ext(code, data) => self.ext(*code, data),
            Value::Timestamp {
                seconds,
                nanoseconds,
            } => {
                let (seconds, nanoseconds) = (*seconds, *nanoseconds);
                if seconds >> 34 == 0 {
                    let both = (nanoseconds as u64) << 34 | seconds as u64;
                    if both >> 32 == 0 {
                        self.ext(-1, &(both as u32).to_be_bytes());
                    } else {
                        self.ext(-1, &both.to_be_bytes());
                    }
                } else {
                    let mut data = [0u8; 12];
                    data[..4].copy_from_slice(&nanoseconds.to_be_bytes());
                    data[4..].copy_from_slice(&seconds.to_be_bytes());
                    self.ext(-1, &data);
                }
            }
        }
    }
}

/// The entries of the dict Python builds from a map: first position, last value per key.
pub fn dict_entries<'v, 'a>(
    entries: &'v [(Value<'a>, Value<'a>)],
) -> Vec<(&'v Value<'a>, &'v Value<'a>)> {
    let mut unique: Vec<(&Value, &Value)> = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        match unique.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => unique.push((key, value)),
        }
    }
    unique
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
    fn what_msgpack_python_refuses_is_refused() {
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
            refused(b"\xc1\xc1"),
            "1 bytes of extra data after the value"
        );
        assert_eq!(
            refused(b"\x81\x01\x02"),
            "int is not allowed for map key when strict_map_key=True"
        );
        assert_eq!(
            refused(b"\x91\x81\x91\x01\x02"),
            "list is not allowed for map key when strict_map_key=True"
        );
        assert_eq!(
            refused(b"\x81\xd4\x05\x01\x01"),
            "ExtType is not allowed for map key when strict_map_key=True"
        );
        assert!(refused(b"\x81\xa1k\xa2\xff\xfe").starts_with("str is not UTF-8: "));
        assert_eq!(
            refused(b"\xd5\xff\x00\x01"),
            "invalid timestamp data (length 2)"
        );
        assert_eq!(
            refused(b"\xd7\xff\xff\xff\xff\xfc\x00\x00\x00\x05"),
            "timestamp nanoseconds above 999999999"
        );
    }

    #[test]
    fn the_reserved_byte_reads_as_nil() {
        // The one refusal of msgpack-python this module does not repeat (rmpv's reading).
        assert_eq!(unpack(b"\xc1"), Ok(Value::Nil));
    }

    #[test]
    fn nesting_stops_at_1024_open_containers() {
        for leaf in [&b"\x01"[..], b"\xa3abc", b"\xd4\x05\x01", b"\xc4\x01x"] {
            assert!(unpack(&nested(1024, leaf)).is_ok(), "{leaf:?}");
            assert!(unpack(&nested(1025, leaf)).is_err(), "{leaf:?}");
        }
        assert!(unpack(&nested(1023, b"\x90")).is_ok());
        assert!(unpack(&nested(1023, b"\x80")).is_ok());
        assert!(unpack(&nested(1024, b"\x90")).is_err());
        // Far deeper than the limit: refused by rmpv before any deep recursion.
        assert!(unpack(&nested(1 << 20, b"\x01")).is_err());
        let mut in_map = b"\x81\xa1k".to_vec();
        in_map.extend(nested(1023, b"\x01"));
        assert!(unpack(&in_map).is_ok());
        in_map.insert(3, 0x91);
        assert!(unpack(&in_map).is_err());
    }

    #[test]
    fn values_round_trip_as_python_repacks_them() {
        let data = b"\x85\xa2op\xa4stat\xa2id\xcd\x01\x00\xa1f\xca\x3f\x80\x00\x00\xa2op\xa4list\xa1t\xc7\x0c\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05";
        let value = unpack(data).unwrap();
        let Value::Map(entries) = &value else {
            panic!()
        };
        assert_eq!(Value::get(entries, "op"), Some(&Value::Str("list")));
        assert_eq!(Value::get(entries, "id"), Some(&Value::Int(256.into())));
        let mut out = Vec::new();
        Enc(&mut out).value(&value);
        // One "op" (the last value in the first place), a float64, a 32-bit timestamp.
        assert_eq!(
            out,
            b"\x84\xa2op\xa4list\xa2id\xcd\x01\x00\xa1f\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\xa1t\xd6\xff\x00\x00\x00\x05"
        );
    }

    #[test]
    fn values_decode_as_msgpack_python_decodes_them() {
        let data = b"\x9a\xc0\xc3\xcf\xff\xff\xff\xff\xff\xff\xff\xff\xd3\x80\x00\x00\x00\x00\x00\x00\x00\xff\xa2\xc3\xa9\xc4\x01\x00\xd4\x05\x07\xd6\xff\x00\x00\x00\x01\xc7\x0c\xff\x00\x00\x00\x07\xff\xff\xff\xff\xff\xff\xff\xfe";
        let expected = Value::Array(vec![
            Value::Nil,
            Value::Bool(true),
            Value::Int(i128::from(u64::MAX).into()),
            Value::Int(i128::from(i64::MIN).into()),
            Value::Int((-1).into()),
            Value::Str("é"),
            Value::Bin(b"\x00"),
            Value::Ext(5, b"\x07"),
            Value::Timestamp {
                seconds: 1,
                nanoseconds: 0,
            },
            Value::Timestamp {
                seconds: -2,
                nanoseconds: 7,
            },
        ]);
        assert_eq!(unpack(data), Ok(expected.clone()));
        // And back: each in the form msgpack-python packs it.
        let mut out = Vec::new();
        Enc(&mut out).value(&expected);
        assert_eq!(out, data);
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
        enc.bin(b"");
        enc.array(16);
        enc.map(15);
        enc.ext(1, &[0; 3]);
        let mut expected = vec![0xbf];
        expected.extend_from_slice(&[b's'; 31]);
        expected.extend_from_slice(&[0xd9, 32]);
        expected.extend_from_slice(&[b's'; 32]);
        expected.extend_from_slice(b"\xc4\x00\xdc\x00\x10\x8f\xc7\x03\x01\x00\x00\x00");
        assert_eq!(out, expected);
    }
}

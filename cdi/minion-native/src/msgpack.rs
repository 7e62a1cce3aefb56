//! MessagePack exactly as the Python minion sees it.
//!
//! Decoding mirrors msgpack-python's `unpackb(data, raw=False, strict_map_key=True)`: the same
//! values (a float32 becomes a double, ext type -1 a `Timestamp`), the same limits (1024 open
//! containers; an array may not announce more items than the message has bytes, a map more than
//! half of them) and the same error texts, because the minion sends them back as
//! `undecodable message: ...`. Encoding mirrors `Packer(use_bin_type=True)`: the smallest form of
//! each int, str and container, floats as float64. A general-purpose crate would not do: rmpv,
//! for one, reads the reserved byte 0xc1 as nil where msgpack-python refuses the message.

/// One decoded value; strings and byte strings borrow the receive buffer.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    /// Every msgpack int (-2^63 ..= 2^64-1).
    Int(i128),
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
const INCOMPLETE: &str = "Unpack failed: incomplete input";

/// Decode one message; `Err` holds the text of the exception msgpack-python would raise.
pub fn unpack(data: &[u8]) -> Result<Value<'_>, String> {
    let mut decoder = Decoder {
        data,
        pos: 0,
        open: 0,
    };
    let value = decoder.value()?;
    if decoder.pos < data.len() {
        return Err("unpack(b) received extra data.".to_owned());
    }
    Ok(value)
}

struct Decoder<'a> {
    data: &'a [u8],
    pos: usize,
    open: usize,
}

impl<'a> Decoder<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.data.len() - self.pos < n {
            return Err(INCOMPLETE.to_owned());
        }
        let bytes = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<usize, String> {
        Ok(u16::from_be_bytes(self.be()?) as usize)
    }

    fn u32(&mut self) -> Result<usize, String> {
        Ok(u32::from_be_bytes(self.be()?) as usize)
    }

    fn value(&mut self) -> Result<Value<'a>, String> {
        let marker = self.u8()?;
        Ok(match marker {
            0x00..=0x7f => Value::Int(marker as i128),
            0x80..=0x8f => return self.map((marker & 0x0f) as usize),
            0x90..=0x9f => return self.array((marker & 0x0f) as usize),
            0xa0..=0xbf => return self.str((marker & 0x1f) as usize),
            0xc0 => Value::Nil,
            0xc1 => return Err(String::new()), // FormatError, whose text is empty
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4 => {
                let n = self.u8()? as usize;
                Value::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = self.u16()?;
                Value::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.u32()?;
                Value::Bin(self.take(n)?)
            }
            0xc7 => {
                let n = self.u8()? as usize;
                return self.ext(n);
            }
            0xc8 => {
                let n = self.u16()?;
                return self.ext(n);
            }
            0xc9 => {
                let n = self.u32()?;
                return self.ext(n);
            }
            0xca => Value::Float(f32::from_be_bytes(self.be()?) as f64),
            0xcb => Value::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Value::Int(self.u8()? as i128),
            0xcd => Value::Int(self.u16()? as i128),
            0xce => Value::Int(self.u32()? as i128),
            0xcf => Value::Int(u64::from_be_bytes(self.be()?) as i128),
            0xd0 => Value::Int(i8::from_be_bytes(self.be()?) as i128),
            0xd1 => Value::Int(i16::from_be_bytes(self.be()?) as i128),
            0xd2 => Value::Int(i32::from_be_bytes(self.be()?) as i128),
            0xd3 => Value::Int(i64::from_be_bytes(self.be()?) as i128),
            0xd4 => return self.ext(1),
            0xd5 => return self.ext(2),
            0xd6 => return self.ext(4),
            0xd7 => return self.ext(8),
            0xd8 => return self.ext(16),
            0xd9 => {
                let n = self.u8()? as usize;
                return self.str(n);
            }
            0xda => {
                let n = self.u16()?;
                return self.str(n);
            }
            0xdb => {
                let n = self.u32()?;
                return self.str(n);
            }
            0xdc => {
                let n = self.u16()?;
                return self.array(n);
            }
            0xdd => {
                let n = self.u32()?;
                return self.array(n);
            }
            0xde => {
                let n = self.u16()?;
                return self.map(n);
            }
            0xdf => {
                let n = self.u32()?;
                return self.map(n);
            }
            0xe0..=0xff => Value::Int(marker as i8 as i128),
        })
    }

    fn str(&mut self, n: usize) -> Result<Value<'a>, String> {
        let bytes = self.take(n)?;
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(Value::Str(text)),
            Err(err) => Err(utf8_error(bytes, &err)),
        }
    }

    fn open_container(&mut self) -> Result<(), String> {
        if self.open >= MAX_OPEN {
            return Err(String::new()); // StackError, whose text is empty
        }
        self.open += 1;
        Ok(())
    }

    fn array(&mut self, n: usize) -> Result<Value<'a>, String> {
        self.open_container()?;
        if n > self.data.len() {
            return Err(format!("{n} exceeds max_array_len({})", self.data.len()));
        }
        let mut items = Vec::with_capacity(n.min(16)); // n is the sender's claim
        for _ in 0..n {
            items.push(self.value()?);
        }
        self.open -= 1;
        Ok(Value::Array(items))
    }

    fn map(&mut self, n: usize) -> Result<Value<'a>, String> {
        self.open_container()?;
        if n > self.data.len() / 2 {
            return Err(format!("{n} exceeds max_map_len({})", self.data.len() / 2));
        }
        let mut entries = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            let key = self.value()?;
            let value = self.value()?;
            // Checked once the value is complete, as msgpack-python's map_item does.
            if !matches!(key, Value::Str(_) | Value::Bin(_)) {
                return Err(format!(
                    "{} is not allowed for map key when strict_map_key=True",
                    crate::pyrepr::type_name(&key)
                ));
            }
            entries.push((key, value));
        }
        self.open -= 1;
        Ok(Value::Map(entries))
    }

    fn ext(&mut self, n: usize) -> Result<Value<'a>, String> {
        let code = self.u8()? as i8;
        let data = self.take(n)?;
        if code != -1 {
            return Ok(Value::Ext(code, data));
        }
        let (seconds, nanoseconds) = match n {
            4 => (
                u32::from_be_bytes(data.try_into().unwrap_or_default()) as i64,
                0,
            ),
            8 => {
                let both = u64::from_be_bytes(data.try_into().unwrap_or_default());
                ((both & ((1 << 34) - 1)) as i64, (both >> 34) as u32)
            }
            12 => (
                i64::from_be_bytes(data[4..].try_into().unwrap_or_default()),
                u32::from_be_bytes(data[..4].try_into().unwrap_or_default()),
            ),
            _ => return Err(format!("invalid timestamp data (length {n})")),
        };
        if nanoseconds > 999_999_999 {
            return Err(
                "nanoseconds must be a non-negative integer not greater than 999999999.".to_owned(),
            );
        }
        Ok(Value::Timestamp {
            seconds,
            nanoseconds,
        })
    }
}

/// Python's UnicodeDecodeError text for invalid UTF-8. Rust and CPython both report the
/// maximal invalid subpart (Unicode's recommended practice), so the positions agree.
fn utf8_error(bytes: &[u8], err: &std::str::Utf8Error) -> String {
    let start = err.valid_up_to();
    let (end, reason) = match err.error_len() {
        None => (bytes.len(), "unexpected end of data"),
        Some(1) if matches!(bytes[start], 0x80..=0xc1 | 0xf5..=0xff) => {
            (start + 1, "invalid start byte")
        }
        Some(n) => (start + n, "invalid continuation byte"),
    };
    if end - start == 1 {
        format!(
            "'utf-8' codec can't decode byte 0x{:02x} in position {start}: {reason}",
            bytes[start]
        )
    } else {
        format!(
            "'utf-8' codec can't decode bytes in position {start}-{}: {reason}",
            end - 1
        )
    }
}

/// Appends msgpack to a reused buffer, in msgpack-python's `Packer(use_bin_type=True)` forms.
pub struct Enc<'b>(pub &'b mut Vec<u8>);

impl Enc<'_> {
    pub fn nil(&mut self) {
        self.0.push(0xc0);
    }

    pub fn bool(&mut self, value: bool) {
        self.0.push(if value { 0xc3 } else { 0xc2 });
    }

    pub fn uint(&mut self, value: u64) {
        let out = &mut *self.0;
        if value < 0x80 {
            out.push(value as u8);
        } else if value <= 0xff {
            out.extend_from_slice(&[0xcc, value as u8]);
        } else if value <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(value as u16).to_be_bytes());
        } else if value <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(value as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }

    /// Any int a message can carry; non-negative ones in the unsigned forms, as Python packs.
    pub fn int(&mut self, value: i128) {
        if value >= 0 {
            self.uint(value as u64);
            return;
        }
        let out = &mut *self.0;
        if value >= -32 {
            out.push(value as i8 as u8);
        } else if value >= -0x80 {
            out.extend_from_slice(&[0xd0, value as i8 as u8]);
        } else if value >= -0x8000 {
            out.push(0xd1);
            out.extend_from_slice(&(value as i16).to_be_bytes());
        } else if value >= -0x8000_0000 {
            out.push(0xd2);
            out.extend_from_slice(&(value as i32).to_be_bytes());
        } else {
            out.push(0xd3);
            out.extend_from_slice(&(value as i64).to_be_bytes());
        }
    }

    pub fn float(&mut self, value: f64) {
        self.0.push(0xcb);
        self.0.extend_from_slice(&value.to_be_bytes());
    }

    fn header(&mut self, len: usize, fix: Option<(u8, usize)>, markers: [u8; 3]) {
        let out = &mut *self.0;
        match fix {
            Some((base, limit)) if len < limit => out.push(base | len as u8),
            _ if markers[0] != 0 && len <= 0xff => out.extend_from_slice(&[markers[0], len as u8]),
            _ if len <= 0xffff => {
                out.push(markers[1]);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                out.push(markers[2]);
                out.extend_from_slice(&(len as u32).to_be_bytes());
            }
        }
    }

    pub fn str(&mut self, value: &str) {
        self.header(value.len(), Some((0xa0, 32)), [0xd9, 0xda, 0xdb]);
        self.0.extend_from_slice(value.as_bytes());
    }

    pub fn bin(&mut self, value: &[u8]) {
        self.header(value.len(), None, [0xc4, 0xc5, 0xc6]);
        self.0.extend_from_slice(value);
    }

    pub fn array(&mut self, len: usize) {
        self.header(len, Some((0x90, 16)), [0, 0xdc, 0xdd]);
    }

    pub fn map(&mut self, len: usize) {
        self.header(len, Some((0x80, 16)), [0, 0xde, 0xdf]);
    }

    pub fn ext(&mut self, code: i8, data: &[u8]) {
        let fixed = match data.len() {
            1 => Some(0xd4),
            2 => Some(0xd5),
            4 => Some(0xd6),
            8 => Some(0xd7),
            16 => Some(0xd8),
            _ => None,
        };
        match fixed {
            Some(marker) => self.0.push(marker),
            None => self.header(data.len(), None, [0xc7, 0xc8, 0xc9]),
        }
        self.0.push(code as u8);
        self.0.extend_from_slice(data);
    }

    /// A decoded value as Python packs it back after the round trip: maps without duplicate
    /// keys (dict semantics), floats as float64, timestamps in their smallest form.
    pub fn value(&mut self, value: &Value) {
        match value {
            Value::Nil => self.nil(),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(*i),
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

    fn err(data: &[u8]) -> String {
        unpack(data).unwrap_err()
    }

    #[test]
    fn errors_read_as_msgpack_python_words_them() {
        assert_eq!(err(b"\xc1\xc1 not msgpack"), "");
        assert_eq!(err(b"\x81\xa2id"), "Unpack failed: incomplete input");
        assert_eq!(err(b"\x01\x02"), "unpack(b) received extra data.");
        assert_eq!(
            err(b"\x81\x01\x02"),
            "int is not allowed for map key when strict_map_key=True"
        );
        assert_eq!(
            err(b"\x81\x91\x01\x02"),
            "list is not allowed for map key when strict_map_key=True"
        );
        assert_eq!(
            err(b"\x81\xc0\x01"),
            "NoneType is not allowed for map key when strict_map_key=True"
        );
        assert_eq!(
            err(b"\x81\xd4\x05\x01\x01"),
            "ExtType is not allowed for map key when strict_map_key=True"
        );
        assert_eq!(err(b"\x93\x01"), "3 exceeds max_array_len(2)");
        assert_eq!(err(b"\x82\xa1a"), "2 exceeds max_map_len(1)");
        assert_eq!(err(b"\xa5ab"), "Unpack failed: incomplete input");
        assert_eq!(
            err(b"\xd5\xff\x00\x01"),
            "invalid timestamp data (length 2)"
        );
        assert_eq!(
            err(b"\xd7\xff\xff\xff\xff\xfc\x00\x00\x00\x05"),
            "nanoseconds must be a non-negative integer not greater than 999999999."
        );
        // The value's error comes before the key's type error, as in the C unpacker.
        assert!(err(b"\x81\x01\xa1\x80").contains("invalid start byte"));
    }

    #[test]
    fn utf8_errors_name_the_same_bytes_as_python() {
        let cases: [(&[u8], &str); 7] = [
            (
                b"\xa2\xff\xfe",
                "byte 0xff in position 0: invalid start byte",
            ),
            (
                b"\xa2\xc3(",
                "byte 0xc3 in position 0: invalid continuation byte",
            ),
            (
                b"\xa3\xe2\x82(",
                "bytes in position 0-1: invalid continuation byte",
            ),
            (
                b"\xa3\xed\xa0\x80",
                "byte 0xed in position 0: invalid continuation byte",
            ),
            (
                b"\xa2\xf0\x9f",
                "bytes in position 0-1: unexpected end of data",
            ),
            (b"\xa1\x80", "byte 0x80 in position 0: invalid start byte"),
            (
                b"\xa5ab\xf0\x9fx",
                "bytes in position 2-3: invalid continuation byte",
            ),
        ];
        for (data, tail) in cases {
            assert_eq!(err(data), format!("'utf-8' codec can't decode {tail}"));
        }
    }

    #[test]
    fn nesting_stops_at_1024_open_containers() {
        let deep = |n: usize, last: u8| {
            let mut data = vec![0x91u8; n];
            data.push(last);
            data
        };
        assert!(unpack(&deep(1024, 0x01)).is_ok());
        assert!(unpack(&deep(1023, 0x90)).is_ok());
        assert_eq!(err(&deep(1024, 0x90)), "");
        assert_eq!(err(&deep(1025, 0x01)), "");
    }

    #[test]
    fn values_round_trip_as_python_repacks_them() {
        let data = b"\x85\xa2op\xa4stat\xa2id\xcd\x01\x00\xa1f\xca\x3f\x80\x00\x00\xa2op\xa4list\xa1t\xc7\x0c\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05";
        let value = unpack(data).unwrap();
        let Value::Map(entries) = &value else {
            panic!()
        };
        assert_eq!(Value::get(entries, "op"), Some(&Value::Str("list")));
        assert_eq!(Value::get(entries, "id"), Some(&Value::Int(256)));
        let mut out = Vec::new();
        Enc(&mut out).value(&value);
        // One "op" (the last value in the first place), a float64, a 32-bit timestamp.
        assert_eq!(
            out,
            b"\x84\xa2op\xa4list\xa2id\xcd\x01\x00\xa1f\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\xa1t\xd6\xff\x00\x00\x00\x05"
        );
    }

    #[test]
    fn ints_use_the_smallest_form() {
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
    }
}

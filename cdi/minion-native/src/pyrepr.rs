//! How Python renders decoded values in error messages: `repr()`, `type(x).__name__` and
//! truthiness. The Python minion's messages embed these (`f"... got {value!r}"`), clients and
//! tests match on them, so the native minion renders them the same way.

use std::fmt::Write;

use crate::msgpack::{dict_entries, Value};
use crate::pyrepr_table::NOT_PRINTABLE;

/// Nesting at which Python gives up on `repr()` of nested lists in the minion's handlers
/// ("maximum recursion depth exceeded"): its recursion limit of 1000 less the frames already
/// on the stack there. Measured against the Python minion (see tools/parity.py).
pub const REPR_DEPTH_LIMIT: usize = 985;

/// What Python raises when a value is nested too deeply to render.
pub const REPR_TOO_DEEP: &str =
    "maximum recursion depth exceeded while getting the repr of an object";

/// `type(value).__name__` of the object msgpack-python decodes.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Nil => "NoneType",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::Float(_) => "float",
        Value::Str(_) => "str",
        Value::Bin(_) => "bytes",
        Value::Array(_) => "list",
        Value::Map(_) => "dict",
        Value::Ext(..) => "ExtType",
        Value::Timestamp { .. } => "Timestamp",
    }
}

/// `bool(value)` in Python.
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Nil => false,
        Value::Bool(b) => *b,
        Value::Int(i) => i.get() != 0,
        Value::Float(f) => *f != 0.0,
        Value::Str(s) => !s.is_empty(),
        Value::Bin(b) => !b.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Map(entries) => !entries.is_empty(),
        Value::Ext(..) | Value::Timestamp { .. } => true,
    }
}

/// `repr(value)`; `Err` where Python would hit its recursion limit.
pub fn repr(value: &Value) -> Result<String, &'static str> {
    let mut out = String::new();
    write_repr(&mut out, value, 0)?;
    Ok(out)
}

/// `repr(text)` for a str.
pub fn repr_str(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    write_str(&mut out, text);
    out
}

fn write_repr(out: &mut String, value: &Value, depth: usize) -> Result<(), &'static str> {
    match value {
        Value::Nil => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => out.push_str(&float_repr(*f)),
        Value::Str(s) => write_str(out, s),
        Value::Bin(b) => write_bytes(out, b),
        Value::Array(items) => {
            if depth >= REPR_DEPTH_LIMIT {
                return Err(REPR_TOO_DEEP);
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, item, depth + 1)?;
            }
            out.push(']');
        }
        Value::Map(entries) => {
            if depth >= REPR_DEPTH_LIMIT {
                return Err(REPR_TOO_DEEP);
            }
            out.push('{');
            for (i, (key, item)) in dict_entries(entries).into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, key, depth + 1)?;
                out.push_str(": ");
                write_repr(out, item, depth + 1)?;
            }
            out.push('}');
        }
        Value::Ext(code, data) => {
            let _ = write!(out, "ExtType(code={code}, data=");
            write_bytes(out, data);
            out.push(')');
        }
        Value::Timestamp {
            seconds,
            nanoseconds,
        } => {
            let _ = write!(
                out,
                "Timestamp(seconds={seconds}, nanoseconds={nanoseconds})"
            );
        }
    }
    Ok(())
}

/// Python's quote choice: single quotes unless the text has one and no double quote.
fn quote_for(has_single: bool, has_double: bool) -> char {
    if has_single && !has_double {
        '"'
    } else {
        '\''
    }
}

fn write_str(out: &mut String, text: &str) {
    let quote = quote_for(text.contains('\''), text.contains('"'));
    out.push(quote);
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ if ch == quote => {
                out.push('\\');
                out.push(ch);
            }
            _ if is_printable(ch) => out.push(ch),
            _ => {
                let cp = ch as u32;
                let _ = if cp <= 0xff {
                    write!(out, "\\x{cp:02x}")
                } else if cp <= 0xffff {
                    write!(out, "\\u{cp:04x}")
                } else {
                    write!(out, "\\U{cp:08x}")
                };
            }
        }
    }
    out.push(quote);
}

fn write_bytes(out: &mut String, data: &[u8]) {
    let quote = quote_for(data.contains(&b'\''), data.contains(&b'"'));
    out.push('b');
    out.push(quote);
    for &byte in data {
        match byte {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            _ if byte as char == quote => {
                out.push('\\');
                out.push(quote);
            }
            0x20..=0x7e => out.push(byte as char),
            _ => {
                let _ = write!(out, "\\x{byte:02x}");
            }
        }
    }
    out.push(quote);
}

/// `str.isprintable()` for one character (Python 3.11's Unicode tables).
fn is_printable(ch: char) -> bool {
    let cp = ch as u32;
    if (0x20..0x7f).contains(&cp) {
        return true;
    }
    NOT_PRINTABLE
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_err()
}

/// `repr(float)`: the shortest digits that round-trip, in fixed notation for exponents -4..16
/// and scientific otherwise, always with a ".0" or an exponent.
pub fn float_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let sci = format!("{:e}", value.abs()); // shortest round-trip digits, e.g. "1.5e-7"
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if value.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        let point = exponent + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if digits.len() <= point as usize {
            format!(
                "{sign}{digits}{}.0",
                "0".repeat(point as usize - digits.len())
            )
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{first}{dot}e{esign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_render_as_python_repr() {
        assert_eq!(repr_str("abc"), "'abc'");
        assert_eq!(repr_str("a'b"), "\"a'b\"");
        assert_eq!(repr_str("a\"b"), "'a\"b'");
        assert_eq!(repr_str("a'\"b"), "'a\\'\"b'");
        assert_eq!(repr_str("has space"), "'has space'");
        assert_eq!(repr_str("nul\0byte\n\t\r\\"), "'nul\\x00byte\\n\\t\\r\\\\'");
        assert_eq!(
            repr_str("\x7f\u{80}\u{ad}\u{2028} é\u{e0001}\u{d7ff}"),
            "'\\x7f\\x80\\xad\\u2028 é\\U000e0001\\ud7ff'"
        );
        assert_eq!(repr_str("😀ß"), "'😀ß'");
    }

    #[test]
    fn values_render_as_python_repr() {
        let list = Value::Array(vec![
            Value::Nil,
            Value::Bool(true),
            Value::Int((-5).into()),
            Value::Float(2.5),
            Value::Bin(b"a'\"\x00\xff"),
            Value::Map(vec![
                (Value::Str("k"), Value::Int(1.into())),
                (Value::Bin(b"k"), Value::Int(2.into())),
                (Value::Str("k"), Value::Int(3.into())),
            ]),
            Value::Ext(5, b"\x01"),
            Value::Timestamp {
                seconds: 1,
                nanoseconds: 0,
            },
        ]);
        assert_eq!(
            repr(&list).unwrap(),
            "[None, True, -5, 2.5, b'a\\'\"\\x00\\xff', {'k': 3, b'k': 2}, \
             ExtType(code=5, data=b'\\x01'), Timestamp(seconds=1, nanoseconds=0)]"
        );
        assert_eq!(
            repr(&Value::Int(18446744073709551615.into())).unwrap(),
            "18446744073709551615"
        );
    }

    #[test]
    fn floats_render_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (f32::from_bits(0x3dcccccd) as f64, "0.10000000149011612"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ];
        for (value, text) in cases {
            assert_eq!(float_repr(value), text, "{value:e}");
        }
    }

    #[test]
    fn type_names_and_truth_follow_python() {
        assert_eq!(type_name(&Value::Nil), "NoneType");
        assert_eq!(type_name(&Value::Float(1.0)), "float");
        assert_eq!(type_name(&Value::Array(vec![])), "list");
        assert!(!truthy(&Value::Str("")) && truthy(&Value::Str("x")));
        assert!(
            !truthy(&Value::Int(0.into()))
                && !truthy(&Value::Float(0.0))
                && truthy(&Value::Float(f64::NAN))
        );
    }

    #[test]
    fn deep_nesting_fails_like_python() {
        let mut value = Value::Int(1.into());
        for _ in 0..REPR_DEPTH_LIMIT {
            value = Value::Array(vec![value]);
        }
        assert!(repr(&value).is_ok());
        value = Value::Array(vec![value]);
        assert_eq!(repr(&value), Err(REPR_TOO_DEEP));
    }
}

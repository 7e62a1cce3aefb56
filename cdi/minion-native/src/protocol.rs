//! The wire protocol's vocabulary and argument validation (`cdi/PROTOCOL.md`).
//!
//! Every error carries one of the protocol's codes, which clients turn back into exceptions
//! (`cdi/errors.py`); the message is for people and free in its wording.

use std::borrow::Cow;

use crate::msgpack::Value;

/// Largest message either side sends; a request beyond it is refused, not truncated.
pub const MAX_MESSAGE: usize = 1 << 20;
pub const MAX_KEY_LENGTH: usize = 256;
/// Segment ids a `create` may name as already mapped by the caller.
pub const MAX_OFFERED_SEGMENTS: usize = 64;
/// Containers one `share` may name.
pub const MAX_READERS: usize = 64;

/// An error reply: `{"ok": false, "code": code, "msg": msg}`.
#[derive(Debug, Clone, PartialEq)]
pub struct CdiError {
    pub code: &'static str,
    pub msg: String,
}

/// Why a request failed: a CDI error, or a bug, which is logged and answered as `cdi_error`
/// "internal minion error: ...".
#[derive(Debug)]
pub enum Failure {
    Cdi(CdiError),
    Internal(String),
}

impl From<CdiError> for Failure {
    fn from(err: CdiError) -> Self {
        Failure::Cdi(err)
    }
}

impl CdiError {
    /// A bug, answered as `cdi_error`.
    pub fn internal(text: impl std::fmt::Display) -> Self {
        CdiError {
            code: "cdi_error",
            msg: format!("internal minion error: {text}"),
        }
    }
}

macro_rules! error_kinds {
    ($($name:ident => $code:literal),* $(,)?) => {
        impl CdiError {
            $(pub fn $name(msg: impl Into<String>) -> Self {
                CdiError { code: $code, msg: msg.into() }
            })*
        }
    };
}

error_kinds! {
    invalid_argument => "invalid_argument",
    protocol => "protocol",
    not_registered => "not_registered",
    unknown_container => "unknown_container",
    container_exists => "container_exists",
    key_exists => "key_exists",
    not_found => "not_found",
    not_owner => "not_owner",
    out_of_memory => "out_of_memory",
    shared => "shared",
    name_not_allowed => "name_not_allowed",
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Register,
    Create,
    Use,
    Copy,
    Access,
    Cancel,
    Transfer,
    Resize,
    Destroy,
    SetRecovery,
    Share,
    Read,
    Release,
    Stat,
    List,
}

impl Op {
    pub fn parse(name: &str) -> Option<Op> {
        Some(match name {
            "register" => Op::Register,
            "create" => Op::Create,
            "use" => Op::Use,
            "copy" => Op::Copy,
            "access" => Op::Access,
            "cancel" => Op::Cancel,
            "transfer" => Op::Transfer,
            "resize" => Op::Resize,
            "destroy" => Op::Destroy,
            "set_recovery" => Op::SetRecovery,
            "share" => Op::Share,
            "read" => Op::Read,
            "release" => Op::Release,
            "stat" => Op::Stat,
            "list" => Op::List,
            _ => return None,
        })
    }

    /// Allowed before `register`.
    pub fn is_open(self) -> bool {
        matches!(self, Op::Register | Op::Stat | Op::List)
    }
}

/// How hard a transfer revokes the former owner's access (see `cdi/protocol.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    Cooperative,
    Strict,
}

impl Isolation {
    pub fn parse(name: &str) -> Option<Isolation> {
        match name {
            "cooperative" => Some(Isolation::Cooperative),
            "strict" => Some(Isolation::Strict),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Cooperative => "cooperative",
            Isolation::Strict => "strict",
        }
    }
}

/// Letters, digits and `_ . : / @ + = -`, one or more.
fn matches_name_pattern(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/@+=-".contains(&b))
}

fn check_name<'v>(value: &Value<'v>, what: &str) -> Result<Cow<'v, str>, CdiError> {
    let text: Cow<str> = match value {
        Value::Str(s) => Cow::Borrowed(*s),
        // The paper's container ids are integers; accept them as names.
        Value::Int(i) if what == "container id" => Cow::Owned(i.to_string()),
        other => {
            return Err(CdiError::invalid_argument(format!(
                "{what} must be a string, got {}",
                other.kind()
            )))
        }
    };
    if text.is_empty() {
        return Err(CdiError::invalid_argument(format!(
            "{what} must not be empty"
        )));
    }
    if text.len() > MAX_KEY_LENGTH {
        let chars = text.chars().count(); // the limit is in characters
        if chars > MAX_KEY_LENGTH {
            return Err(CdiError::invalid_argument(format!(
                "{what} is {chars} characters long; the limit is {MAX_KEY_LENGTH}"
            )));
        }
    }
    if !matches_name_pattern(&text) {
        return Err(CdiError::invalid_argument(format!(
            "{what} {text:?} has characters outside letters, digits and _ . : / @ + = -"
        )));
    }
    Ok(text)
}

/// A valid object key, else `InvalidArgument`.
pub fn check_key<'v>(key: &Value<'v>) -> Result<Cow<'v, str>, CdiError> {
    check_name(key, "key")
}

/// A container id as a string (integers are accepted), else `InvalidArgument`.
pub fn check_container_id<'v>(value: &Value<'v>) -> Result<Cow<'v, str>, CdiError> {
    check_name(value, "container id")
}

/// The container ids a `share` names: a non-empty array of at most `MAX_READERS` ids.
pub fn check_container_ids<'v>(value: &Value<'v>) -> Result<Vec<Cow<'v, str>>, CdiError> {
    match value {
        Value::Array(items) if !items.is_empty() && items.len() <= MAX_READERS => {
            items.iter().map(check_container_id).collect()
        }
        _ => Err(CdiError::invalid_argument(format!(
            "readers must be a list of 1 to {MAX_READERS} container ids"
        ))),
    }
}

/// An int in `[0, limit]`, else `InvalidArgument`.
pub fn check_size(size: &Value, limit: u64) -> Result<u64, CdiError> {
    let Value::Int(size) = *size else {
        return Err(CdiError::invalid_argument(format!(
            "size must be an integer number of bytes, got {}",
            size.kind()
        )));
    };
    let size = size.get();
    if size < 0 {
        return Err(CdiError::invalid_argument(format!(
            "size must not be negative, got {size}"
        )));
    }
    if size > limit as i128 {
        return Err(CdiError::invalid_argument(format!(
            "size {size} bytes exceeds this minion's object limit of {limit} bytes"
        )));
    }
    Ok(size as u64)
}

/// The segment ids a `create` names as mapped by the caller (`have`); empty if absent.
pub fn check_segment_ids(value: Option<&Value>) -> Result<Vec<i128>, CdiError> {
    match value {
        None => Ok(Vec::new()),
        Some(Value::Array(items))
            if items.len() <= MAX_OFFERED_SEGMENTS
                && items.iter().all(|i| matches!(i, Value::Int(_))) =>
        {
            Ok(items
                .iter()
                .filter_map(|i| match i {
                    Value::Int(i) => Some(i.get()),
                    _ => None,
                })
                .collect())
        }
        Some(_) => Err(CdiError::invalid_argument(format!(
            "have must be a list of at most {MAX_OFFERED_SEGMENTS} segment ids (integers)"
        ))),
    }
}

/// A size rounded up to its segment class: whole pages, then 4 steps per power of two (<= 25%
/// waste). Clients compute it too (`cdi.protocol.size_class`), to offer the segments they
/// still map of the class a `create` needs; u128 so that any u64 size has a class (one beyond
/// the memory limit is refused later, with its size named).
pub fn size_class(size: u64, page: u64) -> u128 {
    let (size, page) = (size as u128, page as u128);
    let pages = size.div_ceil(page).max(1);
    if pages <= 4 {
        return pages * page;
    }
    let top = 1u128 << (128 - (pages - 1).leading_zeros()); // next power of two >= pages
    let step = top / 8; // classes between top/2 and top: 5/8, 6/8, 7/8, 8/8 of top
    pages.div_ceil(step) * step * page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cdi.protocol.size_class`, transcribed with its floor-division idioms: a client names
    /// segments by the class it computes, so both must agree.
    fn python_size_class(size: u64, page: u64) -> u128 {
        let (size, page) = (size as i128, page as i128);
        let pages = std::cmp::max(1, -((-size).div_euclid(page)));
        if pages <= 4 {
            return (pages * page) as u128;
        }
        let bit_length = 128 - (pages - 1).leading_zeros();
        let top = 1i128 << bit_length;
        let step = top / 8;
        ((-((-pages).div_euclid(step))) * step * page) as u128
    }

    #[test]
    fn size_class_matches_the_python_formula() {
        let mut sizes: Vec<u64> = (0..70_000).step_by(97).collect();
        for shift in 0..63 {
            let p = 1u64 << shift;
            sizes.extend([p - 1, p, p + 1, p + p / 3]);
        }
        sizes.extend([10_000, 1_000_000, 10_000_000, 3 << 20, 40 * 4096, 34 * 4096]);
        for size in sizes {
            for page in [4096, 16384, 65536] {
                assert_eq!(
                    size_class(size, page),
                    python_size_class(size, page),
                    "{size}/{page}"
                );
            }
        }
        assert_eq!(size_class(0, 4096), 4096);
        assert_eq!(size_class(10_000, 4096), 12_288);
        assert_eq!(size_class(5 * 4096, 4096), 5 * 4096);
        assert_eq!(size_class(9 * 4096, 4096), 10 * 4096);
        assert!(size_class(u64::MAX, 4096) > u64::MAX as u128);
    }

    #[test]
    fn names_are_checked() {
        let err = |v: Value, what: &str| check_name(&v, what).unwrap_err().msg;
        assert_eq!(err(Value::Str(""), "key"), "key must not be empty");
        assert_eq!(
            err(Value::Str(&"x".repeat(257)), "key"),
            "key is 257 characters long; the limit is 256"
        );
        assert_eq!(
            err(Value::Str("has space"), "key"),
            "key \"has space\" has characters outside letters, digits and _ . : / @ + = -"
        );
        assert_eq!(
            err(Value::Int(42.into()), "key"),
            "key must be a string, got integer"
        );
        assert_eq!(
            err(Value::Bool(true), "container id"),
            "container id must be a string, got boolean"
        );
        assert_eq!(check_container_id(&Value::Int((-7).into())).unwrap(), "-7");
        assert_eq!(
            check_key(&Value::Str("a-Z_0.9:/@+=")).unwrap(),
            "a-Z_0.9:/@+="
        );
        assert!(check_key(&Value::Str("trailing\n")).is_err());
        assert!(check_key(&Value::Str("two\n\n")).is_err());
        assert!(check_key(&Value::Str("\n")).is_err());
        // 256 two-byte characters are within the length limit, which counts characters.
        assert!(check_key(&Value::Str(&"é".repeat(256)))
            .unwrap_err()
            .msg
            .contains("outside"));
    }

    #[test]
    fn sizes_and_segment_ids_are_checked() {
        assert_eq!(check_size(&Value::Int(5.into()), 10), Ok(5));
        assert_eq!(
            check_size(&Value::Bool(true), 10).unwrap_err().msg,
            "size must be an integer number of bytes, got boolean"
        );
        assert_eq!(
            check_size(&Value::Int((-1).into()), 10).unwrap_err().msg,
            "size must not be negative, got -1"
        );
        assert_eq!(
            check_size(&Value::Int(11.into()), 10).unwrap_err().msg,
            "size 11 bytes exceeds this minion's object limit of 10 bytes"
        );
        assert_eq!(check_segment_ids(None), Ok(vec![]));
        assert_eq!(
            check_segment_ids(Some(&Value::Array(vec![Value::Int(3.into())]))),
            Ok(vec![3])
        );
        for bad in [
            Value::Str("1"),
            Value::Array(vec![Value::Float(1.5)]),
            Value::Array(vec![Value::Bool(true)]),
            Value::Array(vec![Value::Int(1.into()); 65]),
        ] {
            assert!(check_segment_ids(Some(&bad))
                .unwrap_err()
                .msg
                .starts_with("have must be a list"));
        }
    }
}

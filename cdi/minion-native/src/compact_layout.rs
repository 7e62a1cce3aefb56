//! The bytes of the compact form (`cdi/PROTOCOL.md`, *Compact form*), one definition for both
//! ends: the minion (`compact.rs`) and the client's extension (`cdi/client-native`, which
//! includes this file).

/// The first byte of every compact message: one MessagePack never uses, so a map and a
/// compact message cannot be mistaken for each other.
pub const MAGIC: u8 = 0xC1;
/// The compact form's version, byte 1 of each message (`register` tells which one it takes).
pub const VERSION: u8 = 1;
pub const OP_ACCESS: u8 = 1;
pub const OP_TRANSFER: u8 = 2;
pub const KIND_GRANT: u8 = 1;
pub const KIND_TRANSFERRED: u8 = 2;
/// `access`: `wait` is false.
pub const NO_WAIT: u8 = 1;
/// `access`: `have` holds a segment id.
pub const HAVE: u8 = 2;
/// A request's header: magic, version, op, flags, id (i64), have (i64), three u16 lengths:
/// key, to, via.
pub const HEADER: usize = 26;

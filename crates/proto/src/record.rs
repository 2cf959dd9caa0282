//! Child records: how a container's data lists its children.
//!
//! A container's data (read through the data plane like a file) is an array
//! of fixed-size records, one per slot. The metadata server assigns each
//! enumerable child a slot; the client that creates (or moves in) the child
//! writes the record, and the client that removes (or moves out) the child
//! clears it and then tells the metadata server, which only then lets the
//! slot be reused. See `docs/records.md`.
//!
//! ```text
//! offset size field
//!      0    1 state: 0xA5 = written, anything else = empty
//!      1    1 node type
//!      2    2 name length (u16 LE, 1..=255)
//!      4    4 slot index (u32 LE)
//!      8    8 container node id (u64 LE)
//!     16    8 checksum: FNV-1a 64 over bytes 0..16 and the name
//!     24    n name (UTF-8)
//! 24 + n  ... unused (not written)
//! ```
//! A record only counts if its state byte, slot, container id and checksum
//! all match, so bytes left in a reused block can never pass for a record;
//! and it is only listed if the metadata server's live-slot bitmap (the
//! authority) has its bit set.

use crate::path::MAX_NAME_LEN;
use crate::NodeType;

/// Size of one record; divides every valid block size.
pub const RECORD_SIZE: usize = 512;
/// Bytes before the name.
pub const RECORD_HEADER: usize = 24;
const WRITTEN: u8 = 0xA5;
// The longest name fits in one record.
const _: () = assert!(RECORD_HEADER + MAX_NAME_LEN <= RECORD_SIZE);

fn checksum(head: &[u8], name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in head.iter().chain(name) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Encodes the bytes of a record (header + name; the rest of the slot is
/// never read).
pub fn encode(container: u64, slot: u32, ty: NodeType, name: &str) -> Vec<u8> {
    debug_assert!(!name.is_empty() && name.len() <= MAX_NAME_LEN);
    let mut r = Vec::with_capacity(RECORD_HEADER + name.len());
    r.push(WRITTEN);
    r.push(ty as u8);
    r.extend_from_slice(&(name.len() as u16).to_le_bytes());
    r.extend_from_slice(&slot.to_le_bytes());
    r.extend_from_slice(&container.to_le_bytes());
    let sum = checksum(&r[..16], name.as_bytes());
    r.extend_from_slice(&sum.to_le_bytes());
    r.extend_from_slice(name.as_bytes());
    r
}

/// The bytes that clear a record (written at the record's offset).
pub const CLEARED: [u8; 1] = [0];

/// Decodes the record in `slot_bytes` (exactly one slot of container data),
/// returning its type and name if it is a well-formed record of `container`
/// at `slot`.
pub fn decode(slot_bytes: &[u8], container: u64, slot: u32) -> Option<(NodeType, String)> {
    if slot_bytes.len() < RECORD_HEADER || slot_bytes[0] != WRITTEN {
        return None;
    }
    let ty = NodeType::from_u8(slot_bytes[1]).ok()?;
    let len = u16::from_le_bytes([slot_bytes[2], slot_bytes[3]]) as usize;
    if len == 0 || len > MAX_NAME_LEN || RECORD_HEADER + len > slot_bytes.len() {
        return None;
    }
    if u32::from_le_bytes(slot_bytes[4..8].try_into().ok()?) != slot
        || u64::from_le_bytes(slot_bytes[8..16].try_into().ok()?) != container
    {
        return None;
    }
    let name = &slot_bytes[RECORD_HEADER..RECORD_HEADER + len];
    let sum = u64::from_le_bytes(slot_bytes[16..24].try_into().ok()?);
    if sum != checksum(&slot_bytes[..16], name) {
        return None;
    }
    let name = std::str::from_utf8(name).ok()?;
    // Record bytes come from clients: a name no path may hold (`..`, one
    // with a `/` or a NUL) is no record, and the listing asks the metadata
    // server for that slot's name instead (`docs/records.md`).
    crate::path::check_name(name).ok()?;
    Some((ty, name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_of(bytes: &[u8]) -> Vec<u8> {
        let mut s = vec![0u8; RECORD_SIZE];
        s[..bytes.len()].copy_from_slice(bytes);
        s
    }

    #[test]
    fn round_trip_and_rejections() {
        let name = "x".repeat(255);
        let r = slot_of(&encode(7, 3, NodeType::File, &name));
        assert_eq!(decode(&r, 7, 3), Some((NodeType::File, name.clone())));
        assert_eq!(decode(&r, 8, 3), None, "other container");
        assert_eq!(decode(&r, 7, 4), None, "other slot");
        let mut cleared = r.clone();
        cleared[0] = CLEARED[0];
        assert_eq!(decode(&cleared, 7, 3), None);
        for i in 1..RECORD_HEADER + 255 {
            let mut bad = r.clone();
            bad[i] ^= 0x40;
            assert_eq!(decode(&bad, 7, 3), None, "flipped byte {i}");
        }
        assert_eq!(decode(&[0xA5; RECORD_SIZE], 7, 3), None, "garbage");
        assert_eq!(decode(&r[..10], 7, 3), None);
    }

    /// A record is written by a client: one whose name no path could hold
    /// (checksum and all else right) is not a record, so a listing never
    /// hands out `..` or a name with a `/` (which `nk get -r` would turn
    /// into a local path).
    #[test]
    fn names_no_path_may_hold_are_not_records() {
        for name in ["..", ".", "a/b", "../../etc", "nul\0"] {
            let r = slot_of(&encode(7, 3, NodeType::File, name));
            assert_eq!(decode(&r, 7, 3), None, "{name:?}");
        }
    }
}

//! Child records: how a container's data lists its children.
//!
//! A container's data (read through the data plane like a file) is an array
//! of 32-byte slots. A record takes as many consecutive slots as its name
//! needs ([`slots_for`]: one for a name of up to 8 bytes, two up to 40,
//! nine for the longest), never across two extents. The metadata server
//! assigns each enumerable child its slots; the client that creates (or
//! moves in) the child writes the record, and the client that removes (or
//! moves out) the child clears it and then tells the metadata server,
//! which only then lets the slots be reused. See `docs/records.md`.
//!
//! ```text
//! offset size field
//!      0    1 state: 0xA5 = written, anything else = empty
//!      1    1 node type
//!      2    2 name length (u16 LE, 1..=255)
//!      4    4 first slot index (u32 LE)
//!      8    8 container node id (u64 LE)
//!     16    8 checksum: FNV-1a 64 over bytes 0..16 and the name
//!     24    n name (UTF-8)
//! 24 + n  ... unused up to the end of its last slot (not written)
//! ```
//! A record only counts if its state byte, slot, container id and checksum
//! all match, so bytes left in a reused block can never pass for a record;
//! and it is only listed if the metadata server's live-slot bitmap (the
//! authority) has the bit of its first slot set.

use crate::path::MAX_NAME_LEN;
use crate::store::{max_piece, TAG_LEN};
use crate::NodeType;

/// Size of one record slot; divides every valid block size.
pub const SLOT_SIZE: usize = 32;
/// Bytes before the name.
pub const RECORD_HEADER: usize = 24;
const WRITTEN: u8 = 0xA5;
/// Slots of the record of the longest name.
pub const MAX_RECORD_SLOTS: u32 = slots_for(MAX_NAME_LEN);

/// Slots the record of a name of `name_len` bytes takes.
pub const fn slots_for(name_len: usize) -> u32 {
    (RECORD_HEADER + name_len).div_ceil(SLOT_SIZE) as u32
}

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

/// A container's record pieces, in extent order: (piece size, how many).
/// Each size is a piece size of its own (512 + 128, 1,024 + 256,
/// 4,096 + 1,024), so every container's pieces share the slabs of three
/// sizes: 19 slots, then 39, then 159 per piece; 4,828 slots in all
/// (about 152 KiB), a record of a short name per slot.
const PIECES: [(u32, u8); 3] = [(640, 1), (1280, 1), (5120, 30)];
// The longest record fits in every extent: the smallest piece, and the
// smallest block (4 KiB).
const _: () =
    assert!(PIECES[0].0 as usize >= MAX_RECORD_SLOTS as usize * SLOT_SIZE + TAG_LEN as usize);

/// Where a container's records live: a chain of *extents*, in slot order.
/// With pieces, the first extents are pieces of shared blocks (`PIECES`:
/// 640 bytes for the first 19 slots, 1,280 for the next 39, then 5,120
/// bytes for 159 each); the extents after them are whole blocks. A
/// container with a few children therefore takes a few hundred bytes, not
/// a block, and a lone container pins at most three slabs. Growing
/// appends an extent, so no record ever moves. Without pieces (the root,
/// and a container made before pieces existed) every extent is a block.
/// `docs/records.md` has the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    block_size: u32,
    /// How many of the `PIECES` groups apply (those whose size fits
    /// the largest piece of the block size).
    groups: u8,
}

impl Layout {
    /// The layout of a container in blocks of `block_size` bytes; with
    /// `pieces` false, every extent is a block. Pieces larger than the
    /// largest piece for the block size (and those after them) are left
    /// out.
    pub fn new(block_size: u32, pieces: bool) -> Layout {
        let max = max_piece(block_size);
        let groups = if pieces {
            PIECES.iter().take_while(|(size, _)| *size <= max).count() as u8
        } else {
            0
        };
        Layout { block_size, groups }
    }

    /// The piece groups that apply.
    fn groups(&self) -> &'static [(u32, u8)] {
        &PIECES[..usize::from(self.groups)]
    }

    /// Size of the blocks after the pieces.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Number of extents that are pieces (they come first).
    pub fn piece_extents(&self) -> usize {
        self.groups().iter().map(|(_, n)| usize::from(*n)).sum()
    }

    /// The piece size of extent `k`, or `None` when it is a whole block.
    pub fn piece_size(&self, k: usize) -> Option<u32> {
        let mut first = 0;
        for (size, n) in self.groups() {
            first += usize::from(*n);
            if k < first {
                return Some(*size);
            }
        }
        None
    }

    /// Record slots extent `k` holds.
    pub fn slots_in(&self, k: usize) -> u32 {
        match self.piece_size(k) {
            Some(size) => slots_of(size),
            None => self.block_size / SLOT_SIZE as u32,
        }
    }

    /// The first slot at or after `slot` where a record of `n` slots fits
    /// in one extent: `slot` itself, or the first of the next extent.
    pub fn fit(&self, slot: u32, n: u32) -> u32 {
        let (k, offset) = self.locate(slot);
        let room = self.slots_in(k) - offset / SLOT_SIZE as u32;
        if n <= room {
            slot
        } else {
            slot + room
        }
    }

    /// The extent holding `slot`, and the slot's byte offset in that
    /// extent's data (for a piece: from the end of its tag).
    pub fn locate(&self, slot: u32) -> (usize, u32) {
        let rec = SLOT_SIZE as u32;
        let (mut extent, mut first) = (0usize, 0u32);
        for (size, n) in self.groups() {
            let per = slots_of(*size);
            let group = per * u32::from(*n);
            if slot - first < group {
                let rest = slot - first;
                return (extent + (rest / per) as usize, (rest % per) * rec);
            }
            extent += usize::from(*n);
            first += group;
        }
        let per_block = (self.block_size / rec).max(1);
        let rest = slot - first;
        (
            extent + (rest / per_block) as usize,
            (rest % per_block) * rec,
        )
    }

    /// Extents needed to hold slots `0..slots`.
    pub fn extents_for(&self, slots: u32) -> usize {
        match slots.checked_sub(1) {
            None => 0,
            Some(last) => self.locate(last).0 + 1,
        }
    }
}

/// Slots a piece of `size` bytes holds after its tag.
fn slots_of(piece_size: u32) -> u32 {
    piece_size.saturating_sub(TAG_LEN) / SLOT_SIZE as u32
}

/// The bytes that clear a record (written at the record's offset).
pub const CLEARED: [u8; 1] = [0];

/// Decodes the record at the start of `slot_bytes` (container data from
/// the record's first slot on; bytes past its last slot are not read),
/// returning its type and name if it is a well-formed record of
/// `container` at `slot`.
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

    fn slots_with(bytes: &[u8], n: usize) -> Vec<u8> {
        let mut s = vec![0u8; n * SLOT_SIZE];
        s[..bytes.len()].copy_from_slice(bytes);
        s
    }

    #[test]
    fn round_trip_and_rejections() {
        let name = "x".repeat(255);
        let rec = encode(7, 3, NodeType::File, &name);
        assert_eq!(slots_for(255), MAX_RECORD_SLOTS);
        assert_eq!(MAX_RECORD_SLOTS, 9);
        let r = slots_with(&rec, MAX_RECORD_SLOTS as usize);
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
        assert_eq!(decode(&[0xA5; 512], 7, 3), None, "garbage");
        assert_eq!(decode(&r[..10], 7, 3), None);
        assert_eq!(decode(&r[..rec.len() - 1], 7, 3), None, "cut short");
    }

    /// A record takes the slots its name needs: one for up to 8 bytes,
    /// two up to 40, and its bytes end within them.
    #[test]
    fn records_take_the_slots_their_names_need() {
        for (len, slots) in [(1, 1), (8, 1), (9, 2), (40, 2), (41, 3), (255, 9)] {
            assert_eq!(slots_for(len), slots, "{len}");
            let name = "n".repeat(len);
            let rec = encode(1, 0, NodeType::KeyValue, &name);
            assert!(rec.len() <= slots as usize * SLOT_SIZE);
            assert!(rec.len() > (slots as usize - 1) * SLOT_SIZE);
            let r = slots_with(&rec, slots as usize);
            assert_eq!(decode(&r, 1, 0), Some((NodeType::KeyValue, name)));
        }
    }

    /// A record is written by a client: one whose name no path could hold
    /// (checksum and all else right) is not a record, so a listing never
    /// hands out `..` or a name with a `/` (which `nk get -r` would turn
    /// into a local path).
    #[test]
    fn names_no_path_may_hold_are_not_records() {
        for name in ["..", ".", "a/b", "../../etc", "nul\0"] {
            let r = slots_with(&encode(7, 3, NodeType::File, name), 2);
            assert_eq!(decode(&r, 7, 3), None, "{name:?}");
        }
    }

    /// The extents of a 1 MiB-block container: a 640-byte piece (19
    /// slots), a 1,280-byte one (39), 30 of 5,120 bytes (159 each; 4,828
    /// slots in all), then blocks of 32,768 slots; every slot has one
    /// place, and consecutive slots are consecutive within an extent.
    #[test]
    fn layout_of_a_container() {
        let l = Layout::new(1 << 20, true);
        assert_eq!(l.piece_extents(), 32);
        assert_eq!((l.piece_size(0), l.piece_size(1)), (Some(640), Some(1280)));
        assert!((2..32).all(|k| l.piece_size(k) == Some(5120)));
        assert_eq!(l.piece_size(32), None);
        let slots: Vec<u32> = [0, 1, 2, 31, 32].iter().map(|k| l.slots_in(*k)).collect();
        assert_eq!(slots, [19, 39, 159, 159, 32768]);
        assert_eq!(l.locate(0), (0, 0));
        assert_eq!(l.locate(18), (0, 18 * 32));
        assert_eq!(l.locate(19), (1, 0));
        assert_eq!(l.locate(57), (1, 38 * 32));
        assert_eq!(l.locate(58), (2, 0));
        assert_eq!(l.locate(58 + 159), (3, 0));
        assert_eq!(l.locate(4827), (31, 158 * 32));
        assert_eq!(l.locate(4828), (32, 0));
        assert_eq!(l.locate(4828 + 32768), (33, 0));
        assert_eq!(l.extents_for(0), 0);
        assert_eq!(l.extents_for(1), 1);
        assert_eq!(l.extents_for(19), 1);
        assert_eq!(l.extents_for(20), 2);
        assert_eq!(l.extents_for(59), 3);
        assert_eq!(l.extents_for(4829), 33);
        // A record of n slots starts where all n fit in one extent.
        assert_eq!(l.fit(15, 4), 15);
        assert_eq!(l.fit(16, 4), 19);
        assert_eq!(l.fit(18, 1), 18);
        assert_eq!(l.fit(19, 9), 19);
        assert_eq!(l.fit(4827, 2), 4828);
        // Each slot lies inside its extent.
        let mut prev = (0, 0);
        for slot in 0..40000 {
            let (k, off) = l.locate(slot);
            let room = match l.piece_size(k) {
                Some(size) => size - TAG_LEN,
                None => 1 << 20,
            };
            assert!(off + SLOT_SIZE as u32 <= room, "slot {slot}");
            if slot > 0 && k == prev.0 {
                assert_eq!(off, prev.1 + SLOT_SIZE as u32, "slot {slot}");
            } else if slot > 0 {
                assert_eq!((k, off), (prev.0 + 1, 0), "slot {slot}");
            }
            let start = l.fit(slot, MAX_RECORD_SLOTS);
            let (first, _) = l.locate(start);
            assert_eq!(
                first,
                l.locate(start + MAX_RECORD_SLOTS - 1).0,
                "slot {slot}"
            );
            prev = (k, off);
        }
    }

    /// Without pieces (a container made before them), and for blocks too
    /// small for a record piece, every extent is a block.
    #[test]
    fn layouts_of_blocks_only() {
        let old = Layout::new(1 << 20, false);
        assert_eq!(old.piece_extents(), 0);
        assert_eq!(old.locate(32769), (1, 32));
        let small = Layout::new(2048, true);
        assert_eq!(small.piece_extents(), 0);
        assert_eq!(small.locate(65), (1, 32));
        // 4 KiB blocks: the 640-byte piece only (the largest piece is
        // 1 KiB); 16 KiB blocks: the first two (4 KiB).
        let four = Layout::new(4096, true);
        assert_eq!(four.piece_extents(), 1);
        assert_eq!(four.locate(19), (1, 0));
        assert_eq!(four.locate(19 + 128), (2, 0));
        let sixteen = Layout::new(16 << 10, true);
        assert_eq!(sixteen.piece_extents(), 2);
        assert_eq!(sixteen.locate(58), (2, 0));
        assert_eq!(sixteen.piece_size(2), None);
    }
}

//! Layout of a shared DRAM region and its header (version 2).
//!
//! ```text
//! offset 0            header (HEADER_LEN = 128 bytes, little-endian, below)
//! state_offset (128)  state word, u64: 0 serving, 1 closed (server stopped)
//!   + 8               wake sequence, u32 (a futex word), then 4 bytes of padding
//!   + 16              operations waiting for a lane to change, u64 (all processes)
//! lanes_offset (192)  slots * lanes_per_slot lane words, u64, slot after slot
//!                       (slot s, lane i at lanes_offset + 8 * (s * lanes_per_slot + i));
//!                       0 free, or a write in progress (see `protocol`)
//! waits_offset        = lanes_offset + 8 * slots * lanes_per_slot: one u64 per
//!                       slot, the part of the waiting count that slot added
//! ctrl_offset         one generation word per block, u64, ctrl_stride (8) bytes
//!                       apart (bit 63: a claim is settling)
//! data_offset         num_blocks blocks of block_size bytes (page aligned)
//! total_len           = data_offset + num_blocks * block_size
//! ```
//!
//! The header is written once at creation and never changes. It is also
//! sent, as is, with the memfd when the region is handed over (followed by
//! the slot granted to that client, see [`handover`](crate::handover)), and
//! the receiver checks the two copies against each other.
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `"NKSHMEM1"` |
//! | 8 | 4 | version (2) |
//! | 12 | 4 | block size (a power of two) |
//! | 16 | 4 | number of blocks (at least 1) |
//! | 20 | 4 | reserved, 0 |
//! | 24 | 8 | `state_offset` |
//! | 32 | 8 | `ctrl_offset` |
//! | 40 | 8 | `ctrl_stride` |
//! | 48 | 8 | `data_offset` |
//! | 56 | 8 | `total_len` |
//! | 64 | 8 | `lanes_offset` |
//! | 72 | 4 | `slots`: writer slots (2 to [`MAX_SLOTS`]) |
//! | 76 | 4 | `lanes_per_slot` (1 to [`MAX_LANES_PER_SLOT`]) |
//! | 80 | 4 | `server_slots`: the first slots, the server's own (1 to `slots - 1`) |
//! | 84 | 44 | reserved, 0 |
//!
//! [`Layout::decode`] trusts none of it: every offset is checked for
//! alignment, overlap and overflow, and the slot and lane counts against
//! their bounds, before anything is mapped.

use std::fmt;

/// Bytes of the encoded header.
pub const HEADER_LEN: usize = 128;
/// `"NKSHMEM1"`.
pub const MAGIC: [u8; 8] = *b"NKSHMEM1";
/// Layout version this build writes and accepts. Version 1 had a writer
/// counter per block instead of slots and lanes.
pub const VERSION: u32 = 2;

/// Writer slots this build creates: [`SERVER_SLOTS`] for the server's own
/// network path, the rest one per co-located client process.
pub const SLOTS: u32 = 32;
/// Lanes (writes in progress at once) per slot this build creates.
pub const LANES_PER_SLOT: u32 = 16;
/// Slots the server keeps for its own writes (so it has
/// `SERVER_SLOTS * LANES_PER_SLOT` = 32 lanes); the other `SLOTS -
/// SERVER_SLOTS` = 30 go to client processes.
pub const SERVER_SLOTS: u32 = 2;
/// Most slots a header may declare: bounds the scan a claim makes.
pub const MAX_SLOTS: u32 = 1024;
/// Most lanes per slot a header may declare.
pub const MAX_LANES_PER_SLOT: u32 = 256;

/// Where the server writes its state word.
const STATE_OFFSET: u64 = HEADER_LEN as u64;
/// Where the lanes start: one cache line after the state word.
const LANES_OFFSET: u64 = STATE_OFFSET + 64;
/// One generation word per block. Writers only read it, and it changes once
/// per claim, so packing eight to a cache line costs nothing.
const CTRL_STRIDE: u64 = 8;
/// Alignment of the data region.
const DATA_ALIGN: u64 = 4096;
/// Bytes of one lane or generation word.
const WORD: u64 = 8;
/// Words from `state_offset` on: the state word, the wake sequence and
/// the waiting count.
const STATE_WORDS: u64 = 3;

/// A header that cannot describe a usable region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError(pub String);

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad shared-memory layout: {}", self.0)
    }
}

impl std::error::Error for LayoutError {}

fn bad(msg: impl Into<String>) -> LayoutError {
    LayoutError(msg.into())
}

/// Where everything lives in a shared region (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u32,
    pub num_blocks: u32,
    pub state_offset: u64,
    pub ctrl_offset: u64,
    pub ctrl_stride: u64,
    pub data_offset: u64,
    pub total_len: u64,
    pub lanes_offset: u64,
    pub slots: u32,
    pub lanes_per_slot: u32,
    pub server_slots: u32,
}

impl Layout {
    /// The layout this build creates for `num_blocks` blocks of
    /// `block_size` bytes, with [`SLOTS`] slots of [`LANES_PER_SLOT`] lanes.
    pub fn new(block_size: u32, num_blocks: u32) -> Result<Layout, LayoutError> {
        let waits_end = LANES_OFFSET + u64::from(SLOTS * LANES_PER_SLOT + SLOTS) * WORD;
        let ctrl_offset = waits_end.next_multiple_of(64);
        let ctrl_end = u64::from(num_blocks)
            .checked_mul(CTRL_STRIDE)
            .and_then(|n| n.checked_add(ctrl_offset))
            .ok_or_else(|| bad("control region overflows"))?;
        let data_offset = ctrl_end
            .checked_next_multiple_of(DATA_ALIGN)
            .ok_or_else(|| bad("control region overflows"))?;
        let total_len = u64::from(num_blocks)
            .checked_mul(u64::from(block_size))
            .and_then(|n| n.checked_add(data_offset))
            .ok_or_else(|| bad("region size overflows"))?;
        let l = Layout {
            block_size,
            num_blocks,
            state_offset: STATE_OFFSET,
            ctrl_offset,
            ctrl_stride: CTRL_STRIDE,
            data_offset,
            total_len,
            lanes_offset: LANES_OFFSET,
            slots: SLOTS,
            lanes_per_slot: LANES_PER_SLOT,
            server_slots: SERVER_SLOTS,
        };
        l.validate()?;
        Ok(l)
    }

    /// Bytes of block data (`num_blocks * block_size`).
    pub fn data_len(&self) -> u64 {
        u64::from(self.num_blocks) * u64::from(self.block_size)
    }

    /// Lane words in all (`slots * lanes_per_slot`).
    #[inline]
    pub fn lane_count(&self) -> usize {
        self.slots as usize * self.lanes_per_slot as usize
    }

    /// Where the wake sequence lies (a 32-bit futex word, 8-aligned).
    pub fn wake_seq_offset(&self) -> u64 {
        self.state_offset + WORD
    }

    /// Where the count of waiting operations lies.
    pub fn waiting_offset(&self) -> u64 {
        self.state_offset + 2 * WORD
    }

    /// Where the per-slot waiting counts start (right after the lanes).
    pub fn waits_offset(&self) -> u64 {
        self.lanes_offset + self.lane_count() as u64 * WORD
    }

    /// Whether `slot` may be granted to a client (a slot that exists and
    /// is not one of the server's).
    pub fn is_client_slot(&self, slot: u32) -> bool {
        slot >= self.server_slots && slot < self.slots
    }

    /// The header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.block_size.to_le_bytes());
        h[16..20].copy_from_slice(&self.num_blocks.to_le_bytes());
        h[24..32].copy_from_slice(&self.state_offset.to_le_bytes());
        h[32..40].copy_from_slice(&self.ctrl_offset.to_le_bytes());
        h[40..48].copy_from_slice(&self.ctrl_stride.to_le_bytes());
        h[48..56].copy_from_slice(&self.data_offset.to_le_bytes());
        h[56..64].copy_from_slice(&self.total_len.to_le_bytes());
        h[64..72].copy_from_slice(&self.lanes_offset.to_le_bytes());
        h[72..76].copy_from_slice(&self.slots.to_le_bytes());
        h[76..80].copy_from_slice(&self.lanes_per_slot.to_le_bytes());
        h[80..84].copy_from_slice(&self.server_slots.to_le_bytes());
        h
    }

    /// Checks the magic and version of (the start of) a header, so that a
    /// peer speaking another version is told so before anything else.
    pub fn check_version(h: &[u8]) -> Result<(), LayoutError> {
        if h.len() < 12 {
            return Err(bad(format!("header is {} bytes, too short", h.len())));
        }
        if h[0..8] != MAGIC {
            return Err(bad("wrong magic"));
        }
        let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this build speaks {VERSION}"
            )));
        }
        Ok(())
    }

    /// Parses and validates header bytes received from a peer.
    pub fn decode(h: &[u8]) -> Result<Layout, LayoutError> {
        if h.len() != HEADER_LEN {
            return Err(bad(format!(
                "header is {} bytes, expected {HEADER_LEN}",
                h.len()
            )));
        }
        Layout::check_version(h)?;
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        if u32_at(20) != 0 || h[84..].iter().any(|&b| b != 0) {
            return Err(bad("reserved header field is not zero"));
        }
        let l = Layout {
            block_size: u32_at(12),
            num_blocks: u32_at(16),
            state_offset: u64_at(24),
            ctrl_offset: u64_at(32),
            ctrl_stride: u64_at(40),
            data_offset: u64_at(48),
            total_len: u64_at(56),
            lanes_offset: u64_at(64),
            slots: u32_at(72),
            lanes_per_slot: u32_at(76),
            server_slots: u32_at(80),
        };
        l.validate()?;
        Ok(l)
    }

    /// Checks that the parts are aligned, in order (header, state words,
    /// lanes, per-slot waiting counts, generation words, data), do not
    /// overlap, that the slot and
    /// lane counts are within their bounds, and that nothing overflows or
    /// exceeds the address space.
    pub fn validate(&self) -> Result<(), LayoutError> {
        let bs = self.block_size;
        if !bs.is_power_of_two() || bs > nodekernel_proto::MAX_BLOCK_SIZE {
            return Err(bad(format!(
                "block size {bs} is not a power of two up to {}",
                nodekernel_proto::MAX_BLOCK_SIZE
            )));
        }
        if self.num_blocks == 0 {
            return Err(bad("no blocks"));
        }
        if !(2..=MAX_SLOTS).contains(&self.slots) {
            return Err(bad(format!(
                "{} writer slots, expected 2 to {MAX_SLOTS}",
                self.slots
            )));
        }
        if !(1..=MAX_LANES_PER_SLOT).contains(&self.lanes_per_slot) {
            return Err(bad(format!(
                "{} lanes per slot, expected 1 to {MAX_LANES_PER_SLOT}",
                self.lanes_per_slot
            )));
        }
        if self.server_slots == 0 || self.server_slots >= self.slots {
            return Err(bad(format!(
                "{} server slots of {}: the server needs one, clients at least one",
                self.server_slots, self.slots
            )));
        }
        if self.state_offset < HEADER_LEN as u64 || self.state_offset & (WORD - 1) != 0 {
            return Err(bad(format!(
                "state word at {} overlaps the header or is unaligned",
                self.state_offset
            )));
        }
        if self.lanes_offset < self.state_offset.saturating_add(STATE_WORDS * WORD)
            || self.lanes_offset & (WORD - 1) != 0
        {
            return Err(bad(format!(
                "lanes at {} overlap the state words or are unaligned",
                self.lanes_offset
            )));
        }
        // The lanes and the per-slot counts: at most (MAX_SLOTS *
        // MAX_LANES_PER_SLOT + MAX_SLOTS) * 8 bytes.
        let waits_end = self
            .lanes_offset
            .checked_add((self.lane_count() as u64 + u64::from(self.slots)) * WORD)
            .ok_or_else(|| bad("lanes overflow"))?;
        if self.ctrl_offset < waits_end || self.ctrl_offset & (WORD - 1) != 0 {
            return Err(bad(format!(
                "generation words at {} overlap the lanes and waiting counts ending at {waits_end} or are unaligned",
                self.ctrl_offset
            )));
        }
        if self.ctrl_stride < WORD || self.ctrl_stride & (WORD - 1) != 0 {
            return Err(bad(format!(
                "control entries of {} bytes are too small or unaligned",
                self.ctrl_stride
            )));
        }
        let ctrl_end = u64::from(self.num_blocks)
            .checked_mul(self.ctrl_stride)
            .and_then(|n| n.checked_add(self.ctrl_offset))
            .ok_or_else(|| bad("control region overflows"))?;
        if self.data_offset < ctrl_end {
            return Err(bad(format!(
                "data at {} overlaps the control region ending at {ctrl_end}",
                self.data_offset
            )));
        }
        let end = self
            .data_offset
            .checked_add(self.data_len())
            .ok_or_else(|| bad("region size overflows"))?;
        if end != self.total_len {
            return Err(bad(format!(
                "total length {} does not match data ending at {end}",
                self.total_len
            )));
        }
        if usize::try_from(self.total_len).is_err() || self.total_len > isize::MAX as u64 {
            return Err(bad(format!(
                "{} bytes do not fit in the address space",
                self.total_len
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_shape() {
        let l = Layout::new(1 << 20, 512).unwrap();
        assert_eq!(l.data_offset % DATA_ALIGN, 0);
        assert_eq!(l.lanes_offset, 192);
        assert_eq!(l.lane_count(), (SLOTS * LANES_PER_SLOT) as usize);
        assert_eq!(l.wake_seq_offset(), 136);
        assert_eq!(l.waiting_offset(), 144);
        assert_eq!(l.waits_offset(), l.lanes_offset + 8 * l.lane_count() as u64);
        assert!(l.ctrl_offset >= l.waits_offset() + 8 * u64::from(l.slots));
        assert!(l.data_offset >= l.ctrl_offset + 512 * CTRL_STRIDE);
        assert_eq!(l.total_len, l.data_offset + (512 << 20));
        assert_eq!(Layout::decode(&l.encode()).unwrap(), l);
        let one = Layout::new(4096, 1).unwrap();
        assert_eq!(
            one.data_offset, 8192,
            "header, lanes and one word: two pages"
        );
        assert_eq!(Layout::decode(&one.encode()).unwrap(), one);
        assert!(!one.is_client_slot(0) && !one.is_client_slot(SERVER_SLOTS - 1));
        assert!(one.is_client_slot(SERVER_SLOTS) && one.is_client_slot(SLOTS - 1));
        assert!(!one.is_client_slot(SLOTS) && !one.is_client_slot(u32::MAX));
    }

    #[test]
    fn every_bad_field_is_refused() {
        let good = Layout::new(64 << 10, 8).unwrap();
        let enc = good.encode();
        assert!(Layout::decode(&enc[..HEADER_LEN - 1]).is_err());
        assert!(Layout::decode(&[enc.as_slice(), &[0]].concat()).is_err());
        let patch = |at: usize, bytes: &[u8]| {
            let mut h = enc;
            h[at..at + bytes.len()].copy_from_slice(bytes);
            Layout::decode(&h)
        };
        let waits_end = good.waits_offset() + 8 * u64::from(good.slots);
        let cases: Vec<(&str, Result<Layout, LayoutError>)> = vec![
            ("magic", patch(0, b"NKSHMEM2")),
            ("version 1", patch(8, &1u32.to_le_bytes())),
            ("version 3", patch(8, &3u32.to_le_bytes())),
            ("block size", patch(12, &3000u32.to_le_bytes())),
            ("huge block size", patch(12, &(32u32 << 20).to_le_bytes())),
            ("no blocks", patch(16, &0u32.to_le_bytes())),
            ("more blocks than data", patch(16, &9u32.to_le_bytes())),
            ("reserved", patch(20, &1u32.to_le_bytes())),
            ("state in header", patch(24, &64u64.to_le_bytes())),
            ("state unaligned", patch(24, &129u64.to_le_bytes())),
            ("state at the end", patch(24, &(u64::MAX - 7).to_le_bytes())),
            ("ctrl over waits", patch(32, &(waits_end - 8).to_le_bytes())),
            ("ctrl unaligned", patch(32, &(waits_end + 1).to_le_bytes())),
            ("stride small", patch(40, &4u64.to_le_bytes())),
            ("stride unaligned", patch(40, &20u64.to_le_bytes())),
            ("stride huge", patch(40, &u64::MAX.to_le_bytes())),
            ("data over ctrl", patch(48, &128u64.to_le_bytes())),
            ("data overflow", patch(48, &(u64::MAX - 10).to_le_bytes())),
            (
                "total short",
                patch(56, &(good.total_len - 1).to_le_bytes()),
            ),
            ("total long", patch(56, &(good.total_len + 1).to_le_bytes())),
            ("lanes over state", patch(64, &128u64.to_le_bytes())),
            ("lanes over waiting", patch(64, &144u64.to_le_bytes())),
            ("lanes unaligned", patch(64, &193u64.to_le_bytes())),
            ("lanes at the end", patch(64, &(u64::MAX - 7).to_le_bytes())),
            ("one slot", patch(72, &1u32.to_le_bytes())),
            ("too many slots", patch(72, &(MAX_SLOTS + 1).to_le_bytes())),
            (
                "more slots than room",
                patch(72, &(SLOTS + 1).to_le_bytes()),
            ),
            ("no lanes", patch(76, &0u32.to_le_bytes())),
            (
                "too many lanes",
                patch(76, &(MAX_LANES_PER_SLOT + 1).to_le_bytes()),
            ),
            ("no server slot", patch(80, &0u32.to_le_bytes())),
            ("no client slot", patch(80, &SLOTS.to_le_bytes())),
            ("reserved tail", patch(127, &[1])),
        ];
        for (what, r) in cases {
            assert!(r.is_err(), "{what} accepted");
        }
        assert!(Layout::new(3 << 10, 4).is_err());
        assert!(Layout::new(16 << 20, u32::MAX).is_ok() || usize::BITS < 64);
        let e = Layout::check_version(&patch_version(&enc, 1)).unwrap_err();
        assert!(e.to_string().contains("version 1"), "{e}");
    }

    fn patch_version(h: &[u8], v: u32) -> Vec<u8> {
        let mut h = h.to_vec();
        h[8..12].copy_from_slice(&v.to_le_bytes());
        h
    }

    proptest! {
        /// Any header bytes either decode into a layout whose parts are in
        /// order and in bounds, or are refused; nothing panics.
        #[test]
        fn decode_any_bytes(bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN)) {
            let mut h = bytes;
            h[0..8].copy_from_slice(&MAGIC);
            h[8..12].copy_from_slice(&VERSION.to_le_bytes());
            if let Ok(l) = Layout::decode(&h) {
                prop_assert!(l.state_offset + 24 <= l.lanes_offset);
                prop_assert!(l.waits_offset() + 8 * u64::from(l.slots) <= l.ctrl_offset);
                prop_assert!(l.ctrl_offset + u64::from(l.num_blocks) * l.ctrl_stride <= l.data_offset);
                prop_assert!(l.server_slots >= 1 && l.server_slots < l.slots);
                prop_assert_eq!(l.data_offset + l.data_len(), l.total_len);
                prop_assert_eq!(Layout::decode(&l.encode()).unwrap(), l);
            }
        }

        /// Random headers near a valid one (a few fields changed).
        #[test]
        fn decode_mutated_headers(at in 0usize..HEADER_LEN, v in any::<u64>(), width in 0usize..4) {
            let mut h = Layout::new(4096, 3).unwrap().encode();
            let w = [1usize, 2, 4, 8][width].min(HEADER_LEN - at);
            h[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
            if let Ok(l) = Layout::decode(&h) {
                prop_assert!(l.state_offset + 24 <= l.lanes_offset);
                prop_assert!(l.waits_offset() + 8 * u64::from(l.slots) <= l.ctrl_offset);
                prop_assert_eq!(l.data_offset + l.data_len(), l.total_len);
            }
        }
    }
}

//! Layout of a shared DRAM region and its header.
//!
//! ```text
//! offset 0            header (HEADER_LEN = 64 bytes, little-endian, below)
//! state_offset (64)   state word, u64: 0 serving, 1 closed (server stopped)
//! ctrl_offset (128)   one control entry per block, ctrl_stride (64) bytes apart:
//!                       +0  generation word, u64 (bit 63: claim settling)
//!                       +8  in-flight writers, u32
//! data_offset         num_blocks blocks of block_size bytes (page aligned)
//! total_len           = data_offset + num_blocks * block_size
//! ```
//!
//! The header is written once at creation and never changes. It is also
//! sent, as is, with the memfd when the region is handed over, and the
//! receiver checks the two copies against each other.
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `"NKSHMEM1"` |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | block size (a power of two) |
//! | 16 | 4 | number of blocks (at least 1) |
//! | 20 | 4 | reserved, 0 |
//! | 24 | 8 | `state_offset` |
//! | 32 | 8 | `ctrl_offset` |
//! | 40 | 8 | `ctrl_stride` |
//! | 48 | 8 | `data_offset` |
//! | 56 | 8 | `total_len` |
//!
//! [`Layout::decode`] trusts none of it: every offset is checked for
//! alignment, overlap and overflow before anything is mapped.

use std::fmt;

/// Bytes of the encoded header.
pub const HEADER_LEN: usize = 64;
/// `"NKSHMEM1"`.
pub const MAGIC: [u8; 8] = *b"NKSHMEM1";
/// Layout version this build writes and accepts.
pub const VERSION: u32 = 1;

/// Where the server writes its state word.
const STATE_OFFSET: u64 = 64;
/// Where the control entries start.
const CTRL_OFFSET: u64 = 128;
/// One cache line per block, so writers of neighbouring blocks do not
/// contend on their in-flight counters.
const CTRL_STRIDE: u64 = 64;
/// Alignment of the data region.
const DATA_ALIGN: u64 = 4096;
/// Smallest control entry: the generation word and the writer counter.
pub(crate) const MIN_CTRL_STRIDE: u64 = 16;
/// Offset of the writer counter inside a control entry.
pub(crate) const INFLIGHT_AT: u64 = 8;

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
}

impl Layout {
    /// The layout this build creates for `num_blocks` blocks of
    /// `block_size` bytes.
    pub fn new(block_size: u32, num_blocks: u32) -> Result<Layout, LayoutError> {
        let ctrl_end = u64::from(num_blocks)
            .checked_mul(CTRL_STRIDE)
            .and_then(|n| n.checked_add(CTRL_OFFSET))
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
            ctrl_offset: CTRL_OFFSET,
            ctrl_stride: CTRL_STRIDE,
            data_offset,
            total_len,
        };
        l.validate()?;
        Ok(l)
    }

    /// Bytes of block data (`num_blocks * block_size`).
    pub fn data_len(&self) -> u64 {
        u64::from(self.num_blocks) * u64::from(self.block_size)
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
        h
    }

    /// Parses and validates header bytes received from a peer.
    pub fn decode(h: &[u8]) -> Result<Layout, LayoutError> {
        if h.len() != HEADER_LEN {
            return Err(bad(format!(
                "header is {} bytes, expected {HEADER_LEN}",
                h.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        if h[0..8] != MAGIC {
            return Err(bad("wrong magic"));
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this client speaks {VERSION}"
            )));
        }
        if u32_at(20) != 0 {
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
        };
        l.validate()?;
        Ok(l)
    }

    /// Checks that the parts are aligned, in order, do not overlap, and that
    /// nothing overflows or exceeds the address space.
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
        if self.state_offset < HEADER_LEN as u64 || self.state_offset & 7 != 0 {
            return Err(bad(format!(
                "state word at {} overlaps the header or is unaligned",
                self.state_offset
            )));
        }
        if self.ctrl_offset < self.state_offset.saturating_add(8) || self.ctrl_offset & 7 != 0 {
            return Err(bad(format!(
                "control region at {} overlaps the state word or is unaligned",
                self.ctrl_offset
            )));
        }
        if self.ctrl_stride < MIN_CTRL_STRIDE || self.ctrl_stride & 7 != 0 {
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
        assert!(l.data_offset >= CTRL_OFFSET + 512 * CTRL_STRIDE);
        assert_eq!(l.total_len, l.data_offset + (512 << 20));
        assert_eq!(Layout::decode(&l.encode()).unwrap(), l);
        let one = Layout::new(4096, 1).unwrap();
        assert_eq!(one.data_offset, 4096);
        assert_eq!(Layout::decode(&one.encode()).unwrap(), one);
    }

    #[test]
    fn every_bad_field_is_refused() {
        let good = Layout::new(64 << 10, 8).unwrap();
        let enc = good.encode();
        assert!(Layout::decode(&enc[..63]).is_err());
        assert!(Layout::decode(&[enc.as_slice(), &[0]].concat()).is_err());
        let patch = |at: usize, bytes: &[u8]| {
            let mut h = enc;
            h[at..at + bytes.len()].copy_from_slice(bytes);
            Layout::decode(&h)
        };
        let cases: Vec<(&str, Result<Layout, LayoutError>)> = vec![
            ("magic", patch(0, b"NKSHMEM2")),
            ("version", patch(8, &2u32.to_le_bytes())),
            ("block size", patch(12, &3000u32.to_le_bytes())),
            ("huge block size", patch(12, &(32u32 << 20).to_le_bytes())),
            ("no blocks", patch(16, &0u32.to_le_bytes())),
            ("more blocks than data", patch(16, &9u32.to_le_bytes())),
            ("reserved", patch(20, &1u32.to_le_bytes())),
            ("state in header", patch(24, &8u64.to_le_bytes())),
            ("state unaligned", patch(24, &65u64.to_le_bytes())),
            ("state at the end", patch(24, &(u64::MAX - 7).to_le_bytes())),
            ("ctrl over state", patch(32, &64u64.to_le_bytes())),
            ("ctrl unaligned", patch(32, &129u64.to_le_bytes())),
            ("stride small", patch(40, &8u64.to_le_bytes())),
            ("stride unaligned", patch(40, &20u64.to_le_bytes())),
            ("stride huge", patch(40, &u64::MAX.to_le_bytes())),
            ("data over ctrl", patch(48, &128u64.to_le_bytes())),
            ("data overflow", patch(48, &(u64::MAX - 10).to_le_bytes())),
            (
                "total short",
                patch(56, &(good.total_len - 1).to_le_bytes()),
            ),
            ("total long", patch(56, &(good.total_len + 1).to_le_bytes())),
        ];
        for (what, r) in cases {
            assert!(r.is_err(), "{what} accepted");
        }
        assert!(Layout::new(3 << 10, 4).is_err());
        assert!(Layout::new(16 << 20, u32::MAX).is_ok() || usize::BITS < 64);
    }

    proptest! {
        /// Any 64 bytes either decode into a layout whose parts are in
        /// order and in bounds, or are refused; nothing panics.
        #[test]
        fn decode_any_bytes(bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN)) {
            let mut h = bytes;
            h[0..8].copy_from_slice(&MAGIC);
            h[8..12].copy_from_slice(&VERSION.to_le_bytes());
            if let Ok(l) = Layout::decode(&h) {
                prop_assert!(l.ctrl_offset + u64::from(l.num_blocks) * l.ctrl_stride <= l.data_offset);
                prop_assert_eq!(l.data_offset + l.data_len(), l.total_len);
                prop_assert_eq!(Layout::decode(&l.encode()).unwrap(), l);
            }
        }
    }
}

//! Data-plane capabilities: the metadata server's permission, checked by a
//! storage server, to read and write a byte range of one block at one
//! generation.
//!
//! Each storage server draws a random [`CapKey`] when it starts and gives
//! it to the metadata servers when it registers
//! ([`ServerSpec::cap_key`](crate::ServerSpec::cap_key)). A metadata server
//! hands out every block location with a [`Cap`]: a MAC under that key over
//! the block, its generation and a byte range. The storage server accepts a
//! read, write, claim or copy only when the request's capability verifies
//! and covers the bytes touched. A client can therefore reach only blocks
//! (and, in a shared block, only the piece) it was given, and only at the
//! generation it was given: it can no longer claim a block with a
//! generation of its choosing, nor write blocks it holds no location for.
//!
//! A capability lives as long as its block's generation: when the block
//! changes hands its generation moves on, and the old capability names a
//! generation the server refuses anyway. A capability that does not verify
//! is refused as `Stale`, the error that makes a client ask the metadata
//! server for the block again: that is what a client holding capabilities
//! from before its storage server restarted (with a new key) needs, and all
//! a forger gets.

use crate::auth::{mac, verify};
use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};

/// Bytes of a storage server's capability key.
pub const CAP_KEY_LEN: usize = 32;
/// A storage server's capability key.
pub type CapKey = [u8; CAP_KEY_LEN];
/// Bytes of a capability's code (HMAC-SHA256, truncated).
pub const CAP_MAC_LEN: usize = 16;
/// Bytes of an encoded [`Cap`].
pub const CAP_LEN: usize = 4 + 4 + CAP_MAC_LEN;

const LABEL: &[u8] = b"nodekernel block capability";

/// Permission to touch bytes `lo..hi` of one block at one generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cap {
    pub lo: u32,
    pub hi: u32,
    pub mac: [u8; CAP_MAC_LEN],
}

fn parts(block: u32, gen: u64, lo: u32, hi: u32) -> [u8; 20] {
    let mut p = [0u8; 20];
    p[..4].copy_from_slice(&block.to_le_bytes());
    p[4..12].copy_from_slice(&gen.to_le_bytes());
    p[12..16].copy_from_slice(&lo.to_le_bytes());
    p[16..].copy_from_slice(&hi.to_le_bytes());
    p
}

impl Cap {
    /// The capability for bytes `lo..hi` of `block` at `gen` under `key`.
    pub fn mint(key: &CapKey, block: u32, gen: u64, lo: u32, hi: u32) -> Cap {
        let full = mac(key, LABEL, &[&parts(block, gen, lo, hi)]);
        let mut m = [0u8; CAP_MAC_LEN];
        m.copy_from_slice(&full[..CAP_MAC_LEN]);
        Cap { lo, hi, mac: m }
    }

    /// Checks that this capability, under `key`, lets a request touch
    /// `len` bytes at `offset` of `block` at `gen` (a zero-length request,
    /// a claim, needs `offset` inside the range or at its end).
    ///
    /// A capability that does not verify is `Stale`; a valid one that does
    /// not cover the bytes is `OutOfRange`.
    pub fn check(&self, key: &CapKey, block: u32, gen: u64, offset: u32, len: u32) -> Result<()> {
        let end = offset as u64 + len as u64;
        if !verify(
            key,
            LABEL,
            &[&parts(block, gen, self.lo, self.hi)],
            &self.mac,
        ) {
            return Err(Error::stale(format!(
                "block {block}: the request carries no valid capability for generation {gen} \
                 (the metadata server did not give it, or the storage server restarted since): \
                 ask the metadata server for the block again"
            )));
        }
        if offset < self.lo || end > self.hi as u64 {
            return Err(Error::out_of_range(format!(
                "block {block}: bytes {offset}..{end} are outside the {}..{} the capability \
                 allows",
                self.lo, self.hi
            )));
        }
        Ok(())
    }

    pub fn encode(&self, e: &mut Enc) {
        e.u32(self.lo).u32(self.hi).fixed(&self.mac);
    }

    pub fn decode(d: &mut Dec) -> Result<Cap> {
        Ok(Cap {
            lo: d.u32()?,
            hi: d.u32()?,
            mac: d.array()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn a_capability_covers_its_block_generation_and_range_only() {
        let key = [7u8; CAP_KEY_LEN];
        let c = Cap::mint(&key, 3, 10, 100, 200);
        assert!(c.check(&key, 3, 10, 100, 100).is_ok());
        assert!(c.check(&key, 3, 10, 150, 0).is_ok());
        for (block, gen, off, len, code) in [
            (4, 10, 100, 10, ErrorCode::Stale),           // another block
            (3, 11, 100, 10, ErrorCode::Stale),           // another generation
            (3, u64::MAX >> 1, 100, 0, ErrorCode::Stale), // a poisoning claim
            (3, 10, 99, 10, ErrorCode::OutOfRange),       // before the range
            (3, 10, 150, 51, ErrorCode::OutOfRange),      // past it
            (3, 10, u32::MAX, u32::MAX, ErrorCode::OutOfRange),
        ] {
            let e = c.check(&key, block, gen, off, len).unwrap_err();
            assert_eq!(e.code, code, "{e}");
        }
        // Another key, a widened range, a flipped bit: refused.
        assert!(c.check(&[8; CAP_KEY_LEN], 3, 10, 100, 10).is_err());
        let wider = Cap { lo: 0, ..c };
        assert!(wider.check(&key, 3, 10, 0, 10).is_err());
        let mut flipped = c;
        flipped.mac[0] ^= 1;
        assert!(flipped.check(&key, 3, 10, 100, 10).is_err());
        assert!(Cap::default().check(&key, 3, 10, 0, 0).is_err());
    }

    #[test]
    fn round_trip() {
        let c = Cap::mint(&[1; CAP_KEY_LEN], 1, 2, 3, 4);
        let mut b = bytes::BytesMut::new();
        c.encode(&mut Enc(&mut b));
        assert_eq!(b.len(), CAP_LEN);
        let mut d = Dec::new(&b, "cap");
        assert_eq!(Cap::decode(&mut d).unwrap(), c);
        d.finish().unwrap();
    }
}

//! How an encrypted node's bytes are laid out in its blocks
//! (`docs/encryption.md`). The cipher itself lives in the client, the only
//! holder of keys; this is the geometry every component agrees on: the
//! metadata server gives an encrypted node the *plaintext* capacity of its
//! blocks ([`block_capacity`], [`plain_capacity`] for a small value's
//! piece) and sizes a piece for its sealed length ([`sealed_len`]), and
//! the client finds a byte's chunk.
//!
//! A block holds fixed-size plaintext chunks of [`CHUNK`] bytes, each
//! stored as `nonce | ciphertext | tag` (a small value's piece may end in a
//! shorter chunk):
//!
//! ```text
//! stored block: | nonce 24 | chunk 0 ciphertext 4096 | tag 16 | nonce 24 | chunk 1 ... | unused |
//! ```
//!
//! so chunk `i` starts at `i * SEALED_CHUNK` in the block. A whole block of
//! `n` stored bytes holds [`block_capacity`]`(n)` plaintext bytes (whole
//! chunks only), a small value's piece of `n` bytes [`plain_capacity`]`(n)`.

/// Plaintext bytes per chunk (the last chunk of a block may hold fewer).
pub const CHUNK: u32 = 4096;
/// Bytes of a chunk's nonce (XChaCha20-Poly1305: 192 bits, random).
pub const NONCE_LEN: u32 = 24;
/// Bytes of a chunk's authentication tag (Poly1305).
pub const AEAD_TAG_LEN: u32 = 16;
/// Bytes a chunk takes beyond its plaintext.
pub const OVERHEAD: u32 = NONCE_LEN + AEAD_TAG_LEN;
/// Stored bytes of a full chunk.
pub const SEALED_CHUNK: u32 = CHUNK + OVERHEAD;

/// Plaintext bytes that `stored` bytes of a block hold: whole chunks, then
/// a shorter last one if more than its overhead is left.
pub const fn plain_capacity(stored: u32) -> u32 {
    let rest = stored % SEALED_CHUNK;
    (stored / SEALED_CHUNK) * CHUNK + rest.saturating_sub(OVERHEAD)
}

/// Plaintext bytes a whole block of `stored` bytes holds for an encrypted
/// node: whole chunks only (the rest of the block, 2,128 bytes of 1 MiB,
/// stays unused), so every node offset that is a multiple of [`CHUNK`] is
/// a chunk boundary in every block, and a 4 KiB-aligned read or write
/// touches one chunk (no read-modify-write). A block too small for one
/// whole chunk holds [`plain_capacity`].
pub const fn block_capacity(stored: u32) -> u32 {
    if stored >= SEALED_CHUNK {
        (stored / SEALED_CHUNK) * CHUNK
    } else {
        plain_capacity(stored)
    }
}

/// Stored bytes that `plain` plaintext bytes take from a block's start (the
/// inverse of [`plain_capacity`]: `plain_capacity(sealed_len(p)) == p`).
pub const fn sealed_len(plain: u64) -> u64 {
    let rest = plain % CHUNK as u64;
    (plain / CHUNK as u64) * SEALED_CHUNK as u64 + if rest > 0 { rest + OVERHEAD as u64 } else { 0 }
}

/// Plaintext bytes of chunk `index` of a block holding `capacity`
/// plaintext bytes (0 past its end).
pub const fn chunk_len(capacity: u32, index: u32) -> u32 {
    let start = index as u64 * CHUNK as u64;
    if start >= capacity as u64 {
        return 0;
    }
    let left = capacity as u64 - start;
    if left < CHUNK as u64 {
        left as u32
    } else {
        CHUNK
    }
}

/// Where chunk `index` starts in the stored block.
pub const fn chunk_offset(index: u32) -> u64 {
    index as u64 * SEALED_CHUNK as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn capacity_and_sealed_length_are_inverse() {
        // Every length up to a few chunks, and the edges of every chunk.
        for p in 0..3 * CHUNK as u64 + 100 {
            assert_eq!(plain_capacity(sealed_len(p) as u32) as u64, p, "{p}");
        }
        for s in 0..3 * SEALED_CHUNK {
            let p = plain_capacity(s);
            assert!(sealed_len(p as u64) <= s as u64, "{s}");
            // The next plaintext byte would not fit.
            assert!(sealed_len(p as u64 + 1) > s as u64, "{s}");
        }
        // 1 MiB of piece: 253 chunks and a last one of 2128 bytes; a 1 MiB
        // block: the 253 chunks.
        assert_eq!(plain_capacity(1 << 20), 253 * CHUNK + 2128);
        assert_eq!(block_capacity(1 << 20), 253 * CHUNK);
        assert_eq!(block_capacity(64 << 10), 15 * CHUNK);
        assert_eq!(block_capacity(4096), plain_capacity(4096));
        assert_eq!(block_capacity(SEALED_CHUNK), CHUNK);
        assert_eq!(plain_capacity(OVERHEAD), 0);
        assert_eq!(plain_capacity(OVERHEAD + 1), 1);
        assert_eq!(sealed_len(0), 0);
        assert_eq!(sealed_len(1), 1 + OVERHEAD as u64);
    }

    proptest! {
        /// The chunks of a block tile its plaintext exactly and their
        /// stored forms fit in the block, for any block size.
        #[test]
        fn chunks_tile_the_block(stored in 0u32..(16 << 20), whole in proptest::bool::ANY) {
            let cap = if whole { block_capacity(stored) } else { plain_capacity(stored) };
            prop_assert!(cap <= plain_capacity(stored));
            if whole && stored >= SEALED_CHUNK {
                prop_assert_eq!(cap % CHUNK, 0);
            }
            let mut plain = 0u64;
            let mut i = 0;
            while chunk_len(cap, i) > 0 {
                let len = chunk_len(cap, i);
                prop_assert!(len == CHUNK || plain + len as u64 == cap as u64);
                prop_assert!(chunk_offset(i) + (len + OVERHEAD) as u64 <= stored as u64);
                plain += len as u64;
                i += 1;
            }
            prop_assert_eq!(plain, cap as u64);
            prop_assert_eq!(sealed_len(cap as u64), chunk_offset(i.saturating_sub(1))
                + if i > 0 { (chunk_len(cap, i - 1) + OVERHEAD) as u64 } else { 0 });
        }
    }
}

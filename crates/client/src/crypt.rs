//! Client-side encryption of node data (`docs/encryption.md`).
//!
//! A node created for an encrypted storage class ([`NodeInfo::encrypted`])
//! keeps its bytes in sealed chunks ([`nodekernel_proto::crypt`] has the
//! layout): each chunk of up to 4 KiB of plaintext is stored as a random
//! 192-bit nonce, its XChaCha20-Poly1305 ciphertext and the 16-byte tag.
//! The associated data binds a chunk to its place (node id, block index,
//! chunk index and length), so a chunk moved elsewhere, another node's
//! chunk or a changed byte fails to open: `Integrity`, never wrong bytes.
//! The key never leaves the client; storage servers see only sealed chunks
//! and the metadata server only sizes.
//!
//! [`NodeInfo::encrypted`]: nodekernel_proto::NodeInfo::encrypted

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};
use nodekernel_proto::crypt::{AEAD_TAG_LEN, NONCE_LEN, OVERHEAD};
use nodekernel_proto::{Error, Result};

/// Fewest bytes of secret a key is derived from.
pub const MIN_SECRET_LEN: usize = 16;
/// Most bytes of secret a key is derived from.
pub const MAX_SECRET_LEN: usize = 4096;

/// Label of the key derivation (HMAC-SHA256 of the secret).
const KEY_LABEL: &[u8] = b"nodekernel encryption key v1";
/// First bytes of every chunk's associated data (the format).
const AD_MAGIC: &[u8; 4] = b"NKC1";

/// The key a client seals node data with: derived from a secret (a key
/// file's contents, `nk key new`) by HMAC-SHA256 under a fixed label.
/// Never sent anywhere and never printed.
pub struct EncryptionKey {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EncryptionKey(..)")
    }
}

impl EncryptionKey {
    /// The key derived from `secret` (16 to 4096 bytes; `what` names its
    /// source in errors).
    pub fn from_secret(secret: &[u8], what: &str) -> Result<EncryptionKey> {
        if !(MIN_SECRET_LEN..=MAX_SECRET_LEN).contains(&secret.len()) {
            return Err(Error::invalid_argument(format!(
                "{what}: an encryption key secret has {MIN_SECRET_LEN} to {MAX_SECRET_LEN} bytes, not {} (`nk key new FILE` makes one)",
                secret.len()
            )));
        }
        let key = nodekernel_proto::auth::mac(secret, KEY_LABEL, &[]);
        Ok(EncryptionKey {
            cipher: XChaCha20Poly1305::new(chacha20poly1305::Key::from_slice(&key)),
        })
    }

    /// Seals `buf`, a chunk's stored bytes: its plaintext at
    /// `NONCE_LEN..len - AEAD_TAG_LEN` is encrypted in place, and `nonce`
    /// and the tag are written around it.
    pub(crate) fn seal(&self, place: &ChunkPlace, nonce: &[u8], buf: &mut [u8]) -> Result<()> {
        let (head, rest) = buf.split_at_mut(NONCE_LEN as usize);
        let n = rest
            .len()
            .checked_sub(AEAD_TAG_LEN as usize)
            .ok_or_else(short)?;
        let (body, tail) = rest.split_at_mut(n);
        head.copy_from_slice(nonce);
        let tag = self
            .cipher
            .encrypt_in_place_detached(XNonce::from_slice(nonce), &place.ad(n), body)
            .map_err(|_| Error::internal("a chunk too large to encrypt"))?;
        tail.copy_from_slice(&tag);
        Ok(())
    }

    /// Opens `buf`, a chunk's stored bytes, in place: `false` when it does
    /// not authenticate for `place` (then its plaintext part holds no
    /// usable bytes). On success the plaintext is at
    /// `NONCE_LEN..len - AEAD_TAG_LEN`.
    pub(crate) fn open(&self, place: &ChunkPlace, buf: &mut [u8]) -> bool {
        if buf.len() < OVERHEAD as usize {
            return false;
        }
        let (head, rest) = buf.split_at_mut(NONCE_LEN as usize);
        let n = rest.len() - AEAD_TAG_LEN as usize;
        let (body, tail) = rest.split_at_mut(n);
        let tag = Tag::clone_from_slice(tail);
        self.cipher
            .decrypt_in_place_detached(XNonce::from_slice(head), &place.ad(n), body, &tag)
            .is_ok()
    }
}

fn short() -> Error {
    Error::internal("a sealed chunk shorter than its overhead")
}

/// Where a chunk belongs: what its associated data binds it to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkPlace {
    pub node: u64,
    pub block: u64,
    pub chunk: u32,
}

impl ChunkPlace {
    /// The associated data of a chunk of `len` plaintext bytes here.
    fn ad(&self, len: usize) -> [u8; 28] {
        let mut ad = [0u8; 28];
        ad[..4].copy_from_slice(AD_MAGIC);
        ad[4..12].copy_from_slice(&self.node.to_le_bytes());
        ad[12..20].copy_from_slice(&self.block.to_le_bytes());
        ad[20..24].copy_from_slice(&self.chunk.to_le_bytes());
        ad[24..28].copy_from_slice(&(len as u32).to_le_bytes());
        ad
    }
}

/// How the block-I/O layer seals one node's blocks: the key, the node, and
/// the plaintext bytes one of its blocks holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seal<'a> {
    pub key: &'a EncryptionKey,
    pub node: u64,
    pub capacity: u32,
}

impl<'a> Seal<'a> {
    /// How to seal node `node` (`encrypted` or not, `capacity` plaintext
    /// bytes per block) with `key`: `None` for a node that is not
    /// encrypted; `Unauthenticated` for an encrypted one without a key.
    pub(crate) fn of(
        key: Option<&'a std::sync::Arc<EncryptionKey>>,
        encrypted: bool,
        node: u64,
        capacity: u32,
    ) -> Result<Option<Seal<'a>>> {
        if !encrypted {
            return Ok(None);
        }
        let key = key.ok_or_else(|| {
            Error::unauthenticated(
                "its data is encrypted (docs/encryption.md) and this client has no encryption key: set [security] encryption_key_file or NK_ENCRYPTION_KEY_FILE",
            )
        })?;
        Ok(Some(Seal {
            key,
            node,
            capacity,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(key: &EncryptionKey, place: &ChunkPlace, plain: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; plain.len() + OVERHEAD as usize];
        buf[NONCE_LEN as usize..NONCE_LEN as usize + plain.len()].copy_from_slice(plain);
        key.seal(place, &[7; 24], &mut buf).unwrap();
        buf
    }

    /// A chunk opens only with its key, at its place, unchanged.
    #[test]
    fn a_chunk_opens_only_as_sealed() {
        let key = EncryptionKey::from_secret(&[1; 32], "test").unwrap();
        let place = ChunkPlace {
            node: 5,
            block: 2,
            chunk: 9,
        };
        let plain = b"the plaintext of one chunk".repeat(10);
        let buf = sealed(&key, &place, &plain);
        assert!(!buf.windows(9).any(|w| w == b"plaintext"));
        let mut ok = buf.clone();
        assert!(key.open(&place, &mut ok));
        assert_eq!(&ok[24..24 + plain.len()], &plain[..]);
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            assert!(!key.open(&place, &mut bad), "byte {i} flipped");
        }
        for other in [
            ChunkPlace { node: 6, ..place },
            ChunkPlace { block: 3, ..place },
            ChunkPlace { chunk: 8, ..place },
        ] {
            assert!(!key.open(&other, &mut buf.clone()), "{other:?}");
        }
        let other_key = EncryptionKey::from_secret(&[2; 32], "test").unwrap();
        assert!(!other_key.open(&place, &mut buf.clone()));
        // Cut short: the length is bound too.
        assert!(!key.open(&place, &mut buf[..buf.len() - 1].to_vec()));
        assert!(!key.open(&place, &mut [0u8; 39]));
        assert!(EncryptionKey::from_secret(&[1; 15], "f").is_err());
        assert!(EncryptionKey::from_secret(&[1; 4097], "f").is_err());
        assert_eq!(format!("{key:?}"), "EncryptionKey(..)");
    }

    /// The cipher's own speed on this machine, sealing and opening 4 KiB
    /// chunks (the ceiling of the encrypted data path; `docs/benchmarks.md`):
    /// `cargo test --release -p nodekernel-client --lib -- --ignored
    /// --nocapture cipher_throughput`.
    #[test]
    #[ignore]
    fn cipher_throughput() {
        let key = EncryptionKey::from_secret(&[1; 32], "bench").unwrap();
        let chunk = nodekernel_proto::crypt::SEALED_CHUNK as usize;
        let mut buf = vec![0u8; 256 * chunk];
        let nonce = [9u8; 24];
        let start = std::time::Instant::now();
        let rounds = 64;
        for r in 0..rounds {
            for (i, c) in buf.chunks_mut(chunk).enumerate() {
                let place = ChunkPlace {
                    node: r,
                    block: 0,
                    chunk: i as u32,
                };
                key.seal(&place, &nonce, c).unwrap();
            }
        }
        let sealed = start.elapsed();
        // Opening decrypts in place: each round opens a fresh copy of the
        // sealed chunks (the copy is timed too, as a read's copy is).
        let pristine = buf.clone();
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            buf.copy_from_slice(&pristine);
            for (i, c) in buf.chunks_mut(chunk).enumerate() {
                let place = ChunkPlace {
                    node: rounds - 1,
                    block: 0,
                    chunk: i as u32,
                };
                assert!(key.open(&place, c));
            }
        }
        let opened = start.elapsed();
        let mb = (rounds as usize * 256 * 4096) as f64 / 1e6;
        let seal = mb / sealed.as_secs_f64();
        let open = mb / opened.as_secs_f64();
        println!("seal {seal:.0} MB/s, open {open:.0} MB/s (4 KiB chunks, one core)");
    }
}

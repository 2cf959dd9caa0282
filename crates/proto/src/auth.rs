//! The one message authentication code of the wire: HMAC-SHA256 over a
//! label and length-prefixed parts. The cluster-token handshake
//! (`nodekernel_rpc::auth`) proves knowledge of the token with it, and the
//! metadata server signs data-plane capabilities ([`crate::cap`]) with it.
//!
//! A label names what a code is for, so a code made for one purpose never
//! verifies for another (a client's proof is not a server's proof, a
//! read capability is not a handshake answer).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a full code.
pub const MAC_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// A key and a label made ready once: a code under it costs the hashing
/// of its parts only, not the key's set-up again (HMAC hashes the padded
/// key twice, two SHA-256 blocks, before any message: as much as a short
/// message itself). Keep one where codes under the same key are made or
/// checked often (a storage server's capabilities). About 200 bytes.
#[derive(Clone)]
pub struct Keyed(HmacSha256);

impl Keyed {
    pub fn new(key: &[u8], label: &[u8]) -> Keyed {
        // HMAC takes keys of any length.
        let mut m = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of every length");
        m.update(&(label.len() as u32).to_le_bytes());
        m.update(label);
        Keyed(m)
    }

    fn with(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m = self.0.clone();
        for p in parts {
            m.update(&(p.len() as u32).to_le_bytes());
            m.update(p);
        }
        m
    }

    /// [`mac`] under this key and label.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; MAC_LEN] {
        self.with(parts).finalize().into_bytes().into()
    }

    /// [`verify`] under this key and label.
    pub fn verify(&self, parts: &[&[u8]], code: &[u8]) -> bool {
        if code.len() < 16 || code.len() > MAC_LEN {
            return false;
        }
        self.with(parts).verify_truncated_left(code).is_ok()
    }
}

/// The code of `parts` under `key` for the purpose `label`.
pub fn mac(key: &[u8], label: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    Keyed::new(key, label).mac(parts)
}

/// Whether `code` is the code (or its first `code.len()` bytes, at least
/// 16) of `parts` under `key` for `label`. Compares in constant time.
pub fn verify(key: &[u8], label: &[u8], parts: &[&[u8]], code: &[u8]) -> bool {
    Keyed::new(key, label).verify(parts, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_depend_on_key_label_and_every_part() {
        let base = mac(b"key", b"label", &[b"a", b"bc"]);
        assert!(verify(b"key", b"label", &[b"a", b"bc"], &base));
        assert!(verify(b"key", b"label", &[b"a", b"bc"], &base[..16]));
        assert!(!verify(b"key", b"label", &[b"a", b"bc"], &base[..8]));
        assert!(!verify(b"kez", b"label", &[b"a", b"bc"], &base));
        assert!(!verify(b"key", b"lab", &[b"a", b"bc"], &base));
        // The length prefixes keep part boundaries apart.
        assert!(!verify(b"key", b"label", &[b"ab", b"c"], &base));
        let mut flipped = base;
        flipped[31] ^= 1;
        assert!(!verify(b"key", b"label", &[b"a", b"bc"], &flipped));
    }

    #[test]
    fn a_key_made_ready_once_gives_the_same_codes_every_time() {
        let k = Keyed::new(b"key", b"label");
        for parts in [&[&b"a"[..], b"bc"][..], &[b"x"], &[]] {
            let want = mac(b"key", b"label", parts);
            assert_eq!(k.mac(parts), want);
            // Made twice from one Keyed: no state leaks from one code into the next.
            assert_eq!(k.mac(parts), want);
            assert!(k.verify(parts, &want[..16]));
            assert!(!Keyed::new(b"kez", b"label").verify(parts, &want));
            assert!(!Keyed::new(b"key", b"lab").verify(parts, &want));
        }
    }
}

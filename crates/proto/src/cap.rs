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
//! A capability also names what it allows ([`Rights`]): a reader's
//! location can only read, a writer's (handed out under a write lease)
//! read and write, and only the metadata server's own claims and copies
//! may clear a small value's tag, scrub, release or fill a block. And it
//! expires: it carries the second, in the storage server's clock, after
//! which it is refused. The metadata server learns each storage server's
//! clock from its heartbeats, so the two clocks need not agree. A
//! capability that does not verify, or has expired, is refused as
//! `Stale`, the error that makes a client ask the metadata server for the
//! block again: that is what a client holding capabilities from before its
//! storage server restarted (with a new key), or from long ago, needs, and
//! all a forger gets. Within its lifetime, a capability dies with its
//! block's generation anyway: when the block changes hands, the old
//! capability names a generation the server refuses.
//!
//! The same key lets a storage server prove who it is to a metadata
//! server: [`identify_proof`] (asked before a registration may replace a
//! server) and [`Signed`] (its heartbeats and resizes).

use crate::auth::{mac, verify, Keyed, MAC_LEN};
use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};

/// Bytes of a storage server's capability key.
pub const CAP_KEY_LEN: usize = 32;
/// A storage server's capability key.
pub type CapKey = [u8; CAP_KEY_LEN];
/// Bytes of a capability's code (HMAC-SHA256, truncated).
pub const CAP_MAC_LEN: usize = 16;
/// Bytes of an encoded [`Cap`].
pub const CAP_LEN: usize = 4 + 4 + 1 + 8 + CAP_MAC_LEN;

/// How long a capability lives by default, in seconds: a reader or writer
/// holding a location longer asks the metadata server again (the client
/// does it by itself on `Stale`).
pub const CAP_LIFETIME_SECS: u64 = 120;

const LABEL: &[u8] = b"nodekernel block capability";

/// What a capability allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rights(u8);

impl Default for Rights {
    fn default() -> Rights {
        Rights::READ
    }
}

impl Rights {
    /// Read the bytes (and claim the block at the capability's
    /// generation, which only ever catches a block up with the metadata
    /// server).
    pub const READ: Rights = Rights(1);
    /// Read and write the bytes: a writer's, handed out under its lease.
    pub const WRITE: Rights = Rights(1 | 2);
    /// Everything, including claims that clear a tag, scrub or release a
    /// block, and copies into it: the metadata server's own.
    pub const MANAGE: Rights = Rights(1 | 2 | 4);

    /// The bits on the wire.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Whether these rights include all of `other`'s.
    pub fn allow(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }

    fn from_bits(bits: u8) -> Result<Rights> {
        [Rights::READ, Rights::WRITE, Rights::MANAGE]
            .into_iter()
            .find(|r| r.0 == bits)
            .ok_or_else(|| Error::protocol(format!("bad capability rights {bits:#x}")))
    }

    fn name(self) -> &'static str {
        match self.0 {
            1 => "reading",
            3 => "reading and writing",
            _ => "managing",
        }
    }
}

/// Permission to touch bytes `lo..hi` of one block at one generation, in
/// the ways its [`Rights`] allow, until its storage server's clock passes
/// `expires` (seconds since the Unix epoch; 0: never, only in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cap {
    pub lo: u32,
    pub hi: u32,
    pub rights: Rights,
    pub expires: u64,
    pub mac: [u8; CAP_MAC_LEN],
}

fn parts(block: u32, gen: u64, lo: u32, hi: u32, rights: Rights, expires: u64) -> [u8; 29] {
    let mut p = [0u8; 29];
    p[..4].copy_from_slice(&block.to_le_bytes());
    p[4..12].copy_from_slice(&gen.to_le_bytes());
    p[12..16].copy_from_slice(&lo.to_le_bytes());
    p[16..20].copy_from_slice(&hi.to_le_bytes());
    p[20] = rights.0;
    p[21..].copy_from_slice(&expires.to_le_bytes());
    p
}

/// The first [`CAP_MAC_LEN`] bytes of a code.
fn short(full: [u8; MAC_LEN]) -> [u8; CAP_MAC_LEN] {
    let mut m = [0u8; CAP_MAC_LEN];
    m.copy_from_slice(&full[..CAP_MAC_LEN]);
    m
}

/// What a capability is checked for: the bytes a request touches, what it
/// does with them, and the storage server's clock.
#[derive(Debug, Clone, Copy)]
pub struct Use {
    pub block: u32,
    pub gen: u64,
    pub offset: u32,
    pub len: u32,
    pub needs: Rights,
    /// The storage server's clock, seconds since the Unix epoch.
    pub now: u64,
}

/// A storage server's capability key made ready to mint and check
/// capabilities (see [`Keyed`]): a metadata server keeps one per storage
/// server, a storage server one for itself. Minting or checking with it
/// costs about half of what [`Cap::mint`] and [`Cap::check`] cost, which
/// set the key up each time. About 200 bytes.
#[derive(Clone)]
pub struct CapSigner(Keyed);

impl CapSigner {
    pub fn new(key: &CapKey) -> CapSigner {
        CapSigner(Keyed::new(key, LABEL))
    }

    /// The capability for bytes `lo..hi` of `block` at `gen`, allowing
    /// `rights` until `expires`.
    pub fn mint(
        &self,
        block: u32,
        gen: u64,
        lo: u32,
        hi: u32,
        rights: Rights,
        expires: u64,
    ) -> Cap {
        Cap {
            lo,
            hi,
            rights,
            expires,
            mac: short(self.0.mac(&[&parts(block, gen, lo, hi, rights, expires)])),
        }
    }

    /// [`Cap::check`] with this key.
    pub fn check(&self, cap: &Cap, u: Use) -> Result<()> {
        cap.check_with(&self.0, u)
    }
}

impl std::fmt::Debug for CapSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("CapSigner")
    }
}

impl Cap {
    /// The capability for bytes `lo..hi` of `block` at `gen` under `key`,
    /// allowing `rights` until `expires` (once: a [`CapSigner`] mints many).
    pub fn mint(
        key: &CapKey,
        block: u32,
        gen: u64,
        lo: u32,
        hi: u32,
        rights: Rights,
        expires: u64,
    ) -> Cap {
        CapSigner::new(key).mint(block, gen, lo, hi, rights, expires)
    }

    /// Checks that this capability, under `key`, allows `u`: a request
    /// touching `u.len` bytes at `u.offset` of `u.block` at `u.gen` (a
    /// zero-length request, a claim, needs `offset` inside the range or at
    /// its end) in the ways `u.needs` names, at time `u.now`.
    ///
    /// A capability that does not verify, has expired or does not allow
    /// what the request does is `Stale` (the client asks the metadata
    /// server again; a reader gets nothing more); a valid one that does not
    /// cover the bytes is `OutOfRange`.
    ///
    /// Once under `key`: a [`CapSigner`] checks many.
    pub fn check(&self, key: &CapKey, u: Use) -> Result<()> {
        CapSigner::new(key).check(self, u)
    }

    /// [`Cap::check`] under `keyed` (the key and [`LABEL`]).
    fn check_with(&self, keyed: &Keyed, u: Use) -> Result<()> {
        let (block, gen) = (u.block, u.gen);
        let end = u.offset as u64 + u.len as u64;
        if !keyed.verify(
            &[&parts(
                block,
                gen,
                self.lo,
                self.hi,
                self.rights,
                self.expires,
            )],
            &self.mac,
        ) {
            return Err(Error::stale(format!(
                "block {block}: the request carries no valid capability for generation {gen} \
                 (the metadata server did not give it, or the storage server restarted since): \
                 ask the metadata server for the block again"
            )));
        }
        if self.expires != 0 && u.now > self.expires {
            return Err(Error::stale(format!(
                "block {block}: the capability for generation {gen} expired {}s ago: ask the \
                 metadata server for the block again",
                u.now - self.expires
            )));
        }
        if !self.rights.allow(u.needs) {
            return Err(Error::stale(format!(
                "block {block}: the capability for generation {gen} allows {} only, not {}: \
                 a writer asks the metadata server under its lease",
                self.rights.name(),
                u.needs.name()
            )));
        }
        if u.offset < self.lo || end > self.hi as u64 {
            return Err(Error::out_of_range(format!(
                "block {block}: bytes {}..{end} are outside the {}..{} the capability allows",
                u.offset, self.lo, self.hi
            )));
        }
        Ok(())
    }

    pub fn encode(&self, e: &mut Enc) {
        e.u32(self.lo)
            .u32(self.hi)
            .u8(self.rights.0)
            .u64(self.expires)
            .fixed(&self.mac);
    }

    pub fn decode(d: &mut Dec) -> Result<Cap> {
        Ok(Cap {
            lo: d.u32()?,
            hi: d.u32()?,
            rights: Rights::from_bits(d.u8()?)?,
            expires: d.u64()?,
            mac: d.array()?,
        })
    }
}

/// The clock capabilities expire by: seconds since the Unix epoch (0 if
/// the system clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

const IDENTIFY_LABEL: &[u8] = b"nodekernel storage server identity";
const SIGNED_LABEL: &[u8] = b"nodekernel storage server request";

/// A storage server's answer to a metadata server's `Identify` challenge:
/// the code under its capability key over the challenge's `nonce`, its
/// identity and incarnation. Only the process that registered the key can
/// make it, so a metadata server asks for it before a registration may
/// replace a server it believes alive.
pub fn identify_proof(
    key: &CapKey,
    nonce: &[u8],
    identity: &str,
    incarnation: u64,
) -> [u8; MAC_LEN] {
    mac(
        key,
        IDENTIFY_LABEL,
        &[nonce, identity.as_bytes(), &incarnation.to_le_bytes()],
    )
}

/// Whether `proof` is [`identify_proof`] of these under `key`.
pub fn verify_identify(
    key: &CapKey,
    nonce: &[u8],
    identity: &str,
    incarnation: u64,
    proof: &[u8],
) -> bool {
    proof.len() == MAC_LEN
        && verify(
            key,
            IDENTIFY_LABEL,
            &[nonce, identity.as_bytes(), &incarnation.to_le_bytes()],
            proof,
        )
}

/// A storage server's signature on a request it sends a metadata server
/// (a heartbeat, a resize): a sequence number that only grows (the
/// server's clock in milliseconds, so it also tells the metadata server
/// that clock) and a code under its capability key over the request's
/// kind, its fields and the number. A metadata server takes such a
/// request only when it verifies under the key the server registered and
/// its number is greater than the last one taken, so nobody else can make
/// one, and a recorded one cannot be replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Signed {
    pub seq: u64,
    pub mac: [u8; CAP_MAC_LEN],
}

/// Bytes of an encoded [`Signed`].
pub const SIGNED_LEN: usize = 8 + CAP_MAC_LEN;

impl Signed {
    /// Signs request `op` with fields `fields` and number `seq`.
    pub fn sign(key: &CapKey, op: u16, fields: &[u8], seq: u64) -> Signed {
        Signed {
            seq,
            mac: short(mac(
                key,
                SIGNED_LABEL,
                &[&op.to_le_bytes(), fields, &seq.to_le_bytes()],
            )),
        }
    }

    /// Whether this signs request `op` with `fields` under `key`.
    pub fn verify(&self, key: &CapKey, op: u16, fields: &[u8]) -> bool {
        verify(
            key,
            SIGNED_LABEL,
            &[&op.to_le_bytes(), fields, &self.seq.to_le_bytes()],
            &self.mac,
        )
    }

    pub fn encode(&self, e: &mut Enc) {
        e.u64(self.seq).fixed(&self.mac);
    }

    pub fn decode(d: &mut Dec) -> Result<Signed> {
        Ok(Signed {
            seq: d.u64()?,
            mac: d.array()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    fn use_of(block: u32, gen: u64, offset: u32, len: u32, needs: Rights, now: u64) -> Use {
        Use {
            block,
            gen,
            offset,
            len,
            needs,
            now,
        }
    }

    #[test]
    fn a_capability_covers_its_block_generation_and_range_only() {
        let key = [7u8; CAP_KEY_LEN];
        let c = Cap::mint(&key, 3, 10, 100, 200, Rights::WRITE, 1000);
        let ok = |b, g, o, l| c.check(&key, use_of(b, g, o, l, Rights::WRITE, 1000));
        assert!(ok(3, 10, 100, 100).is_ok());
        assert!(ok(3, 10, 150, 0).is_ok());
        for (block, gen, off, len, code) in [
            (4, 10, 100, 10, ErrorCode::Stale),           // another block
            (3, 11, 100, 10, ErrorCode::Stale),           // another generation
            (3, u64::MAX >> 1, 100, 0, ErrorCode::Stale), // a poisoning claim
            (3, 10, 99, 10, ErrorCode::OutOfRange),       // before the range
            (3, 10, 150, 51, ErrorCode::OutOfRange),      // past it
            (3, 10, u32::MAX, u32::MAX, ErrorCode::OutOfRange),
        ] {
            let e = ok(block, gen, off, len).unwrap_err();
            assert_eq!(e.code, code, "{e}");
        }
        // Another key, a widened range, a flipped bit: refused.
        let u = use_of(3, 10, 100, 10, Rights::READ, 0);
        assert!(c.check(&[8; CAP_KEY_LEN], u).is_err());
        let wider = Cap { lo: 0, ..c };
        assert!(wider
            .check(&key, use_of(3, 10, 0, 10, Rights::READ, 0))
            .is_err());
        let mut flipped = c;
        flipped.mac[0] ^= 1;
        assert!(flipped.check(&key, u).is_err());
        assert!(Cap::default()
            .check(&key, use_of(3, 10, 0, 0, Rights::READ, 0))
            .is_err());
    }

    #[test]
    fn a_signer_mints_and_checks_as_the_key_does() {
        let key = [7u8; CAP_KEY_LEN];
        let s = CapSigner::new(&key);
        for (block, gen, lo, hi, rights, expires) in [
            (3, 10, 100, 200, Rights::WRITE, 1000),
            (0, u64::MAX, 0, u32::MAX, Rights::MANAGE, 0),
            (9, 1, 5, 6, Rights::READ, u64::MAX),
        ] {
            let c = s.mint(block, gen, lo, hi, rights, expires);
            assert_eq!(c, Cap::mint(&key, block, gen, lo, hi, rights, expires));
            let u = use_of(block, gen, lo, hi - lo, rights, expires.min(1000));
            assert!(s.check(&c, u).is_ok());
            assert!(c.check(&key, u).is_ok());
            let mut flipped = c;
            flipped.mac[15] ^= 1;
            assert_eq!(s.check(&flipped, u).unwrap_err().code, ErrorCode::Stale);
            let other = CapSigner::new(&[8; CAP_KEY_LEN]);
            assert_eq!(other.check(&c, u).unwrap_err().code, ErrorCode::Stale);
            // Out of its range: the same answer as the key's check.
            let past = use_of(block, gen, hi, 1, rights, 0);
            assert_eq!(
                s.check(&c, past).unwrap_err().code,
                c.check(&key, past).unwrap_err().code
            );
        }
    }

    #[test]
    fn a_capability_allows_only_its_rights_and_only_until_it_expires() {
        let key = [7u8; CAP_KEY_LEN];
        let read = Cap::mint(&key, 3, 10, 0, 100, Rights::READ, 1000);
        let write = Cap::mint(&key, 3, 10, 0, 100, Rights::WRITE, 1000);
        let manage = Cap::mint(&key, 3, 10, 0, 100, Rights::MANAGE, 1000);
        for (cap, needs, allowed) in [
            (read, Rights::READ, true),
            (read, Rights::WRITE, false),
            (read, Rights::MANAGE, false),
            (write, Rights::READ, true),
            (write, Rights::WRITE, true),
            (write, Rights::MANAGE, false),
            (manage, Rights::MANAGE, true),
        ] {
            let r = cap.check(&key, use_of(3, 10, 0, 10, needs, 999));
            assert_eq!(r.is_ok(), allowed, "{cap:?} for {needs:?}: {r:?}");
            if let Err(e) = r {
                assert_eq!(e.code, ErrorCode::Stale, "{e}");
                assert!(e.message.contains("allows reading"), "{e}");
            }
        }
        // Widening the rights or the lifetime breaks the code.
        let forged = Cap {
            rights: Rights::WRITE,
            ..read
        };
        assert!(forged
            .check(&key, use_of(3, 10, 0, 10, Rights::WRITE, 0))
            .is_err());
        let later = Cap {
            expires: 5000,
            ..read
        };
        assert!(later
            .check(&key, use_of(3, 10, 0, 10, Rights::READ, 2000))
            .is_err());
        // Good up to its second, refused after it.
        assert!(read
            .check(&key, use_of(3, 10, 0, 10, Rights::READ, 1000))
            .is_ok());
        let e = read
            .check(&key, use_of(3, 10, 0, 10, Rights::READ, 1001))
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale);
        assert!(e.message.contains("expired"), "{e}");
    }

    #[test]
    fn server_proofs_verify_only_for_their_key_and_contents() {
        let key = [3u8; CAP_KEY_LEN];
        let p = identify_proof(&key, b"nonce", "abc", 7);
        assert!(verify_identify(&key, b"nonce", "abc", 7, &p));
        assert!(!verify_identify(&[4; CAP_KEY_LEN], b"nonce", "abc", 7, &p));
        assert!(!verify_identify(&key, b"other", "abc", 7, &p));
        assert!(!verify_identify(&key, b"nonce", "abd", 7, &p));
        assert!(!verify_identify(&key, b"nonce", "abc", 8, &p));
        assert!(!verify_identify(&key, b"nonce", "abc", 7, &p[..16]));
        let s = Signed::sign(&key, 5, b"fields", 42);
        assert!(s.verify(&key, 5, b"fields"));
        assert!(!s.verify(&key, 6, b"fields"));
        assert!(!s.verify(&key, 5, b"fieldz"));
        assert!(!Signed { seq: 43, ..s }.verify(&key, 5, b"fields"));
        assert!(!s.verify(&[4; CAP_KEY_LEN], 5, b"fields"));
    }

    #[test]
    fn round_trip() {
        let c = Cap::mint(&[1; CAP_KEY_LEN], 1, 2, 3, 4, Rights::WRITE, 99);
        let mut b = bytes::BytesMut::new();
        c.encode(&mut Enc(&mut b));
        assert_eq!(b.len(), CAP_LEN);
        let mut d = Dec::new(&b, "cap");
        assert_eq!(Cap::decode(&mut d).unwrap(), c);
        d.finish().unwrap();
        // Rights the wire does not know are refused.
        b[8] = 2;
        assert!(Cap::decode(&mut Dec::new(&b, "cap")).is_err());
        let s = Signed::sign(&[1; CAP_KEY_LEN], 1, b"", 7);
        let mut b = bytes::BytesMut::new();
        s.encode(&mut Enc(&mut b));
        assert_eq!(b.len(), SIGNED_LEN);
        let mut d = Dec::new(&b, "signed");
        assert_eq!(Signed::decode(&mut d).unwrap(), s);
        d.finish().unwrap();
    }
}

//! The HELLO exchange that opens every connection: the wire-version
//! negotiation, and the place where authentication will plug in.
//!
//! The client's first frame is a HELLO: a normal frame (the frozen 14-byte
//! header of [`crate::frame`]) with id [`HELLO_ID`] and kind [`HELLO_KIND`].
//! Its payload, little-endian:
//!
//! ```text
//! +----------------+-------------+---------+--------------+-------------+
//! | magic [u8; 6]  | version u16 | role u8 | ext_len u32  | ext ...     |
//! | "NKWIRE"       |             |         | <= 4096      |             |
//! +----------------+-------------+---------+--------------+-------------+
//! ```
//!
//! The server answers with a frame of id [`HELLO_ID`]: status
//! [`STATUS_OK`](crate::frame::STATUS_OK) and its own HELLO payload (the
//! same layout: the version it speaks and its role), or an error frame
//! (status = error code, payload = UTF-8 message) when it refuses the
//! connection before looking at the version (not a HELLO, bad magic, failed
//! authentication). A server that does not speak the client's version still
//! answers with its own HELLO, so the client can name both versions, and
//! then closes the connection; so does the client when the answer names a
//! version it does not speak.
//!
//! This layout is frozen forever, like the frame header: any version must be
//! able to read any other version's HELLO. Later versions add fields only
//! inside `ext`.

use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use bytes::BytesMut;

/// The frame kind of a HELLO (a request kind no operation uses).
pub const HELLO_KIND: u16 = 0xFFFF;
/// The request id of a HELLO and of its answer.
pub const HELLO_ID: u64 = 0;
/// First bytes of every HELLO payload.
pub const HELLO_MAGIC: [u8; 6] = *b"NKWIRE";
/// The wire version this build speaks. Bumped on any incompatible change to
/// a message's layout or meaning.
pub const WIRE_VERSION: u16 = 16;
/// The frame kind of the client's proof of the cluster token, the frame
/// after the HELLO exchange when the server's HELLO carries a nonce
/// (`nodekernel_rpc::auth` has the exchange). Its answer, with id
/// [`HELLO_ID`], carries the server's proof.
pub const AUTH_KIND: u16 = 0xFFFE;
/// Bytes of a HELLO's authentication nonce.
pub const NONCE_LEN: usize = 32;
/// Tag of the `ext` entry that carries an authentication nonce.
const EXT_NONCE: u8 = 1;
/// Largest extension field a HELLO may carry.
pub const MAX_HELLO_EXT_LEN: usize = 4096;
/// Largest HELLO payload (magic, version, role, extension).
pub const MAX_HELLO_LEN: usize = HELLO_MAGIC.len() + 2 + 1 + 4 + MAX_HELLO_EXT_LEN;

/// What the sender of a HELLO is, for logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The sender did not say.
    Unspecified,
    /// A client library.
    Client,
    /// A storage server (connecting to a metadata server, or serving).
    StorageServer,
    /// A metadata server.
    MetaServer,
    /// A role this version does not know (from a newer peer).
    Other(u8),
}

impl Role {
    pub fn to_u8(self) -> u8 {
        match self {
            Role::Unspecified => 0,
            Role::Client => 1,
            Role::StorageServer => 2,
            Role::MetaServer => 3,
            Role::Other(v) => v,
        }
    }

    pub fn from_u8(v: u8) -> Role {
        match v {
            0 => Role::Unspecified,
            1 => Role::Client,
            2 => Role::StorageServer,
            3 => Role::MetaServer,
            v => Role::Other(v),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Unspecified => f.write_str("unspecified role"),
            Role::Client => f.write_str("client"),
            Role::StorageServer => f.write_str("storage server"),
            Role::MetaServer => f.write_str("metadata server"),
            Role::Other(v) => write!(f, "role {v}"),
        }
    }
}

/// A decoded HELLO payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub role: Role,
    /// Reserved for later versions (empty in version 1); at most
    /// [`MAX_HELLO_EXT_LEN`] bytes.
    pub ext: Vec<u8>,
}

impl Hello {
    /// A HELLO of this build's [`WIRE_VERSION`] with no extension.
    pub fn new(role: Role) -> Hello {
        Hello {
            version: WIRE_VERSION,
            role,
            ext: Vec::new(),
        }
    }

    /// This HELLO with an authentication nonce in its extension: the
    /// sender holds a cluster token and will prove it.
    pub fn with_nonce(mut self, nonce: [u8; NONCE_LEN]) -> Hello {
        self.ext.push(EXT_NONCE);
        self.ext
            .extend_from_slice(&(NONCE_LEN as u16).to_le_bytes());
        self.ext.extend_from_slice(&nonce);
        self
    }

    /// The authentication nonce of the extension, if it has one. The
    /// extension is a list of entries (tag `u8`, length `u16`, value);
    /// entries of tags this version does not know are skipped, and a list
    /// that does not add up is a `Protocol` error.
    pub fn nonce(&self) -> Result<Option<[u8; NONCE_LEN]>> {
        let mut d = Dec::new(&self.ext, "HELLO extension");
        let mut found = None;
        while d.remaining() > 0 {
            let tag = d.u8()?;
            let len = d.u16()? as usize;
            let value = d.take(len)?;
            if tag == EXT_NONCE {
                found = Some(value.try_into().map_err(|_| {
                    Error::protocol(format!("a HELLO nonce of {len} bytes (it has {NONCE_LEN})"))
                })?);
            }
        }
        Ok(found)
    }

    /// Appends the payload; fails if the extension is over
    /// [`MAX_HELLO_EXT_LEN`].
    pub fn encode(&self, out: &mut BytesMut) -> Result<()> {
        if self.ext.len() > MAX_HELLO_EXT_LEN {
            return Err(Error::invalid_argument(format!(
                "HELLO extension of {} bytes exceeds the limit of {MAX_HELLO_EXT_LEN}",
                self.ext.len()
            )));
        }
        out.extend_from_slice(&HELLO_MAGIC);
        Enc(out)
            .u16(self.version)
            .u8(self.role.to_u8())
            .bytes(&self.ext);
        Ok(())
    }

    /// Decodes a payload. Anything that is not exactly a HELLO (wrong magic,
    /// truncated, an oversized extension, trailing bytes) is a `Protocol`
    /// error; nothing is allocated before its length is checked.
    pub fn decode(payload: &[u8]) -> Result<Hello> {
        if payload.len() > MAX_HELLO_LEN {
            return Err(Error::protocol(format!(
                "HELLO of {} bytes exceeds the limit of {MAX_HELLO_LEN}",
                payload.len()
            )));
        }
        let mut d = Dec::new(payload, "HELLO");
        if d.take(HELLO_MAGIC.len())? != HELLO_MAGIC {
            return Err(Error::protocol(
                "not a NodeKernel HELLO (the magic is not NKWIRE)",
            ));
        }
        let version = d.u16()?;
        let role = Role::from_u8(d.u8()?);
        // Bounded: the whole payload is at most MAX_HELLO_LEN, and `bytes`
        // checks the length against what is present.
        let ext = d.bytes()?.to_vec();
        d.finish()?;
        Ok(Hello { version, role, ext })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn round_trip() {
        for role in [
            Role::Unspecified,
            Role::Client,
            Role::StorageServer,
            Role::MetaServer,
            Role::Other(77),
        ] {
            let h = Hello {
                version: 7,
                role,
                ext: vec![1, 2, 3],
            };
            let mut b = BytesMut::new();
            h.encode(&mut b).unwrap();
            assert_eq!(&b[..6], b"NKWIRE");
            assert_eq!(Hello::decode(&b).unwrap(), h);
        }
    }

    #[test]
    fn nonces_ride_in_the_extension_and_unknown_entries_are_skipped() {
        assert_eq!(Hello::new(Role::Client).nonce().unwrap(), None);
        let h = Hello::new(Role::Client).with_nonce([7; NONCE_LEN]);
        let mut b = BytesMut::new();
        h.encode(&mut b).unwrap();
        assert_eq!(
            Hello::decode(&b).unwrap().nonce().unwrap(),
            Some([7; NONCE_LEN])
        );
        // A newer peer's entry before it is skipped.
        let mut ext = vec![9, 2, 0, 0xAA, 0xBB];
        ext.extend_from_slice(&h.ext);
        let h2 = Hello { ext, ..h.clone() };
        assert_eq!(h2.nonce().unwrap(), Some([7; NONCE_LEN]));
        // Entries that do not add up, and a nonce of the wrong size.
        for ext in [vec![1], vec![1, 5, 0, 1], vec![1, 1, 0, 3]] {
            let bad = Hello { ext, ..h.clone() };
            assert_eq!(bad.nonce().unwrap_err().code, ErrorCode::Protocol);
        }
    }

    #[test]
    fn layout_is_frozen() {
        let mut b = BytesMut::new();
        Hello::new(Role::MetaServer).encode(&mut b).unwrap();
        assert_eq!(&b[..], b"NKWIRE\x10\x00\x03\x00\x00\x00\x00");
    }

    #[test]
    fn malformed_hellos_are_protocol_errors() {
        let mut good = BytesMut::new();
        Hello::new(Role::Client).encode(&mut good).unwrap();
        // Every truncation, wrong magic, trailing bytes, a lying ext length.
        for n in 0..good.len() {
            assert_eq!(
                Hello::decode(&good[..n]).unwrap_err().code,
                ErrorCode::Protocol
            );
        }
        let mut bad = good.to_vec();
        bad[0] = b'X';
        assert!(Hello::decode(&bad).unwrap_err().message.contains("magic"));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(Hello::decode(&long).unwrap_err().code, ErrorCode::Protocol);
        let mut lying = good.to_vec();
        lying[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Hello::decode(&lying).unwrap_err().code, ErrorCode::Protocol);
        assert_eq!(
            Hello::decode(&vec![0u8; MAX_HELLO_LEN + 1])
                .unwrap_err()
                .code,
            ErrorCode::Protocol
        );
        let big = Hello {
            ext: vec![0; MAX_HELLO_EXT_LEN + 1],
            ..Hello::new(Role::Client)
        };
        assert!(big.encode(&mut BytesMut::new()).is_err());
    }
}

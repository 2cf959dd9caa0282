//! Data-plane messages: byte-granular block reads and writes.
//!
//! A read reply's payload is the raw bytes and a status byte sent after
//! them ([`READ_TRAILER_LEN`]); a write request's payload is a
//! fixed prefix followed by the raw bytes (their length is implied by the
//! frame), so data is never copied into an intermediate encoding.

use crate::cap::{Cap, CAP_LEN};
use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use bytes::{Bytes, BytesMut};

pub mod op {
    pub const READ: u16 = 1;
    pub const WRITE: u16 = 2;
    pub const PING: u16 = 3;
    pub const SHM_INFO: u16 = 4;
    pub const CLAIM: u16 = 5;
    pub const COPY: u16 = 6;
    pub const RESIZE: u16 = 7;
    pub const IDENTIFY: u16 = 8;

    /// The request's name in metrics and logs (`"other"` for a number
    /// this build does not know).
    pub fn name(op: u16) -> &'static str {
        match op {
            READ => "read",
            WRITE => "write",
            PING => "ping",
            SHM_INFO => "shm_info",
            CLAIM => "claim",
            COPY => "copy",
            RESIZE => "resize",
            _ => "other",
        }
    }
}

/// Bytes after the data of a `Read` reply: one status byte, sent after
/// the data went out ([`READ_OK`], or [`READ_CHANGED_HANDS`] when the
/// block changed hands while its bytes were being sent, so the data must
/// be thrown away). A storage server may send straight from memory that a
/// new owner can write to meanwhile; the status says whether it did.
pub const READ_TRAILER_LEN: usize = 1;
pub const READ_OK: u8 = 0;
pub const READ_CHANGED_HANDS: u8 = 1;

/// Checks a `Read` reply's status byte (see [`READ_TRAILER_LEN`]).
pub fn check_read_status(status: u8, block: u32, gen: u64) -> Result<()> {
    match status {
        READ_OK => Ok(()),
        READ_CHANGED_HANDS => Err(Error::stale(format!(
            "block {block}: read with generation {gen} refused, the block changed hands while it \
             was being sent"
        ))),
        other => Err(Error::protocol(format!(
            "read of block {block}: unknown status byte {other}"
        ))),
    }
}

/// The data of a whole `Read` reply for `len` bytes of `block` at `gen`,
/// its status byte checked and cut off.
pub fn read_reply_data(mut payload: Bytes, block: u32, gen: u64, len: usize) -> Result<Bytes> {
    if payload.len() != len + READ_TRAILER_LEN {
        return Err(Error::protocol(format!(
            "read of {len} bytes of block {block}: a reply of {} bytes",
            payload.len()
        )));
    }
    let status = payload.split_off(len);
    check_read_status(status[0], block, gen)?;
    Ok(payload)
}

/// Most blocks one `Claim` request may carry.
pub const MAX_CLAIM_BATCH: usize = 4096;

/// Bytes of one block of a `Claim` request.
pub const CLAIM_LEN: usize = 4 + 8 + 4 + 1 + CAP_LEN;

/// Largest payload of a storage request other than a write or a claim (a
/// read, a copy: numbers, capabilities and an address).
pub const SMALL_REQUEST_MAX: usize = 4 * 1024;

/// The largest payload a storage server with blocks of `block_size` bytes
/// takes for a request of kind `op`: a write carries at most one block, a
/// claim at most [`MAX_CLAIM_BATCH`] blocks, the others a few hundred
/// bytes; a larger frame is refused from its header, before any of it is
/// buffered (`docs/security.md`, *Limits*).
pub fn max_request_len(op: u16, block_size: u32) -> usize {
    match op {
        op::WRITE => WRITE_PREFIX_LEN + block_size as usize,
        op::CLAIM => 4 + MAX_CLAIM_BATCH * CLAIM_LEN,
        _ => SMALL_REQUEST_MAX,
    }
}

/// Bytes of a small value's tag: the first bytes of its piece hold its
/// node id (little-endian), written by its put and cleared when the value
/// is freed, so a handle to a replaced or deleted value gets `Stale` on
/// both data paths (`docs/small-values.md`).
pub const TAG_LEN: u32 = 8;

/// Largest piece of a shared block (a *slab*) for a block size: a value
/// above it gets blocks of its own, and a container's record pieces stop
/// growing at it (`docs/small-values.md`, `docs/records.md`).
pub fn max_piece(block_size: u32) -> u32 {
    block_size / 4
}

/// Smallest piece size.
pub const MIN_PIECE: u32 = 64;

/// The piece size for a value of `size` bytes and its [`TAG_LEN`]-byte
/// tag, or `None` when the value gets whole blocks (empty, or the two above
/// [`max_piece`]). Sizes go 64, 80, 96, 112, 128, 160, 192, 224, 256, …:
/// four per doubling, so a piece wastes at most a fifth of itself (a
/// 100-byte value and its tag take 112 bytes).
pub fn piece_size_for(block_size: u32, size: u64) -> Option<u32> {
    let max = max_piece(block_size);
    if size == 0 || size > u64::from(max.saturating_sub(TAG_LEN)) {
        return None;
    }
    let size = size + u64::from(TAG_LEN);
    let mut p = MIN_PIECE;
    while p <= max {
        for step in 0..4 {
            let s = p + p / 4 * step;
            if s <= max && size <= u64::from(s) {
                return Some(s);
            }
        }
        p *= 2;
    }
    None
}

/// A read's check of a small value's tag: the [`TAG_LEN`] bytes at `at`
/// must hold `expect`, or the read is refused with `Stale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagCheck {
    pub at: u32,
    pub expect: u64,
}

impl TagCheck {
    /// Checks the tag bytes read at [`TagCheck::at`].
    pub fn check(&self, found: [u8; TAG_LEN as usize], block: u32) -> Result<()> {
        if u64::from_le_bytes(found) == self.expect {
            return Ok(());
        }
        Err(Error::stale(format!(
            "block {block}: the small value at offset {} (node {}) was replaced or deleted",
            self.at + TAG_LEN,
            self.expect
        )))
    }
}

/// One block of a `Claim` request: claim `block` with `gen` (a
/// zero-length write) and, with `clear_tag_at`, clear the tag of the small
/// value freed at that offset (at `gen`, the slab's generation then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub block: u32,
    pub gen: u64,
    pub clear_tag_at: Option<u32>,
    /// The block left the server's exported capacity (dynamic capacity):
    /// once claimed, its memory or disk space may be given back.
    pub release: bool,
    /// Once claimed, write zeros over the whole block at `gen` (a block
    /// handed to an encrypted node, `docs/encryption.md`: no earlier
    /// owner's bytes may travel with it into an encrypted class). Being a
    /// write at `gen`, it never touches a newer owner's bytes.
    pub scrub: bool,
    /// The metadata server's capability for `block` at `gen`.
    pub cap: Cap,
}

/// `clear_tag_at` on the wire when there is none.
const NO_TAG: u32 = u32::MAX;

/// Bytes of the fixed part of a write request (block, gen, offset,
/// capability).
pub const WRITE_PREFIX_LEN: usize = 4 + 8 + 4 + CAP_LEN;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreRequest<'a> {
    Read {
        block: u32,
        gen: u64,
        offset: u32,
        len: u32,
        /// A small value's tag to check first.
        tag: Option<TagCheck>,
        /// Must cover the bytes read (and the tag checked).
        cap: Cap,
    },
    Write {
        block: u32,
        gen: u64,
        offset: u32,
        /// Must cover the bytes written.
        cap: Cap,
        data: &'a [u8],
    },
    Ping,
    /// Where to map this server's memory from (empty payload).
    ShmInfo,
    /// Claim each block with its generation (a zero-length write each):
    /// the metadata server's batched invalidations and fences, and the
    /// tags of freed small values cleared. A block whose generation is
    /// already newer is left alone (it moved on).
    Claim {
        claims: Vec<Claim>,
    },
    /// Copy the whole block `src_block` (generation `src_gen`) of the
    /// storage server at `src_addr` into this server's `block`, claiming it
    /// with `gen`: a block move, ordered by the metadata server. The bytes
    /// go from server to server.
    Copy {
        block: u32,
        gen: u64,
        /// For `block` at `gen` on this server.
        cap: Cap,
        src_addr: String,
        src_block: u32,
        src_gen: u64,
        /// For the source block, passed on to its server.
        src_cap: Cap,
    },
    /// Export `bytes` of the server's memory from now on (dynamic
    /// capacity; at most its size; `u64::MAX`: all of it). The reply is
    /// the size it will export (whole blocks of each metadata partition's
    /// share), as a `u64`; the metadata servers move blocks away before
    /// they count as gone.
    Resize {
        bytes: u64,
    },
    /// Who are you? The server answers its identity, incarnation and
    /// [`identify_proof`](crate::cap::identify_proof) of `nonce` under its
    /// capability key ([`Identity`]): a metadata server asks before a
    /// registration may replace or move a server it believes alive.
    Identify {
        nonce: [u8; IDENTIFY_NONCE_LEN],
    },
}

/// Bytes of an `Identify` challenge.
pub const IDENTIFY_NONCE_LEN: usize = 32;

/// A storage server's answer to `Identify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub identity: String,
    pub incarnation: u64,
    pub proof: [u8; crate::auth::MAC_LEN],
}

impl Identity {
    pub fn encode(&self, buf: &mut BytesMut) {
        Enc(buf)
            .str(&self.identity)
            .u64(self.incarnation)
            .fixed(&self.proof);
    }

    pub fn decode(payload: &[u8]) -> Result<Identity> {
        let mut d = Dec::new(payload, "identify reply");
        let r = Identity {
            identity: d.string()?,
            incarnation: d.u64()?,
            proof: d.array()?,
        };
        d.finish()?;
        Ok(r)
    }
}

impl<'a> StoreRequest<'a> {
    pub fn op(&self) -> u16 {
        match self {
            StoreRequest::Read { .. } => op::READ,
            StoreRequest::Write { .. } => op::WRITE,
            StoreRequest::Ping => op::PING,
            StoreRequest::ShmInfo => op::SHM_INFO,
            StoreRequest::Claim { .. } => op::CLAIM,
            StoreRequest::Copy { .. } => op::COPY,
            StoreRequest::Resize { .. } => op::RESIZE,
            StoreRequest::Identify { .. } => op::IDENTIFY,
        }
    }

    /// Appends the whole payload, data included.
    pub fn encode(&self, buf: &mut BytesMut) {
        match self {
            StoreRequest::Read {
                block,
                gen,
                offset,
                len,
                tag,
                cap,
            } => {
                let e = &mut Enc(buf);
                e.u32(*block).u64(*gen).u32(*offset).u32(*len);
                match tag {
                    Some(t) => e.bool(true).u32(t.at).u64(t.expect),
                    None => e.bool(false),
                };
                cap.encode(e);
            }
            StoreRequest::Write {
                block,
                gen,
                offset,
                cap,
                data,
            } => {
                encode_write_prefix(buf, *block, *gen, *offset, cap);
                buf.extend_from_slice(data);
            }
            StoreRequest::Ping | StoreRequest::ShmInfo => {}
            StoreRequest::Resize { bytes } => {
                Enc(buf).u64(*bytes);
            }
            StoreRequest::Identify { nonce } => {
                Enc(buf).fixed(nonce);
            }
            StoreRequest::Claim { claims } => {
                let e = &mut Enc(buf);
                e.u32(claims.len() as u32);
                for c in claims {
                    e.u32(c.block)
                        .u64(c.gen)
                        .u32(c.clear_tag_at.unwrap_or(NO_TAG))
                        .u8(u8::from(c.release) | u8::from(c.scrub) << 1);
                    c.cap.encode(e);
                }
            }
            StoreRequest::Copy {
                block,
                gen,
                cap,
                src_addr,
                src_block,
                src_gen,
                src_cap,
            } => {
                let e = &mut Enc(buf);
                e.u32(*block).u64(*gen);
                cap.encode(e);
                e.str(src_addr).u32(*src_block).u64(*src_gen);
                src_cap.encode(e);
            }
        }
    }

    pub fn decode(opcode: u16, payload: &'a [u8]) -> Result<StoreRequest<'a>> {
        let mut d = Dec::new(payload, "storage request");
        let req = match opcode {
            op::READ => {
                let r = StoreRequest::Read {
                    block: d.u32()?,
                    gen: d.u64()?,
                    offset: d.u32()?,
                    len: d.u32()?,
                    tag: if d.bool()? {
                        Some(TagCheck {
                            at: d.u32()?,
                            expect: d.u64()?,
                        })
                    } else {
                        None
                    },
                    cap: Cap::decode(&mut d)?,
                };
                d.finish()?;
                r
            }
            op::WRITE => {
                let block = d.u32()?;
                let gen = d.u64()?;
                let offset = d.u32()?;
                let cap = Cap::decode(&mut d)?;
                let n = d.remaining();
                StoreRequest::Write {
                    block,
                    gen,
                    offset,
                    cap,
                    data: d.take(n)?,
                }
            }
            op::PING => {
                d.finish()?;
                StoreRequest::Ping
            }
            op::SHM_INFO => {
                d.finish()?;
                StoreRequest::ShmInfo
            }
            op::CLAIM => {
                let n = d.count(CLAIM_LEN)?;
                if n > MAX_CLAIM_BATCH {
                    return Err(Error::protocol(format!(
                        "claim batch of {n} blocks exceeds the limit of {MAX_CLAIM_BATCH}"
                    )));
                }
                let mut claims = Vec::with_capacity(n);
                for _ in 0..n {
                    let (block, gen) = (d.u32()?, d.u64()?);
                    let at = d.u32()?;
                    let flags = d.u8()?;
                    if flags > 3 {
                        return Err(Error::protocol(format!("bad claim flags {flags:#x}")));
                    }
                    claims.push(Claim {
                        block,
                        gen,
                        clear_tag_at: (at != NO_TAG).then_some(at),
                        release: flags & 1 != 0,
                        scrub: flags & 2 != 0,
                        cap: Cap::decode(&mut d)?,
                    });
                }
                d.finish()?;
                StoreRequest::Claim { claims }
            }
            op::COPY => {
                let r = StoreRequest::Copy {
                    block: d.u32()?,
                    gen: d.u64()?,
                    cap: Cap::decode(&mut d)?,
                    src_addr: d.string()?,
                    src_block: d.u32()?,
                    src_gen: d.u64()?,
                    src_cap: Cap::decode(&mut d)?,
                };
                d.finish()?;
                r
            }
            op::RESIZE => {
                let r = StoreRequest::Resize { bytes: d.u64()? };
                d.finish()?;
                r
            }
            op::IDENTIFY => {
                let r = StoreRequest::Identify { nonce: d.array()? };
                d.finish()?;
                r
            }
            other => return Err(Error::protocol(format!("unknown storage op {other}"))),
        };
        Ok(req)
    }
}

/// Writes the fixed prefix of a write request; the data follows it.
pub fn encode_write_prefix(buf: &mut BytesMut, block: u32, gen: u64, offset: u32, cap: &Cap) {
    let e = &mut Enc(buf);
    e.u32(block).u64(gen).u32(offset);
    cap.encode(e);
}

/// Decodes a write request's fixed prefix (exactly [`WRITE_PREFIX_LEN`]
/// bytes): block, generation, offset and capability.
pub fn decode_write_prefix(prefix: &[u8]) -> Result<(u32, u64, u32, Cap)> {
    let mut d = Dec::new(prefix, "write prefix");
    let r = (d.u32()?, d.u64()?, d.u32()?, Cap::decode(&mut d)?);
    d.finish()?;
    Ok(r)
}

/// Longest abstract socket name a `SHM_INFO` or `LOCAL_SOCKET` reply may
/// carry (the limit of `sockaddr_un.sun_path` minus the leading NUL).
pub const MAX_SHM_NAME_LEN: usize = 107;

/// Encodes a `SHM_INFO` reply: the server's abstract socket name, empty when
/// its memory is not shared.
pub fn encode_shm_info(buf: &mut BytesMut, name: &str) {
    Enc(buf).str(name);
}

/// Decodes a `SHM_INFO` reply.
pub fn decode_shm_info(payload: &[u8]) -> Result<String> {
    let mut d = Dec::new(payload, "shared-memory info");
    let name = d.string()?;
    d.finish()?;
    check_socket_name(name, "shared-memory info")
}

/// Refuses an abstract socket name that is too long or holds a NUL.
pub(crate) fn check_socket_name(name: String, what: &str) -> Result<String> {
    if name.len() > MAX_SHM_NAME_LEN || name.contains('\0') {
        return Err(Error::protocol(format!(
            "{what}: bad socket name of {} bytes",
            name.len()
        )));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cap::Rights;
    use crate::ErrorCode;

    #[test]
    fn a_read_reply_is_its_data_and_a_status_byte_checked() {
        let ok = Bytes::from_static(b"data\x00");
        assert_eq!(&read_reply_data(ok, 3, 9, 4).unwrap()[..], b"data");
        let changed = Bytes::from_static(b"data\x01");
        let e = read_reply_data(changed, 3, 9, 4).unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale);
        assert!(
            e.message.contains("block 3") && e.message.contains("9"),
            "{e}"
        );
        let unknown = Bytes::from_static(b"data\x07");
        assert_eq!(
            read_reply_data(unknown, 3, 9, 4).unwrap_err().code,
            ErrorCode::Protocol
        );
        for wrong in [&b"data"[..], b"", b"data\x00\x00"] {
            let e = read_reply_data(Bytes::copy_from_slice(wrong), 3, 9, 4).unwrap_err();
            assert_eq!(e.code, ErrorCode::Protocol, "{wrong:?}");
        }
    }

    #[test]
    fn a_tag_check_passes_only_on_the_expected_node_id() {
        let t = TagCheck { at: 64, expect: 42 };
        t.check(42u64.to_le_bytes(), 3).unwrap();
        for found in [0u64, 41, 42 << 8] {
            let e = t.check(found.to_le_bytes(), 3).unwrap_err();
            assert_eq!(e.code, ErrorCode::Stale);
            assert!(e.message.contains("node 42"), "{e}");
        }
    }

    /// Every request fits its kind's limit on a storage server, also at
    /// its largest (a write of a whole block, the most claims, a long
    /// address), and a write of more than a block does not.
    #[test]
    fn every_request_at_its_largest_fits_its_kinds_limit() {
        let cap = Cap::mint(&[9; 32], 1, 2, 0, 100, Rights::MANAGE, u64::MAX);
        for block_size in [4096u32, 1 << 20, crate::MAX_BLOCK_SIZE] {
            let data = vec![7u8; block_size as usize];
            let claim = Claim {
                block: u32::MAX,
                gen: u64::MAX,
                clear_tag_at: Some(7),
                release: true,
                scrub: true,
                cap,
            };
            for r in [
                StoreRequest::Read {
                    block: u32::MAX,
                    gen: u64::MAX,
                    offset: u32::MAX,
                    len: u32::MAX,
                    tag: Some(TagCheck { at: 3, expect: 77 }),
                    cap,
                },
                StoreRequest::Write {
                    block: 1,
                    gen: 2,
                    offset: 0,
                    cap,
                    data: &data,
                },
                StoreRequest::Ping,
                StoreRequest::ShmInfo,
                StoreRequest::Resize { bytes: u64::MAX },
                StoreRequest::Identify { nonce: [0xFF; 32] },
                StoreRequest::Claim {
                    claims: vec![claim; MAX_CLAIM_BATCH],
                },
                StoreRequest::Copy {
                    block: 1,
                    gen: 2,
                    cap,
                    src_addr: "a".repeat(255),
                    src_block: 3,
                    src_gen: 4,
                    src_cap: cap,
                },
            ] {
                let mut b = BytesMut::new();
                r.encode(&mut b);
                let limit = max_request_len(r.op(), block_size);
                assert!(b.len() <= limit, "{} bytes, limit {limit}", b.len());
                assert!(limit <= crate::MAX_PAYLOAD_LEN);
            }
            let over = WRITE_PREFIX_LEN + block_size as usize + 1;
            assert!(over > max_request_len(op::WRITE, block_size));
        }
    }

    #[test]
    fn identify_replies_round_trip_and_are_checked() {
        let id = Identity {
            identity: "abc".into(),
            incarnation: 9,
            proof: crate::cap::identify_proof(&[1; 32], &[2; 32], "abc", 9),
        };
        let mut b = BytesMut::new();
        id.encode(&mut b);
        assert_eq!(Identity::decode(&b).unwrap(), id);
        assert!(Identity::decode(&b[..b.len() - 1]).is_err());
        b.extend_from_slice(&[0]);
        assert!(Identity::decode(&b).is_err());
    }

    #[test]
    fn round_trip() {
        let cap = || Cap::mint(&[9; 32], 1, 2, 0, 100, Rights::WRITE, 1);
        let data = [1u8, 2, 3];
        for r in [
            StoreRequest::Read {
                block: 1,
                gen: 2,
                offset: 3,
                len: 4,
                tag: None,
                cap: cap(),
            },
            StoreRequest::Read {
                block: 1,
                gen: 2,
                offset: 11,
                len: 4,
                tag: Some(TagCheck { at: 3, expect: 77 }),
                cap: cap(),
            },
            StoreRequest::Write {
                block: 1,
                gen: 2,
                offset: 3,
                cap: cap(),
                data: &data,
            },
            StoreRequest::Write {
                block: 1,
                gen: 2,
                offset: 3,
                cap: cap(),
                data: &[],
            },
            StoreRequest::Ping,
            StoreRequest::Resize { bytes: 64 << 20 },
            StoreRequest::Identify { nonce: [7; 32] },
            StoreRequest::ShmInfo,
            StoreRequest::Claim { claims: vec![] },
            StoreRequest::Claim {
                claims: vec![
                    Claim {
                        block: 1,
                        gen: 2,
                        clear_tag_at: None,
                        release: true,
                        scrub: false,
                        cap: cap(),
                    },
                    Claim {
                        block: u32::MAX,
                        gen: u64::MAX,
                        clear_tag_at: Some(7),
                        release: false,
                        scrub: true,
                        cap: Cap::default(),
                    },
                ],
            },
            StoreRequest::Copy {
                block: 1,
                gen: 2,
                cap: cap(),
                src_addr: "127.0.0.1:7".into(),
                src_block: 3,
                src_gen: 4,
                src_cap: Cap::default(),
            },
        ] {
            let mut b = BytesMut::new();
            r.encode(&mut b);
            assert_eq!(StoreRequest::decode(r.op(), &b).unwrap(), r);
        }
        assert!(StoreRequest::decode(op::READ, &[0; 20]).is_err());
        assert!(StoreRequest::decode(op::READ, &[0; 22]).is_err());
        let mut bad_flag = vec![0; 21];
        bad_flag[20] = 2;
        assert!(StoreRequest::decode(op::READ, &bad_flag).is_err());
        assert!(StoreRequest::decode(op::WRITE, &[0; 15]).is_err());
        assert!(StoreRequest::decode(42, &[]).is_err());
        let mut too_many = BytesMut::new();
        StoreRequest::Claim {
            claims: vec![
                Claim {
                    block: 0,
                    gen: 1,
                    clear_tag_at: None,
                    release: false,
                    scrub: false,
                    cap: Cap::default(),
                };
                MAX_CLAIM_BATCH + 1
            ],
        }
        .encode(&mut too_many);
        assert!(StoreRequest::decode(op::CLAIM, &too_many).is_err());
        assert!(StoreRequest::decode(op::SHM_INFO, &[0]).is_err());
    }

    #[test]
    fn shm_info_round_trip_and_truncation() {
        for name in ["", "nodekernel-store-0123456789abcdef"] {
            let mut b = BytesMut::new();
            encode_shm_info(&mut b, name);
            assert_eq!(decode_shm_info(&b).unwrap(), name);
            for cut in 0..b.len() {
                let e = decode_shm_info(&b[..cut]).unwrap_err();
                assert_eq!(e.code, crate::ErrorCode::Protocol, "cut at {cut}");
            }
            let mut long = b.to_vec();
            long.push(0);
            assert!(decode_shm_info(&long).is_err(), "trailing bytes");
        }
        let mut b = BytesMut::new();
        encode_shm_info(&mut b, &"x".repeat(MAX_SHM_NAME_LEN + 1));
        assert!(decode_shm_info(&b).is_err(), "too long for a socket name");
        let mut b = BytesMut::new();
        encode_shm_info(&mut b, "a\0b");
        assert!(decode_shm_info(&b).is_err(), "NUL inside");
        let mut b = BytesMut::new();
        Enc(&mut b).bytes(&[0xFF, 0xFE]);
        assert!(decode_shm_info(&b).is_err(), "not UTF-8");
        // A length prefix larger than the payload allocates nothing.
        assert!(decode_shm_info(&u32::MAX.to_le_bytes()).is_err());
    }
}

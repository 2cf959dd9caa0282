//! Frame layout shared by requests and replies on every connection.
//!
//! ```text
//! +---------+---------+---------+----------------+
//! | len u32 | id u64  | kind u16| payload ...    |
//! +---------+---------+---------+----------------+
//! ```
//! `len` counts the bytes after itself (`id + kind + payload`), little-endian.
//! In a request `kind` is the operation code; in a reply it is `0` for success
//! or an [`ErrorCode`](crate::ErrorCode), in which case the payload is the
//! UTF-8 error message. Replies carry the id of their request, so many
//! requests can be in flight on one connection and complete in any order.

use crate::error::{Error, Result};
use bytes::{BufMut, BytesMut};

/// Bytes in the fixed header (`len + id + kind`).
pub const HEADER_LEN: usize = 14;
/// Largest payload accepted: one maximum-size block plus room for headers.
pub const MAX_PAYLOAD_LEN: usize = crate::MAX_BLOCK_SIZE as usize + 64 * 1024;
/// Largest value of the `len` field.
pub const MAX_FRAME_LEN: usize = MAX_PAYLOAD_LEN + HEADER_LEN - 4;
/// Reply status for success.
pub const STATUS_OK: u16 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub id: u64,
    pub kind: u16,
    /// Payload length in bytes.
    pub payload_len: usize,
}

impl FrameHeader {
    /// Parses and validates a header. Rejects frames whose declared length is
    /// too small to hold the header or larger than [`MAX_FRAME_LEN`], before
    /// any payload memory is allocated.
    pub fn parse(h: &[u8; HEADER_LEN]) -> Result<FrameHeader> {
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len < HEADER_LEN - 4 {
            return Err(Error::protocol(format!(
                "frame length {len} is shorter than its header"
            )));
        }
        if len > MAX_FRAME_LEN {
            return Err(Error::protocol(format!(
                "frame length {len} exceeds the maximum of {MAX_FRAME_LEN} bytes"
            )));
        }
        let id = u64::from_le_bytes(h[4..12].try_into().expect("8 bytes"));
        let kind = u16::from_le_bytes([h[12], h[13]]);
        Ok(FrameHeader {
            id,
            kind,
            payload_len: len - (HEADER_LEN - 4),
        })
    }

    /// Writes a header for a payload of `payload_len` bytes.
    pub fn put(buf: &mut BytesMut, id: u64, kind: u16, payload_len: usize) {
        debug_assert!(payload_len <= MAX_PAYLOAD_LEN);
        buf.put_u32_le((payload_len + HEADER_LEN - 4) as u32);
        buf.put_u64_le(id);
        buf.put_u16_le(kind);
    }

    /// The header of a frame with a payload of `payload_len` bytes, as an
    /// array (for callers that send the payload from elsewhere).
    pub fn encode(id: u64, kind: u16, payload_len: usize) -> [u8; HEADER_LEN] {
        debug_assert!(payload_len <= MAX_PAYLOAD_LEN);
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&((payload_len + HEADER_LEN - 4) as u32).to_le_bytes());
        h[4..12].copy_from_slice(&id.to_le_bytes());
        h[12..].copy_from_slice(&kind.to_le_bytes());
        h
    }

    /// Starts a frame whose payload will be appended afterwards; finish it
    /// with [`FrameHeader::seal`].
    pub fn begin(buf: &mut BytesMut, id: u64, kind: u16) -> usize {
        let start = buf.len();
        FrameHeader::put(buf, id, kind, 0);
        start
    }

    /// Fixes up the length field of a frame started with [`FrameHeader::begin`].
    pub fn seal(buf: &mut BytesMut, start: usize) -> Result<()> {
        FrameHeader::seal_with(buf, start, 0)
    }

    /// Like [`FrameHeader::seal`], for a frame whose payload goes on for
    /// `more` bytes sent from elsewhere.
    pub fn seal_with(buf: &mut BytesMut, start: usize, more: usize) -> Result<()> {
        let payload = buf.len() - start - HEADER_LEN + more;
        if payload > MAX_PAYLOAD_LEN {
            return Err(Error::invalid_argument(format!(
                "message of {payload} bytes exceeds the maximum frame payload of {MAX_PAYLOAD_LEN}"
            )));
        }
        let len = (payload + HEADER_LEN - 4) as u32;
        buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let mut b = BytesMut::new();
        FrameHeader::put(&mut b, 42, 7, 100);
        assert_eq!(&b[..], &FrameHeader::encode(42, 7, 100));
        let h = FrameHeader::parse(b[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(
            h,
            FrameHeader {
                id: 42,
                kind: 7,
                payload_len: 100
            }
        );
    }

    #[test]
    fn oversized_and_undersized_frames_rejected() {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            FrameHeader::parse(&h).is_err(),
            "a frame claiming 4 GiB is refused"
        );
        h[..4].copy_from_slice(&3u32.to_le_bytes());
        assert!(FrameHeader::parse(&h).is_err());
        h[..4].copy_from_slice(&((MAX_FRAME_LEN + 1) as u32).to_le_bytes());
        assert!(FrameHeader::parse(&h).is_err());
        h[..4].copy_from_slice(&(MAX_FRAME_LEN as u32).to_le_bytes());
        assert!(FrameHeader::parse(&h).is_ok());
    }

    #[test]
    fn begin_and_seal() {
        let mut b = BytesMut::new();
        let s = FrameHeader::begin(&mut b, 1, 2);
        b.extend_from_slice(b"hello");
        FrameHeader::seal(&mut b, s).unwrap();
        let h = FrameHeader::parse(b[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.payload_len, 5);
    }
}

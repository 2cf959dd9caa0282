//! Data-plane messages: byte-granular block reads and writes.
//!
//! A read reply's payload is the raw bytes; a write request's payload is a
//! fixed prefix followed by the raw bytes (their length is implied by the
//! frame), so data is never copied into an intermediate encoding.

use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use bytes::BytesMut;

pub mod op {
    pub const READ: u16 = 1;
    pub const WRITE: u16 = 2;
    pub const PING: u16 = 3;
}

/// Bytes of the fixed part of a write request (block, gen, offset).
pub const WRITE_PREFIX_LEN: usize = 4 + 8 + 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreRequest<'a> {
    Read {
        block: u32,
        gen: u64,
        offset: u32,
        len: u32,
    },
    Write {
        block: u32,
        gen: u64,
        offset: u32,
        data: &'a [u8],
    },
    Ping,
}

impl<'a> StoreRequest<'a> {
    pub fn op(&self) -> u16 {
        match self {
            StoreRequest::Read { .. } => op::READ,
            StoreRequest::Write { .. } => op::WRITE,
            StoreRequest::Ping => op::PING,
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
            } => {
                Enc(buf).u32(*block).u64(*gen).u32(*offset).u32(*len);
            }
            StoreRequest::Write {
                block,
                gen,
                offset,
                data,
            } => {
                encode_write_prefix(buf, *block, *gen, *offset);
                buf.extend_from_slice(data);
            }
            StoreRequest::Ping => {}
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
                };
                d.finish()?;
                r
            }
            op::WRITE => {
                let block = d.u32()?;
                let gen = d.u64()?;
                let offset = d.u32()?;
                let n = d.remaining();
                StoreRequest::Write {
                    block,
                    gen,
                    offset,
                    data: d.take(n)?,
                }
            }
            op::PING => {
                d.finish()?;
                StoreRequest::Ping
            }
            other => return Err(Error::protocol(format!("unknown storage op {other}"))),
        };
        Ok(req)
    }
}

/// Writes the fixed prefix of a write request; the data follows it.
pub fn encode_write_prefix(buf: &mut BytesMut, block: u32, gen: u64, offset: u32) {
    Enc(buf).u32(block).u64(gen).u32(offset);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let data = [1u8, 2, 3];
        for r in [
            StoreRequest::Read {
                block: 1,
                gen: 2,
                offset: 3,
                len: 4,
            },
            StoreRequest::Write {
                block: 1,
                gen: 2,
                offset: 3,
                data: &data,
            },
            StoreRequest::Write {
                block: 1,
                gen: 2,
                offset: 3,
                data: &[],
            },
            StoreRequest::Ping,
        ] {
            let mut b = BytesMut::new();
            r.encode(&mut b);
            assert_eq!(StoreRequest::decode(r.op(), &b).unwrap(), r);
        }
        assert!(StoreRequest::decode(op::READ, &[0; 19]).is_err());
        assert!(StoreRequest::decode(op::READ, &[0; 21]).is_err());
        assert!(StoreRequest::decode(op::WRITE, &[0; 15]).is_err());
        assert!(StoreRequest::decode(42, &[]).is_err());
    }
}

//! Bounded little-endian encoder/decoder used by every message.
//!
//! [`Dec`] never allocates more than the bytes it has been given: every
//! length prefix is checked against the remaining input first.

use crate::error::{Error, Result};
use bytes::{BufMut, BytesMut};

/// Appends primitive values to a buffer.
pub struct Enc<'a>(pub &'a mut BytesMut);

impl Enc<'_> {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.put_u8(v);
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.put_u16_le(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.put_u32_le(v);
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.put_u64_le(v);
        self
    }
    /// Bytes of a length both ends know (no prefix).
    pub fn fixed(&mut self, v: &[u8]) -> &mut Self {
        self.0.put_slice(v);
        self
    }
    /// Length-prefixed (u32) byte string.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.put_slice(v);
        self
    }
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
}

/// Reads primitive values from a byte slice, failing cleanly on short input.
pub struct Dec<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Dec<'a> {
    /// `what` names the message being decoded, for error messages.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Dec { buf, what }
    }

    fn short(&self, need: usize) -> Error {
        Error::protocol(format!(
            "truncated {}: needed {need} more bytes, {} left",
            self.what,
            self.buf.len()
        ))
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(self.short(n));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// `N` bytes of a length both ends know.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    pub fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Error::protocol(format!("{}: bad bool {v}", self.what))),
        }
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A u32-length-prefixed byte string, borrowed from the input.
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub fn string(&mut self) -> Result<String> {
        let b = self.bytes()?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| Error::protocol(format!("{}: string is not UTF-8", self.what)))
    }
    /// A u32 element count, checked so that `count * min_elem_size` fits in
    /// the remaining input before the caller allocates for it.
    pub fn count(&mut self, min_elem_size: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_elem_size.max(1)) > self.buf.len() {
            return Err(Error::protocol(format!(
                "{}: count {n} exceeds the {} bytes left",
                self.what,
                self.buf.len()
            )));
        }
        Ok(n)
    }
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
    /// Fails if bytes are left over: a message must be consumed exactly.
    pub fn finish(self) -> Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(Error::protocol(format!(
                "{}: {} trailing bytes",
                self.what,
                self.buf.len()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut b = BytesMut::new();
        Enc(&mut b)
            .u8(7)
            .u16(300)
            .u32(70000)
            .u64(1 << 40)
            .str("héllo")
            .bool(true);
        let mut d = Dec::new(&b, "test");
        assert_eq!(d.u8().unwrap(), 7);
        assert_eq!(d.u16().unwrap(), 300);
        assert_eq!(d.u32().unwrap(), 70000);
        assert_eq!(d.u64().unwrap(), 1 << 40);
        assert_eq!(d.string().unwrap(), "héllo");
        assert!(d.bool().unwrap());
        d.finish().unwrap();

        for cut in 0..b.len() {
            let mut d = Dec::new(&b[..cut], "test");
            let r = (|| -> Result<()> {
                d.u8()?;
                d.u16()?;
                d.u32()?;
                d.u64()?;
                d.string()?;
                d.bool()?;
                Ok(())
            })();
            assert!(r.is_err(), "cut at {cut} must fail");
        }
    }

    #[test]
    fn huge_counts_are_rejected_before_allocation() {
        let mut b = BytesMut::new();
        Enc(&mut b).u32(u32::MAX);
        assert!(Dec::new(&b, "t").count(1).is_err());
        assert!(Dec::new(&b, "t").bytes().is_err());
    }
}

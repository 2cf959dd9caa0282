//! Storage media: a flat byte range with positional reads and writes.
//!
//! A [`Medium`] knows nothing about blocks or generations;
//! [`BlockStore`](crate::BlockStore) does all request checking and only then
//! calls it.
//! Media still bounds-check every access against their size (returning
//! `InvalidInput`), so a bug above can never reach memory or file bytes
//! outside the exported region.
//!
//! Memory media ([`DramMedium`]) are accessed synchronously: an access is a
//! memcpy, done right in the connection task. Their generations live in the
//! shared region next to the data ([`Medium::shared_region`]). Media whose I/O can block
//! ([`FileMedium`](crate::FileMedium)) also offer an [`AsyncMedium`] interface through
//! [`Medium::as_async`], which the block store prefers; their synchronous
//! methods block the calling thread and exist for tools and tests.

use bytes::BytesMut;
use nodekernel_shm::ServerRegion;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use crate::StoreError;

/// Something that must stay alive until the kernel has finished with a
/// request, even if the future that started it is dropped: the block's
/// generation guard and, for read-modify-writes, the sector locks.
pub type Keepalive = Arc<dyn std::any::Any + Send + Sync>;

/// A byte-addressed storage medium of fixed size.
///
/// Implementations must tolerate concurrent calls from many connection
/// tasks. Callers guarantee that concurrent `write`s never target the same
/// bytes (per-node single-writer leases plus the generation lock of
/// [`BlockStore`](crate::BlockStore)); overlapping reads and writes may
/// happen and may observe a mix of old and new bytes, which the block layer
/// turns into `Stale` errors where it matters. Concurrent writes of
/// *different* bytes must not disturb each other, however close they are
/// (the file medium's read-modify-write of shared sectors is serialised
/// inside it).
pub trait Medium: Send + Sync {
    /// Appends `len` bytes starting at `off` to `out`. On error nothing is
    /// appended.
    fn read_into(&self, off: u64, len: usize, out: &mut BytesMut) -> io::Result<()>;
    /// Writes `data` at `off`.
    fn write(&self, off: u64, data: &[u8]) -> io::Result<()>;
    /// `"dram"` or `"file"`, as sent to metadata servers.
    fn kind(&self) -> &'static str;
    /// Size of the medium in bytes.
    fn size(&self) -> u64;
    /// How the medium moves bytes, for logs and status: `"memory"` for
    /// DRAM, an [`IoMode`](crate::IoMode) string for files.
    fn io_mode(&self) -> &'static str {
        "memory"
    }
    /// Bytes of memory a read of `len` bytes at `off` holds besides the
    /// bytes it appends, while it runs (a file's aligned read buffer); 0
    /// by default.
    fn read_buffer_len(&self, _off: u64, _len: usize) -> usize {
        0
    }
    /// The asynchronous interface of a medium whose I/O may block. When it
    /// is `Some`, the block store uses it instead of the synchronous
    /// methods, so connection tasks never block on the medium.
    fn as_async(&self) -> Option<&dyn AsyncMedium> {
        None
    }
    /// The shared region of a DRAM medium, whose generations live in shared
    /// memory; `None` for media whose generations the block store keeps.
    fn shared_region(&self) -> Option<&Arc<ServerRegion>> {
        None
    }
    /// Writes everything written so far back to the device and waits for
    /// it (`fsync`), for a persistent server's clean stop. Nothing to do
    /// by default.
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    /// Gives the memory or disk space of `len` bytes at `off` back (the
    /// block left the exported capacity; its bytes are not needed): they
    /// read as zeros afterwards. Nothing to do by default.
    fn release(&self, _off: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

/// Punches a hole of `len` bytes at `at` into `file` (its size stays).
pub(crate) fn punch_hole(file: &File, at: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we own; no memory is passed.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            at as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A boxed I/O future borrowing the medium and the caller's buffers.
pub type IoFuture<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>;

/// Asynchronous access to a [`Medium`] whose I/O may block.
///
/// Dropping a returned future before it completes is allowed: the medium
/// keeps its own buffers, and `keep`, until the kernel is done with every
/// I/O it started. A dropped read appends nothing; a dropped write may or
/// may not have reached the medium.
pub trait AsyncMedium: Send + Sync {
    /// Appends `len` bytes starting at `off` to `out`; on error nothing is
    /// appended. `keep` stays alive until no I/O of this call is in flight.
    fn read_into_async<'a>(
        &'a self,
        off: u64,
        len: usize,
        out: &'a mut BytesMut,
        keep: Keepalive,
    ) -> IoFuture<'a>;
    /// Writes `data` at `off`. `keep` stays alive until no I/O of this call
    /// is in flight.
    fn write_async<'a>(&'a self, off: u64, data: &'a [u8], keep: Keepalive) -> IoFuture<'a>;
}

/// Checks `off..off+len` against `size`, returning the range start as usize.
pub(crate) fn check_range(off: u64, len: usize, size: u64) -> io::Result<usize> {
    let end = u64::try_from(len).ok().and_then(|l| off.checked_add(l));
    match end {
        Some(end) if end <= size => usize::try_from(off).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "offset exceeds the address space",
            )
        }),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("access of {len} bytes at offset {off} is outside the medium of {size} bytes"),
        )),
    }
}

/// DRAM medium: the data part of a shared [`ServerRegion`], a sealed memfd mapped
/// shared into this process that also holds the per-block generations and
/// the writer slots.
///
/// The block store runs the generation protocol of [`nodekernel_shm`] on the
/// region directly (see [`BlockStore`](crate::BlockStore)); the
/// [`Medium`] methods below are raw byte access without generations, for
/// tools and tests. The memfd can be handed to co-located clients, which
/// map it and run the same protocol.
pub struct DramMedium {
    region: Arc<ServerRegion>,
    size: u64,
}

impl DramMedium {
    /// Creates a zero-filled region of `num_blocks` blocks of `block_size`
    /// bytes (every block at generation 0) and maps it.
    pub fn new(block_size: u32, num_blocks: u32) -> Result<DramMedium, StoreError> {
        let path = PathBuf::from("memfd:nodekernel-dram");
        if num_blocks == 0 {
            return Err(StoreError::config(
                "capacity",
                "DRAM medium must not be empty",
            ));
        }
        let region = ServerRegion::create(block_size, num_blocks)
            .map_err(|e| StoreError::io("create", &path, e))?;
        let size = region.layout().data_len();
        Ok(DramMedium {
            region: Arc::new(region),
            size,
        })
    }

    /// A region in the regular file at `path` (a persistent server's
    /// DRAM tier, see [`ServerRegion::open_file`]): with `keep`, the blocks and
    /// generations it holds are kept (the file must hold a region of this
    /// layout); without, it is created or emptied.
    pub fn open_file(
        path: &Path,
        block_size: u32,
        num_blocks: u32,
        keep: bool,
    ) -> Result<DramMedium, StoreError> {
        if num_blocks == 0 {
            return Err(StoreError::config(
                "capacity",
                "DRAM medium must not be empty",
            ));
        }
        let region = ServerRegion::open_file(path, block_size, num_blocks, keep)
            .map_err(|e| StoreError::io(if keep { "reuse" } else { "create" }, path, e))?;
        let size = region.layout().data_len();
        Ok(DramMedium {
            region: Arc::new(region),
            size,
        })
    }

    /// The shared region (control words and data).
    pub fn region(&self) -> &Arc<ServerRegion> {
        &self.region
    }

    /// The memfd backing the medium (for passing to co-located clients).
    pub fn file(&self) -> &File {
        self.region.file()
    }

    /// The raw descriptor of the memfd.
    pub fn raw_fd(&self) -> i32 {
        self.region.file().as_raw_fd()
    }
}

impl Medium for DramMedium {
    fn release(&self, off: u64, len: u64) -> io::Result<()> {
        check_range(off, len as usize, self.size)?;
        // Punched into the memfd (or file) itself: the pages leave every
        // mapping, the server's and co-located clients'.
        let data = self.region.layout().data_offset;
        punch_hole(self.region.file(), data + off, len)
    }

    fn read_into(&self, off: u64, len: usize, out: &mut BytesMut) -> io::Result<()> {
        let start = check_range(off, len, self.size)?;
        out.reserve(len);
        let dst = out.spare_capacity_mut();
        // SAFETY: `start..start+len` lies inside the mapping (checked above);
        // `dst` has room for at least `len` bytes (reserved above) and is a
        // separate heap buffer, so the ranges do not overlap. After the copy
        // those `len` bytes are initialised, so extending the length is sound.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.region.data_ptr().add(start),
                dst.as_mut_ptr().cast::<u8>(),
                len,
            );
            out.set_len(out.len() + len);
        }
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let start = check_range(off, data.len(), self.size)?;
        // SAFETY: the destination range lies inside the data region
        // (checked above) and `data` is a separate buffer (a request
        // payload), so the ranges do not overlap. Concurrent writers never
        // target the same bytes: a block is written only by the holder of
        // its node's write lease under the current generation, and
        // generation changes wait for in-flight copies (see
        // `nodekernel_shm`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.region.data_ptr().add(start),
                data.len(),
            );
        }
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "dram"
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn shared_region(&self) -> Option<&Arc<ServerRegion>> {
        Some(&self.region)
    }

    fn sync(&self) -> io::Result<()> {
        self.region.sync()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Round trips and the bounds of every access, on any medium.
    pub(crate) fn exercise(m: &dyn Medium) {
        let size = m.size();
        m.write(0, b"abc").unwrap();
        m.write(size - 3, b"xyz").unwrap();
        let mut out = BytesMut::from(&b"pre"[..]);
        m.read_into(0, 3, &mut out).unwrap();
        m.read_into(size - 3, 3, &mut out).unwrap();
        assert_eq!(&out[..], b"preabcxyz", "reads append after existing bytes");
        for (off, len) in [
            (size - 2, 3usize),
            (size, 1),
            (u64::MAX, 1),
            (1, usize::MAX),
        ] {
            assert_eq!(
                m.read_into(off, len, &mut out).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
            assert_eq!(out.len(), 9, "a failed read appends nothing");
        }
        assert!(m.write(size - 2, b"abc").is_err());
        assert!(m.write(u64::MAX, b"a").is_err());
        // Zero-length accesses at the very end are fine.
        m.write(size, b"").unwrap();
        m.read_into(size, 0, &mut out).unwrap();
    }

    #[test]
    fn dram_medium_bounds_and_round_trip() {
        let m = DramMedium::new(4096, 16).unwrap();
        assert_eq!(m.kind(), "dram");
        assert_eq!(m.size(), 64 << 10);
        assert!(m.raw_fd() >= 0);
        assert_eq!(
            m.file().metadata().unwrap().len(),
            m.region().layout().total_len,
            "control words and data in one memfd"
        );
        exercise(&m);
    }

    /// A released block's memory goes back to the kernel (the memfd holds
    /// fewer pages) and reads as zeros; its neighbours keep their bytes.
    #[test]
    fn a_released_dram_block_gives_its_memory_back() {
        use std::os::unix::fs::MetadataExt;
        let bs = 1 << 20;
        let m = DramMedium::new(bs, 4).unwrap();
        let held = |m: &DramMedium| m.file().metadata().unwrap().blocks() * 512;
        let data = vec![7u8; bs as usize];
        for b in 0..3 {
            m.write(b * u64::from(bs), &data).unwrap();
        }
        let before = held(&m);
        assert!(before >= 3 * u64::from(bs), "{before}");
        m.release(u64::from(bs), u64::from(bs)).unwrap();
        let after = held(&m);
        assert!(before - after >= u64::from(bs), "{before} -> {after}");
        let mut out = BytesMut::new();
        m.read_into(u64::from(bs), bs as usize, &mut out).unwrap();
        assert!(out.iter().all(|b| *b == 0), "released bytes read as zeros");
        out.clear();
        m.read_into(0, bs as usize, &mut out).unwrap();
        assert!(out.iter().all(|b| *b == 7), "the block before is untouched");
        assert!(m.release(4 * u64::from(bs), 1).is_err(), "past the end");
    }
}

//! Storage media: a flat byte range with positional reads and writes.
//!
//! A [`Medium`] knows nothing about blocks or generations;
//! [`BlockStore`](crate::BlockStore) does all request checking and only then
//! calls it.
//! Media still bounds-check every access against their size (returning
//! `InvalidInput`), so a bug above can never reach memory or file bytes
//! outside the exported region.

use bytes::BytesMut;
use memmap2::MmapMut;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::StoreError;

/// A byte-addressed storage medium of fixed size.
///
/// Implementations must tolerate concurrent calls from many connection
/// tasks. Callers guarantee that concurrent `write`s never target the same
/// bytes (per-node single-writer leases plus the generation lock of
/// [`BlockStore`](crate::BlockStore)); overlapping reads and writes may
/// happen and may observe a mix of old and new bytes, which the block layer
/// turns into `Stale` errors where it matters.
pub trait Medium: Send + Sync {
    /// Appends `len` bytes starting at `off` to `out`.
    fn read_into(&self, off: u64, len: usize, out: &mut BytesMut) -> io::Result<()>;
    /// Writes `data` at `off`.
    fn write(&self, off: u64, data: &[u8]) -> io::Result<()>;
    /// `"dram"` or `"file"`, as sent to metadata servers.
    fn kind(&self) -> &'static str;
    /// Size of the medium in bytes.
    fn size(&self) -> u64;
}

/// Checks `off..off+len` against `size`, returning the range start as usize.
fn check_range(off: u64, len: usize, size: u64) -> io::Result<usize> {
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

const MEMFD_NAME: &CStr = c"nodekernel-dram";

/// DRAM medium: an anonymous `memfd` mapped shared into this process.
///
/// The memfd's [`File`] is kept so that it can later be handed to co-located
/// clients (over a Unix socket) for zero-copy access.
pub struct DramMedium {
    file: File,
    map: MmapMut,
    /// Base of `map`, taken once with exclusive access at construction. All
    /// accesses go through this raw pointer so that no Rust reference to the
    /// shared bytes is ever formed while other tasks may write them.
    base: *mut u8,
    size: u64,
}

// SAFETY: the mapping lives as long as `self` (it is only unmapped when
// `map` drops) and every access through `base` is bounds-checked against
// `size` first. Concurrent accesses are raw `copy_nonoverlapping` calls; the
// callers' single-writer discipline (see `Medium`) means no two writes ever
// target the same bytes, and readers that may overlap a write are detected by
// the block layer's generation checks.
unsafe impl Send for DramMedium {}
// SAFETY: see `Send` above; shared `&self` access is exactly the concurrent
// use argued there.
unsafe impl Sync for DramMedium {}

impl DramMedium {
    /// Creates a zero-filled memfd of `size` bytes and maps it.
    pub fn new(size: u64) -> Result<DramMedium, StoreError> {
        let path = PathBuf::from(format!("memfd:{}", MEMFD_NAME.to_string_lossy()));
        if size == 0 {
            return Err(StoreError::config(
                "capacity",
                "DRAM medium must not be empty",
            ));
        }
        // SAFETY: MEMFD_NAME is a valid NUL-terminated string; the returned
        // descriptor is checked and then owned by exactly one `File`.
        let fd = unsafe { libc::memfd_create(MEMFD_NAME.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(StoreError::io("create", path, io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)
            .map_err(|e| StoreError::io("size", &path, e))?;
        // SAFETY: the memfd is private to this process until explicitly
        // shared, and it is never truncated while mapped (its size is fixed
        // here), so the mapping cannot become invalid underneath us.
        let mut map =
            unsafe { MmapMut::map_mut(&file) }.map_err(|e| StoreError::io("map", &path, e))?;
        let base = map.as_mut_ptr();
        Ok(DramMedium {
            file,
            map,
            base,
            size,
        })
    }

    /// The memfd backing the medium (for passing to co-located clients).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The raw descriptor of the memfd.
    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}

impl Medium for DramMedium {
    fn read_into(&self, off: u64, len: usize, out: &mut BytesMut) -> io::Result<()> {
        let start = check_range(off, len, self.size)?;
        debug_assert_eq!(self.map.len() as u64, self.size);
        out.reserve(len);
        let dst = out.spare_capacity_mut();
        // SAFETY: `start..start+len` lies inside the mapping (checked above);
        // `dst` has room for at least `len` bytes (reserved above) and is a
        // separate heap buffer, so the ranges do not overlap. After the copy
        // those `len` bytes are initialised, so extending the length is sound.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(start), dst.as_mut_ptr().cast::<u8>(), len);
            out.set_len(out.len() + len);
        }
        Ok(())
    }

    fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let start = check_range(off, data.len(), self.size)?;
        // SAFETY: the destination range lies inside the mapping (checked
        // above) and `data` is a separate buffer (a request payload), so the
        // ranges do not overlap. Concurrent writers never target the same
        // bytes: a block is written only by the holder of its node's write
        // lease under the current generation, and generation changes wait for
        // in-flight copies (see `BlockStore`).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(start), data.len());
        }
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "dram"
    }

    fn size(&self) -> u64 {
        self.size
    }
}

/// File medium: a preallocated file accessed with positional I/O.
///
/// A later version replaces this with io_uring and `O_DIRECT`; the
/// [`Medium`] trait is the seam.
pub struct FileMedium {
    file: File,
    path: PathBuf,
    size: u64,
}

impl FileMedium {
    /// Creates (or truncates) the file at `path`, creating parent
    /// directories, and preallocates `size` bytes. Previous contents are
    /// discarded so that bytes of an earlier run can never be served.
    pub fn create(path: &Path, size: u64) -> Result<FileMedium, StoreError> {
        if size == 0 {
            return Err(StoreError::config(
                "capacity",
                "file medium must not be empty",
            ));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create directory", dir, e))?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| StoreError::io("open", path, e))?;
        file.set_len(size)
            .map_err(|e| StoreError::io("size", path, e))?;
        let len = libc::off_t::try_from(size).map_err(|_| {
            StoreError::config(
                "capacity",
                format!("{size} bytes exceeds the largest file offset"),
            )
        })?;
        // SAFETY: plain system call on a descriptor we own.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        match rc {
            0 => {}
            // The file system cannot preallocate: the sparse `set_len` file
            // has to do.
            libc::EOPNOTSUPP | libc::EINVAL => {
                tracing::debug!(
                    "{}: posix_fallocate unsupported, using a sparse file",
                    path.display()
                );
            }
            err => {
                return Err(StoreError::io(
                    "preallocate",
                    path,
                    io::Error::from_raw_os_error(err),
                ))
            }
        }
        Ok(FileMedium {
            file,
            path: path.to_path_buf(),
            size,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Medium for FileMedium {
    fn read_into(&self, off: u64, len: usize, out: &mut BytesMut) -> io::Result<()> {
        check_range(off, len, self.size)?;
        let start = out.len();
        out.resize(start + len, 0);
        let result = self.file.read_exact_at(&mut out[start..], off);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        check_range(off, data.len(), self.size)?;
        self.file.write_all_at(data, off)
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    fn size(&self) -> u64 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(m: &dyn Medium) {
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
        let m = DramMedium::new(64 << 10).unwrap();
        assert_eq!(m.kind(), "dram");
        assert!(m.raw_fd() >= 0);
        assert_eq!(m.file().metadata().unwrap().len(), 64 << 10);
        exercise(&m);
    }

    #[test]
    fn file_medium_bounds_round_trip_and_preallocation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/blocks.dat");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, vec![0xEEu8; 200 << 10]).unwrap();
        let m = FileMedium::create(&path, 64 << 10).unwrap();
        assert_eq!(m.kind(), "file");
        assert_eq!(m.path(), path);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 10);
        let mut out = BytesMut::new();
        m.read_into(1000, 16, &mut out).unwrap();
        assert_eq!(&out[..], &[0u8; 16], "old contents are discarded");
        exercise(&m);
    }

    #[test]
    fn file_medium_creates_parent_dirs_and_names_path_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x/y/z.dat");
        FileMedium::create(&path, 4096).unwrap();
        assert!(path.exists());
        // A regular file where a directory is needed.
        let bad = path.join("under-a-file.dat");
        let err = FileMedium::create(&bad, 4096)
            .err()
            .expect("cannot create under a file");
        assert!(err.to_string().contains(path.to_str().unwrap()), "{err}");
    }
}

//! File medium: a preallocated file with direct, aligned, asynchronous I/O.
//!
//! # I/O paths and their fallback order
//!
//! At start-up [`FileMedium::create_with`] picks the best path the machine
//! allows, logs it (`tracing::info!`) and reports it through
//! [`FileMedium::mode`] (and `StorageServer::io_mode`):
//!
//! 1. **`O_DIRECT`** (if [`FileIoConfig::direct`]): the block file is opened
//!    again with `O_DIRECT` and probed with one aligned read and write. If
//!    the file system refuses (`EINVAL` on tmpfs and some network or FUSE
//!    file systems, at open or at the first I/O), the medium uses buffered
//!    I/O through the page cache instead.
//! 2. **io_uring** (if [`FileIoConfig::io_uring`]): a ring of
//!    [`FileIoConfig::queue_depth`] entries is set up, probed for the
//!    operations we use, and proven with a NOP round trip. If that fails
//!    (`ENOSYS` on old kernels, `EPERM` under seccomp or with
//!    `kernel.io_uring_disabled`), the medium uses positional
//!    `pread`/`pwrite` on a small pool of threads
//!    (`min(queue_depth, 16)`).
//!
//! The two choices are independent, so there are four modes (see
//! [`IoMode`]); both fallbacks can be forced through [`FileIoConfig`] (the
//! tests run every mode).
//!
//! 3. **Stream reads** (if [`FileIoConfig::stream_reads`], with `O_DIRECT`):
//!    reads of [`STREAM_READ_MIN`] bytes or more go to the buffered
//!    descriptor with `RWF_DONTCACHE` (Linux 6.14+, probed at start). The
//!    kernel reads ahead in large requests, as for a plain buffered reader,
//!    and drops each page once it was read, so the file tier still does not
//!    keep a second copy of what the DRAM tier caches. `O_DIRECT` writes
//!    invalidate cached pages of the range they write, so a stream read
//!    never sees old bytes. Small reads stay `O_DIRECT`: read-ahead would
//!    only cost a point read device time. Where the probe fails, large reads
//!    use `O_DIRECT` like the rest.
//!
//! # Several I/Os in flight
//!
//! Connection tasks never block on the file. Each access becomes one or a
//! few requests (an offset, an owned buffer, a keepalive and a
//! oneshot sender) handed to the engine over a channel; the task awaits the
//! oneshot. The io_uring engine is one dedicated thread owning the ring: it
//! keeps up to `queue_depth` requests in flight, submits them in batches and
//! completes them as the kernel finishes them (see `uring.rs`). The
//! fallback engine is a pool of threads each doing one blocking `pread` or
//! `pwrite` at a time. The DRAM medium never goes through either: its
//! accesses stay synchronous memcpys.
//! Requests in flight come from concurrent connection tasks: the transport
//! (`nodekernel_rpc::serve`) answers the requests of one connection one at
//! a time, so the depth a server reaches is bounded by its clients'
//! connections.
//!
//! # Why aligned bounce buffers
//!
//! `O_DIRECT` requires the file offset, the length and the *memory address*
//! of every transfer to be aligned to the device's logical block size. We
//! use [`ALIGN`] = 4096 for all three, which covers 512-byte and 4 KiB
//! devices. Clients, however, address bytes: `read(block, off, len)` and
//! `write(block, off, bytes)` with arbitrary `off` and `len`, and request
//! payloads sit at arbitrary heap addresses. So every transfer goes through
//! an aligned buffer covering the aligned range around the request:
//!
//! * a **read** reads the covering range `[⌊off⌋, ⌈off+len⌉)` and copies
//!   the requested bytes out;
//! * a **write** whose ends are aligned copies the payload into an aligned
//!   buffer and writes it; a write with a partial first or last 4 KiB sector
//!   first reads those sectors (one read if the whole range is at most two
//!   sectors, otherwise the head and tail sectors concurrently), patches the
//!   payload in, and writes the whole covering range in one I/O
//!   (read-modify-write, "RMW"). The aligned middle is never read.
//!
//! The bounce buffer is also what makes the I/O safe to abandon: it is owned
//! by the in-flight request, not borrowed from the caller, so a connection
//! task that is dropped mid-request (server shutdown) cannot free memory the
//! kernel is still writing. The same holds for the caller's
//! [`Keepalive`] (the block's generation guard): the engine drops it only
//! after the kernel completed the I/O, so a block cannot change owners while
//! an old owner's write is still on its way to the disk.
//!
//! In buffered mode the alignment is 1 byte: the covering range is the
//! request itself and no RMW ever happens (the page cache merges partial
//! pages).
//!
//! Bounce buffers are recycled through a per-medium pool (power-of-two
//! capacities, at most 64 MiB of free buffers kept), so steady-state I/O
//! neither allocates nor zeroes memory; a
//! recycled buffer's old bytes are always overwritten (by the kernel or by
//! the patch) before anything reads them. A buffer whose request was
//! abandoned is freed by the engine after its completion instead.
//!
//! # How RMW is serialised
//!
//! Two requests writing *different* bytes of the same 4 KiB sector are
//! legal (e.g. two small appends). Each RMW would read the sector, patch its
//! own bytes and write the whole sector back, so unserialised the second
//! write-back would undo the first. Every RMW therefore holds the lock of
//! each *partially written* sector from before its read until its write has
//! completed (the guards travel in the write's keepalive). Sector locks are
//! a fixed table of 256 async mutexes indexed by a hash of the sector
//! number, taken in index order (so two RMWs never deadlock); collisions
//! only cost a little concurrency. Fully written sectors need no lock: by
//! the [`Medium`] contract no concurrent write targets the same bytes, and
//! a sector written in full by one request is all of its bytes. Reads take
//! no sector lock: an RMW writes back the bytes outside its range exactly
//! as they were.
//!
//! None of this is visible to clients; [`BlockStore`](crate::BlockStore)
//! sees a byte-addressed medium.

mod buf;
mod engine;
mod request;
mod threads;
mod uring;

pub use crate::medium::Keepalive;
pub use buf::ALIGN;

/// Drives `fut` to completion on the current thread, parking it while the
/// future waits. Used by the synchronous [`Medium`](crate::Medium) methods of
/// the file medium, whose futures only wait on `tokio::sync` primitives
/// (which need no runtime) completed by the engine's own threads.
pub(crate) use futures::executor::block_on;

use crate::config::FileIoConfig;
use crate::datadir::BlockFile;
use crate::medium::{check_range, AsyncMedium, IoFuture, Medium};
use crate::StoreError;
use buf::{AlignedBuf, BufPool};
use bytes::BytesMut;
use engine::Engine;
use request::{pio, OpKind};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Reads of this many bytes or more are *stream reads* where the medium
/// has them ([`FileMedium::stream_reads`]): a client streaming a File reads
/// whole blocks, and the kernel's read-ahead serves those from the device
/// in larger requests than one block (about 1.7x `O_DIRECT` on this
/// project's machines, `docs/benchmarks.md`). Smaller reads are point
/// reads (small values, a record), where read-ahead would only waste the
/// device's time.
pub const STREAM_READ_MIN: usize = 128 << 10;

/// Number of sector locks (a power of two).
const STRIPES: usize = 256;

/// Most threads of the pread/pwrite fallback pool.
const MAX_FALLBACK_THREADS: u32 = 16;

/// How a [`FileMedium`] moves bytes: see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// io_uring with `O_DIRECT`: the main path.
    UringDirect,
    /// io_uring through the page cache (the file system refused `O_DIRECT`).
    UringBuffered,
    /// `pread`/`pwrite` threads with `O_DIRECT` (io_uring unavailable).
    ThreadsDirect,
    /// `pread`/`pwrite` threads through the page cache.
    ThreadsBuffered,
}

impl IoMode {
    /// `"io_uring+O_DIRECT"`, `"io_uring+buffered"`, `"pread/pwrite+O_DIRECT"`
    /// or `"pread/pwrite+buffered"`.
    pub fn as_str(self) -> &'static str {
        match self {
            IoMode::UringDirect => "io_uring+O_DIRECT",
            IoMode::UringBuffered => "io_uring+buffered",
            IoMode::ThreadsDirect => "pread/pwrite+O_DIRECT",
            IoMode::ThreadsBuffered => "pread/pwrite+buffered",
        }
    }

    /// Whether I/O bypasses the page cache.
    pub fn is_direct(self) -> bool {
        matches!(self, IoMode::UringDirect | IoMode::ThreadsDirect)
    }

    /// Whether I/O goes through io_uring.
    pub fn is_uring(self) -> bool {
        matches!(self, IoMode::UringDirect | IoMode::UringBuffered)
    }
}

impl std::fmt::Display for IoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// File medium: a preallocated file accessed with direct, aligned,
/// asynchronous I/O (see the [module docs](self)).
pub struct FileMedium {
    // Declared first so that it drops first: dropping the engine waits for
    // every in-flight I/O and joins its thread(s).
    engine: Engine,
    file: Arc<File>,
    path: PathBuf,
    size: u64,
    mode: IoMode,
    queue_depth: u32,
    /// [`ALIGN`] with `O_DIRECT`, 1 when buffered.
    align: u64,
    /// Sector locks for read-modify-writes.
    stripes: Box<[Arc<Mutex<()>>]>,
    /// Reads of [`STREAM_READ_MIN`] bytes or more go through the page
    /// cache with `RWF_DONTCACHE`.
    stream_reads: bool,
    /// Recycled bounce buffers.
    pool: BufPool,
    /// The locked descriptor (the lock lives as long as it is open; `file`
    /// may be a second, `O_DIRECT` descriptor) and what creating the file
    /// created. `None` only while the medium is being set up.
    footprint: Option<BlockFile>,
}

impl FileMedium {
    /// [`create_with`](Self::create_with) with the default
    /// [`FileIoConfig`] (io_uring and `O_DIRECT` where possible).
    pub fn create(path: &Path, size: u64) -> Result<FileMedium, StoreError> {
        FileMedium::create_with(path, size, &FileIoConfig::default())
    }

    /// Creates (or truncates) the file at `path`, creating parent
    /// directories (mode 0700), preallocates `size` bytes (rounded up to
    /// [`ALIGN`]) and starts the I/O engine. Previous contents are discarded
    /// so that bytes of an earlier run can never be served.
    ///
    /// The file is locked for exclusive use (`flock`) before anything is
    /// truncated, and stays locked until the medium is dropped: a file in
    /// use by another medium (of any process) gives
    /// [`StoreError::Locked`] and is left untouched. The file gets mode
    /// 0600. On failure, a file (and directories) this call created are
    /// removed again. Dropping the medium leaves the file in place (a
    /// [`StorageServer`](crate::StorageServer) removes it when it stops).
    pub fn create_with(
        path: &Path,
        size: u64,
        io: &FileIoConfig,
    ) -> Result<FileMedium, StoreError> {
        FileMedium::open_with(path, size, io, false)
    }

    /// [`create_with`](Self::create_with), or with `keep` the same without
    /// discarding anything: the existing file must already have the size
    /// `create_with` would give it (`size` rounded up to [`ALIGN`]), and
    /// its bytes are kept (a persistent server's restart).
    pub fn open_with(
        path: &Path,
        size: u64,
        io: &FileIoConfig,
        keep: bool,
    ) -> Result<FileMedium, StoreError> {
        io.validate()?;
        if size == 0 {
            return Err(StoreError::config(
                "capacity",
                "file medium must not be empty",
            ));
        }
        let file_len = size.checked_next_multiple_of(ALIGN).ok_or_else(|| {
            StoreError::config(
                "capacity",
                format!("{size} bytes exceeds the largest file offset"),
            )
        })?;
        let locked = crate::datadir::lock_block_file(path)?;
        match FileMedium::set_up(&locked, size, file_len, io, keep) {
            Ok(mut m) => {
                m.footprint = Some(locked);
                Ok(m)
            }
            Err(e) => {
                // Still locked here: nobody else can have taken it over.
                locked.undo();
                Err(e)
            }
        }
    }

    /// Sizes the locked file and starts the engine.
    fn set_up(
        locked: &BlockFile,
        size: u64,
        file_len: u64,
        io: &FileIoConfig,
        keep: bool,
    ) -> Result<FileMedium, StoreError> {
        let path = locked.path.as_path();
        prepare_file(&locked.lock, path, file_len, keep)?;
        let file = if io.direct {
            match open_direct(path) {
                Ok(f) => Some(Arc::new(f)),
                Err(e) => {
                    tracing::info!(
                        "{}: O_DIRECT is not available here ({e}); using buffered I/O",
                        path.display()
                    );
                    None
                }
            }
        } else {
            None
        };
        let direct = file.is_some();
        let file = file.unwrap_or_else(|| locked.lock.clone());
        let stream = match direct && io.stream_reads {
            true => match probe_stream_reads(&locked.lock) {
                Ok(()) => Some(locked.lock.clone()),
                Err(e) => {
                    tracing::info!(
                        "{}: uncached buffered reads (RWF_DONTCACHE) are not available ({e}); \
                         large reads use O_DIRECT too",
                        path.display()
                    );
                    None
                }
            },
            false => None,
        };
        let stream_reads = stream.is_some();
        let uring = if io.io_uring {
            match uring::Uring::new(file.clone(), stream.clone(), io.queue_depth) {
                Ok(u) => Some(u),
                Err(e) => {
                    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                        .map(|s| format!(", kernel.io_uring_disabled = {}", s.trim()))
                        .unwrap_or_default();
                    tracing::info!(
                        "{}: io_uring is not available ({e}{sysctl}); using pread/pwrite threads",
                        path.display()
                    );
                    None
                }
            }
        } else {
            None
        };
        let (engine, mode) = match (uring, direct) {
            (Some(u), true) => (Engine::Uring(u), IoMode::UringDirect),
            (Some(u), false) => (Engine::Uring(u), IoMode::UringBuffered),
            (None, direct) => {
                let threads = io.queue_depth.clamp(1, MAX_FALLBACK_THREADS) as usize;
                let pool = threads::Pool::new(file.clone(), stream, threads)
                    .map_err(|e| StoreError::io("start I/O threads for", path, e))?;
                let mode = if direct {
                    IoMode::ThreadsDirect
                } else {
                    IoMode::ThreadsBuffered
                };
                (Engine::Threads(pool), mode)
            }
        };
        tracing::info!(
            "{}: file tier of {size} bytes uses {mode} (queue depth {}{})",
            path.display(),
            io.queue_depth,
            match stream_reads {
                true => ", uncached buffered stream reads",
                false => "",
            }
        );
        Ok(FileMedium {
            engine,
            file,
            path: path.to_path_buf(),
            size,
            mode,
            queue_depth: io.queue_depth,
            align: if direct { ALIGN } else { 1 },
            stream_reads,
            stripes: (0..STRIPES).map(|_| Arc::new(Mutex::new(()))).collect(),
            pool: BufPool::new(io.queue_depth as usize * 2),
            footprint: None,
        })
    }

    /// The lock and creation record, for the server's clean-up.
    pub(crate) fn footprint(&self) -> Option<BlockFile> {
        self.footprint.clone()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The I/O path chosen at start-up.
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Most I/Os in flight (io_uring), or the basis of the pool size.
    pub fn queue_depth(&self) -> u32 {
        self.queue_depth
    }

    /// Whether large reads are uncached buffered reads (see
    /// [`STREAM_READ_MIN`]).
    pub fn stream_reads(&self) -> bool {
        self.stream_reads
    }

    /// The open block file (opened with `O_DIRECT` in the direct modes).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Appends `len` bytes at `off` to `out`; on error nothing is appended.
    /// `keep` is dropped only once the kernel is done with the I/O.
    pub async fn read_at(
        &self,
        off: u64,
        len: usize,
        out: &mut BytesMut,
        keep: Keepalive,
    ) -> io::Result<()> {
        check_range(off, len, self.size)?;
        if len == 0 {
            return Ok(());
        }
        let (kind, (start, end)) = self.read_span(off, len);
        let buf = self.pool.get((end - start) as usize);
        let buf = self.engine.run(kind, start, buf, keep).await?;
        let skip = (off - start) as usize;
        out.extend_from_slice(&buf.as_slice()[skip..skip + len]);
        self.pool.put(buf);
        Ok(())
    }

    /// Writes `data` at `off`, doing a serialised read-modify-write of
    /// partially covered sectors in direct mode. `keep` is dropped only once
    /// the kernel is done with the I/O.
    pub async fn write_at(&self, off: u64, data: &[u8], keep: Keepalive) -> io::Result<()> {
        check_range(off, data.len(), self.size)?;
        if data.is_empty() {
            return Ok(());
        }
        let (start, end) = self.cover(off, data.len() as u64);
        let span = (end - start) as usize;
        let head = off != start;
        let tail = off + data.len() as u64 != end;
        let (mut buf, keep) = if head || tail {
            let a = self.align;
            let mut partial = Vec::with_capacity(2);
            if head {
                partial.push(start / a);
            }
            if tail {
                partial.push(end / a - 1);
            }
            let locks = self.lock_sectors(&partial).await;
            let keep: Keepalive = Arc::new((keep, locks));
            let buf = if end - start <= 2 * a {
                let buf = self.pool.get(span);
                self.engine
                    .run(OpKind::Read, start, buf, keep.clone())
                    .await?
            } else {
                let sector = |at: u64| {
                    self.engine
                        .run(OpKind::Read, at, self.pool.get(a as usize), keep.clone())
                };
                let (h, t) = tokio::join!(
                    async {
                        match head {
                            true => Some(sector(start).await),
                            false => None,
                        }
                    },
                    async {
                        match tail {
                            true => Some(sector(end - a).await),
                            false => None,
                        }
                    }
                );
                let mut buf = self.pool.get(span);
                let a = a as usize;
                if let Some(h) = h {
                    let h = h?;
                    buf.as_mut_slice()[..a].copy_from_slice(h.as_slice());
                    self.pool.put(h);
                }
                if let Some(t) = t {
                    let t = t?;
                    buf.as_mut_slice()[span - a..].copy_from_slice(t.as_slice());
                    self.pool.put(t);
                }
                buf
            };
            (buf, keep)
        } else {
            // Every byte of the buffer is overwritten below.
            (self.pool.get(span), keep)
        };
        let skip = (off - start) as usize;
        buf.as_mut_slice()[skip..skip + data.len()].copy_from_slice(data);
        let buf = self.engine.run(OpKind::Write, start, buf, keep).await?;
        self.pool.put(buf);
        Ok(())
    }

    /// How a read of `len` bytes at `off` is done, and the range it reads.
    fn read_span(&self, off: u64, len: usize) -> (OpKind, (u64, u64)) {
        match self.stream_reads && len >= STREAM_READ_MIN {
            // Buffered: any offset and length will do.
            true => (OpKind::StreamRead, (off, off + len as u64)),
            false => (OpKind::Read, self.cover(off, len as u64)),
        }
    }

    /// The aligned range covering `off..off+len` (inside the file, whose
    /// length is a multiple of [`ALIGN`]).
    fn cover(&self, off: u64, len: u64) -> (u64, u64) {
        let a = self.align;
        (off / a * a, (off + len).div_ceil(a) * a)
    }

    /// Locks the given sectors in stripe order.
    async fn lock_sectors(&self, sectors: &[u64]) -> Vec<OwnedMutexGuard<()>> {
        let mut idx: Vec<usize> = sectors.iter().map(|&s| stripe(s)).collect();
        idx.sort_unstable();
        idx.dedup();
        let mut guards = Vec::with_capacity(idx.len());
        for i in idx {
            guards.push(self.stripes[i].clone().lock_owned().await);
        }
        guards
    }
}

/// Stripe of a sector: Fibonacci hashing, so that the same offset in
/// different blocks lands on different stripes.
fn stripe(sector: u64) -> usize {
    (sector.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - STRIPES.trailing_zeros())) as usize
}

/// Empties the locked file and preallocates `len` bytes; with `keep`,
/// checks that it has `len` bytes and keeps them (allocating any holes).
fn prepare_file(file: &File, path: &Path, len: u64, keep: bool) -> Result<(), StoreError> {
    if keep {
        let have = file
            .metadata()
            .map_err(|e| StoreError::io("inspect", path, e))?
            .len();
        if have != len {
            return Err(StoreError::io(
                "reuse",
                path,
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("it has {have} bytes, expected {len}"),
                ),
            ));
        }
    } else {
        file.set_len(0)
            .and_then(|()| file.set_len(len))
            .map_err(|e| StoreError::io("size", path, e))?;
    }
    let off_len = libc::off_t::try_from(len).map_err(|_| {
        StoreError::config(
            "capacity",
            format!("{len} bytes exceeds the largest file offset"),
        )
    })?;
    // SAFETY: plain system call on a descriptor we own.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, off_len) };
    match rc {
        0 => {}
        // The file system cannot preallocate: the sparse `set_len` file has
        // to do.
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
    Ok(())
}

/// Opens `path` with `O_DIRECT` and proves that aligned I/O works on it
/// (some file systems accept the flag at open and refuse the I/O).
fn open_direct(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)?;
    let mut probe = AlignedBuf::zeroed(ALIGN as usize);
    // Writes back the first sector as it was read (zeros in a file just
    // truncated; kept bytes otherwise): nothing else uses the locked file
    // yet, so this changes nothing.
    pio(file.as_raw_fd(), OpKind::Read, 0, &mut probe)?;
    pio(file.as_raw_fd(), OpKind::Write, 0, &mut probe)?;
    Ok(file)
}

/// Proves that the kernel and file system take uncached buffered reads
/// (`RWF_DONTCACHE`, Linux 6.14 and later, not every file system).
fn probe_stream_reads(file: &File) -> io::Result<()> {
    let mut probe = AlignedBuf::zeroed(ALIGN as usize);
    pio(file.as_raw_fd(), OpKind::StreamRead, 0, &mut probe)
}

impl Medium for FileMedium {
    fn release(&self, off: u64, len: u64) -> io::Result<()> {
        if off.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "release of {len} bytes at {off} past the end ({})",
                    self.size
                ),
            ));
        }
        crate::medium::punch_hole(&self.file, off, len)
    }

    /// Blocks the calling thread until the read is done; the storage
    /// server uses the asynchronous interface instead.
    fn read_into(&self, off: u64, len: usize, out: &mut BytesMut) -> io::Result<()> {
        block_on(self.read_at(off, len, out, Arc::new(())))
    }

    /// Blocks the calling thread until the write is done; the storage
    /// server uses the asynchronous interface instead.
    fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        block_on(self.write_at(off, data, Arc::new(())))
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    /// The aligned buffer a read goes through.
    fn read_buffer_len(&self, off: u64, len: usize) -> usize {
        let (start, end) = self.read_span(off, len).1;
        BufPool::capacity(end.saturating_sub(start) as usize)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn io_mode(&self) -> &'static str {
        self.mode.as_str()
    }

    fn as_async(&self) -> Option<&dyn AsyncMedium> {
        Some(self)
    }

    /// `fsync` of the block file: the page cache (buffered and stream
    /// I/O) and the device's write cache (`O_DIRECT` writes).
    fn sync(&self) -> io::Result<()> {
        match &self.footprint {
            Some(b) => b.lock.sync_all(),
            None => self.file.sync_all(),
        }
    }
}

impl AsyncMedium for FileMedium {
    fn read_into_async<'a>(
        &'a self,
        off: u64,
        len: usize,
        out: &'a mut BytesMut,
        keep: Keepalive,
    ) -> IoFuture<'a> {
        Box::pin(self.read_at(off, len, out, keep))
    }

    fn write_async<'a>(&'a self, off: u64, data: &'a [u8], keep: Keepalive) -> IoFuture<'a> {
        Box::pin(self.write_at(off, data, keep))
    }
}

#[cfg(test)]
mod tests;

//! The server's role of a region ([`ServerRegion`]): it creates the
//! memory (a sealed memfd, or a file of a persistent server), writes with
//! the lanes of its own slots, grants client slots to hand-over
//! connections ([`SlotLease`]) and reclaims them, receives writes in place
//! ([`InPlaceWrite`]), and stops.

use crate::layout::Layout;
use crate::protocol::{self, Lanes, Memory};
use crate::region::{sealed, slot_lanes, Region, Role, CLOSED, SETTLING};
use memmap2::{MmapOptions, MmapRaw};
use nodekernel_proto::sync;
use nodekernel_proto::{Error, Result};
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const MEMFD_NAME: &CStr = c"nodekernel-dram";

/// A DRAM storage server's own mapping of its region.
pub type ServerRegion = Region<Server>;

/// The server's role: the lanes of its own slots and the state of every
/// client slot.
#[derive(Debug)]
pub struct Server {
    lanes: Lanes,
    slots: Mutex<Vec<SlotState>>,
}

impl Role for Server {}

impl sealed::Role for Server {
    const SERVES: bool = true;

    fn lanes(&self) -> Option<Lanes> {
        Some(self.lanes)
    }

    fn slot(&self) -> Option<u32> {
        None
    }

    fn populated(&self) -> Option<&[AtomicU64]> {
        None
    }
}

/// The slot whose waiting count the server's own waits (its writes and
/// reclamations) go to.
const SERVER_WAIT_SLOT: u32 = 0;

/// Where a client slot is in its life (server side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// All its lanes are free; it can be granted.
    Free,
    /// Granted to a hand-over connection that is still open.
    Leased,
    /// Its lease was dropped without reclamation (the server is stopping):
    /// never granted again, since its process may still be writing.
    Retired,
}

impl Region<Server> {
    /// Creates a zero-filled region of `num_blocks` blocks of `block_size`
    /// bytes (every generation 0, every lane free) in a new memfd, seals
    /// its size and maps it. The region writes with the lanes of the
    /// server's slots, and grants the others with [`Region::lease_slot`].
    ///
    /// All of its memory is allocated here, not at first touch: the DRAM
    /// tier's capacity is then real (a later shortage cannot fault a
    /// client's copy with `SIGBUS`), and no block transfer pays for zeroing
    /// fresh pages. Fails if the memory cannot be had.
    pub fn create(block_size: u32, num_blocks: u32) -> io::Result<ServerRegion> {
        let layout = Layout::new(block_size, num_blocks)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: MEMFD_NAME is NUL-terminated; the result is checked and
        // then owned by exactly one `File`.
        let fd = unsafe {
            libc::memfd_create(
                MEMFD_NAME.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(layout.total_len)?;
        // The size can never change again, so no mapping of it (ours or a
        // client's) can ever fault past the end of the file.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: plain fcntl on a descriptor we own.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: plain fallocate on a descriptor we own, inside its size.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, layout.total_len as i64) };
        if rc != 0 {
            let e = io::Error::from_raw_os_error(rc);
            return Err(io::Error::new(
                e.kind(),
                format!("cannot reserve {} bytes of memory: {e}", layout.total_len),
            ));
        }
        let map = MmapOptions::new()
            .len(layout.total_len as usize)
            .populate()
            .map_raw(&file)?;
        let header = layout.encode();
        // SAFETY: the mapping is at least HEADER_LEN bytes (validated layout)
        // and nobody else can see it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), map.as_mut_ptr(), header.len());
        }
        Ok(Region::server(file, layout, map))
    }

    /// The server's side of a freshly mapped region: its own lanes, every
    /// client slot free.
    fn server(file: File, layout: Layout, map: MmapRaw) -> ServerRegion {
        let client_slots = layout.slots - layout.server_slots;
        let role = Server {
            lanes: Lanes {
                slot: SERVER_WAIT_SLOT,
                first: 0,
                count: layout.server_slots as usize * layout.lanes_per_slot as usize,
            },
            slots: Mutex::new(vec![SlotState::Free; client_slots as usize]),
        };
        Region::mapped(file, layout, map, role)
    }

    /// Whether the regular file at `path` holds a region this build would
    /// create for `num_blocks` blocks of `block_size` bytes, so that
    /// [`Region::open_file`] may keep it: `Err` says why not (missing, of
    /// another size, a header of another version or layout). Reads only
    /// the header; changes nothing.
    pub fn check_file(
        path: &Path,
        block_size: u32,
        num_blocks: u32,
    ) -> std::result::Result<(), String> {
        let layout = Layout::new(block_size, num_blocks).map_err(|e| e.to_string())?;
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(format!("{} is missing", path.display()))
            }
            Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
        };
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        if meta.len() != layout.total_len {
            return Err(format!(
                "{} has {} bytes, this server's region has {}",
                path.display(),
                meta.len(),
                layout.total_len
            ));
        }
        let mut header = [0u8; crate::HEADER_LEN];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| format!("cannot read the header of {}: {e}", path.display()))?;
        if header != layout.encode() {
            let why = match Layout::decode(&header) {
                Err(e) => e.to_string(),
                Ok(other) => format!(
                    "it holds {} blocks of {} bytes with {} slots of {} lanes",
                    other.num_blocks, other.block_size, other.slots, other.lanes_per_slot
                ),
            };
            return Err(format!(
                "the header of {} does not match this server's region: {why}",
                path.display()
            ));
        }
        Ok(())
    }

    /// A server's region in the regular file at `path` (created mode 0600
    /// if missing), mapped shared, so that its blocks and generations
    /// outlive the process: a persistent DRAM tier (the file should live
    /// on `/dev/shm` or another memory-backed or fast file system).
    ///
    /// With `keep`, the file must hold a region of exactly this layout
    /// (see [`Region::check_file`]; otherwise `InvalidData`): its block
    /// data and generation words are kept, while what only a live process
    /// could mean is reset, since no process of the server that wrote it
    /// can still be writing: the state word (serving again), every lane,
    /// the waiting counts, and the [`SETTLING`] bit of any generation
    /// word (a claim the old process left half done: as when a dead
    /// claimer's slot is reclaimed, its generation simply owns the block
    /// now). Without `keep`, a new file is initialised like
    /// [`Region::create`]'s memfd (every generation 0) and renamed over
    /// `path` (processes that still map the old file keep the old bytes).
    ///
    /// Either way the whole file is reserved (`posix_fallocate`) and the
    /// mapping prefaulted, as for a memfd. A regular file cannot be sealed
    /// against shrinking; clients accept it all the same (see
    /// [`Region::open`] and `docs/shared-memory.md`).
    pub fn open_file(
        path: &Path,
        block_size: u32,
        num_blocks: u32,
        keep: bool,
    ) -> io::Result<ServerRegion> {
        let layout = Layout::new(block_size, num_blocks)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if keep {
            if let Err(why) = ServerRegion::check_file(path, block_size, num_blocks) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, why));
            }
        }
        // A fresh region is a new file renamed over the old one, never the
        // old one emptied in place: a process that still maps the old file
        // (a client of the server before, that has not yet noticed it is
        // gone) keeps its own bytes, cannot fault on a shrunk file, and
        // shares nothing with the new region.
        let tmp = {
            let mut name = path.as_os_str().to_owned();
            name.push(".tmp");
            std::path::PathBuf::from(name)
        };
        let file = if keep {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)?
        } else {
            match std::fs::remove_file(&tmp) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&tmp)?;
            f.set_len(layout.total_len)?;
            f
        };
        // SAFETY: plain fallocate on a descriptor we own, inside its size;
        // it allocates what is missing and changes no byte.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, layout.total_len as i64) };
        match rc {
            0 => {}
            libc::EOPNOTSUPP | libc::EINVAL => tracing::debug!(
                "{}: posix_fallocate unsupported, the region may be sparse",
                path.display()
            ),
            rc => {
                let e = io::Error::from_raw_os_error(rc);
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot reserve {} bytes for {}: {e}",
                        layout.total_len,
                        path.display()
                    ),
                ));
            }
        }
        let map = MmapOptions::new()
            .len(layout.total_len as usize)
            .populate()
            .map_raw(&file)?;
        let region = if keep {
            let region = Region::server(file, layout, map);
            region.reset_transient();
            region
        } else {
            let header = layout.encode();
            // SAFETY: the mapping is at least HEADER_LEN bytes (validated
            // layout) and nobody else can see the new file yet.
            unsafe {
                std::ptr::copy_nonoverlapping(header.as_ptr(), map.as_mut_ptr(), header.len());
            }
            std::fs::rename(&tmp, path)?;
            Region::server(file, layout, map)
        };
        Ok(region)
    }

    /// Resets what only a live process could mean (see
    /// [`Region::open_file`]).
    fn reset_transient(&self) {
        let l = &self.layout;
        self.state().store(0, Ordering::Relaxed);
        self.waiting().store(0, Ordering::Relaxed);
        for i in 0..l.lane_count() {
            self.lane(i).store(0, Ordering::Relaxed);
        }
        for s in 0..l.slots {
            self.slot_waiting(s).store(0, Ordering::Relaxed);
        }
        for b in 0..l.num_blocks {
            let w = self.generation_word(b);
            let v = w.load(Ordering::Relaxed);
            if v & SETTLING != 0 {
                w.store(v & !SETTLING, Ordering::Relaxed);
            }
        }
        fence(Ordering::SeqCst);
    }

    /// Writes every changed page of the region back to its file and waits
    /// for the device (`msync(MS_SYNC)`, then `fsync`): a file-backed
    /// region's blocks and generations then survive a machine crash. On a
    /// memfd (or tmpfs) there is nothing to write back.
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: the whole mapping, which lives as long as `self`; msync
        // changes no byte.
        let rc = unsafe {
            libc::msync(
                self.map.as_mut_ptr().cast(),
                self.layout.total_len as usize,
                libc::MS_SYNC,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.file.sync_all()
    }

    /// Whether some lane of any slot holds a write (in progress, or left
    /// by a process that died and was not reclaimed): a server that stops
    /// waits for none before it syncs.
    pub fn lanes_busy(&self) -> bool {
        // Pairs with the fence a writer makes after taking its lane: a
        // server write either sees the region closed (if `close` came
        // before) or its lane is seen here.
        fence(Ordering::SeqCst);
        (0..self.layout.lane_count()).any(|i| self.lane(i).load(Ordering::Acquire) != 0)
    }

    /// Marks the region closed: the server has stopped serving it. Mapped
    /// clients check this before every access and stop using the mapping.
    pub fn close(&self) {
        self.state().store(CLOSED, Ordering::Release);
    }

    /// Like [`Region::write`], for a copy that the caller makes itself,
    /// later: waits until `len` bytes of `block` at `offset` may be written
    /// under `gen` and returns them as an [`InPlaceWrite`], which announces
    /// the write (a claim of a newer generation waits for it) until it is
    /// dropped. A storage server receives a write's bytes from the socket
    /// straight into the block this way. The bytes are the block's as they
    /// arrive: a write abandoned half way leaves part of its bytes in place
    /// (under its own generation, as a torn write would).
    pub async fn write_in_place(
        self: &Arc<Self>,
        block: u32,
        gen: u64,
        offset: u32,
        len: usize,
    ) -> Result<InPlaceWrite> {
        let op = self.ready_write(block, gen, offset, len).await?;
        let lane = op
            .into_lane()
            .ok_or_else(|| Error::internal(format!("block {block}: a ready write has no lane")))?;
        Ok(InPlaceWrite {
            region: self.clone(),
            lane,
            dst: self.src(block, offset),
            len,
        })
    }

    /// Grants a free client slot to a new hand-over connection, or
    /// `None` when every client slot is taken (that client then uses the
    /// network). The slot is granted again only after
    /// [`SlotLease::reclaim`].
    pub fn lease_slot(self: &Arc<Self>) -> Option<SlotLease> {
        let mut t = sync::lock(&self.role.slots);
        let i = t.iter().position(|s| *s == SlotState::Free)?;
        t[i] = SlotState::Leased;
        Some(SlotLease {
            region: self.clone(),
            slot: self.layout.server_slots + i as u32,
            reclaimed: false,
        })
    }

    /// Client slots not granted now.
    pub fn free_slots(&self) -> usize {
        let t = sync::lock(&self.role.slots);
        t.iter().filter(|s| **s == SlotState::Free).count()
    }

    fn set_slot_state(&self, slot: u32, state: SlotState) {
        let mut t = sync::lock(&self.role.slots);
        if let Some(s) = t.get_mut((slot - self.layout.server_slots) as usize) {
            *s = state;
        }
    }
}

/// A write of a region's block whose bytes the holder copies in itself
/// ([`Region::write_in_place`]): `len` bytes at [`InPlaceWrite::ptr`],
/// writable only through that raw pointer (other processes may read them
/// at any time, so no Rust reference to them is ever formed). Dropping it
/// ends the write.
pub struct InPlaceWrite {
    region: Arc<ServerRegion>,
    lane: usize,
    dst: *mut u8,
    len: usize,
}

// SAFETY: `dst` points into the mapping `region` keeps alive; the struct
// only hands the address out, and the lane is an index.
unsafe impl Send for InPlaceWrite {}

impl InPlaceWrite {
    /// Where the bytes go: valid for writes of [`InPlaceWrite::len`] bytes
    /// while `self` lives.
    pub fn ptr(&self) -> *mut u8 {
        self.dst
    }

    /// How many bytes the write covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for InPlaceWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InPlaceWrite")
            .field("lane", &self.lane)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Drop for InPlaceWrite {
    fn drop(&mut self) {
        protocol::release_lane(&*self.region, self.lane);
    }
}

/// A client slot granted to one hand-over connection, that is, to one
/// client process (server side).
///
/// When the connection closes, the process is gone or has dropped its
/// mapping, so none of its copies can still be running: call
/// [`SlotLease::reclaim`]. Dropping the lease without reclaiming retires
/// the slot for good (its process may still be writing), which is right
/// when the server itself stops.
#[derive(Debug)]
pub struct SlotLease {
    region: Arc<ServerRegion>,
    slot: u32,
    reclaimed: bool,
}

impl SlotLease {
    /// The slot number, sent to the client with the region.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's process is gone: frees its lanes, completes every claim
    /// it had in progress (waiting, without blocking the thread, for
    /// writers of older generations in other processes to finish their
    /// copy), and only then makes the slot available again.
    ///
    /// Cancel safety: if the future is dropped before it completes, the
    /// slot is retired, never granted again; claims not yet settled are
    /// settled by their generation's next write or superseded.
    pub async fn reclaim(mut self) {
        let region = self.region.clone();
        let claims = protocol::clear_lanes(&*region, slot_lanes(&region.layout, self.slot));
        for block in claims {
            if block >= region.layout.num_blocks {
                // Only a corrupt lane can name one; nothing to settle.
                tracing::warn!(
                    "slot {}: a lane names block {block}, past the end",
                    self.slot
                );
                continue;
            }
            region
                .until_ready(SERVER_WAIT_SLOT, || protocol::poll_settle(&*region, block))
                .await;
        }
        region.set_slot_state(self.slot, SlotState::Free);
        self.reclaimed = true;
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if !self.reclaimed {
            self.region.set_slot_state(self.slot, SlotState::Retired);
        }
    }
}

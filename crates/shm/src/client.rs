//! A co-located client's role of a region ([`ClientRegion`]): it maps
//! the memory it received at the hand-over, after checking it, writes
//! with the lanes of the slot granted to its process (or only reads), and
//! maps blocks in ahead of large copies.

use crate::layout::Layout;
use crate::protocol::Lanes;
use crate::region::{sealed, slot_lanes, Region, Role};
use memmap2::MmapOptions;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;

/// A co-located client's mapping of a storage server's region.
pub type ClientRegion = Region<Client>;

/// The client's role: the slot granted to its process (if any) and the
/// blocks it has mapped in.
#[derive(Debug)]
pub struct Client {
    lanes: Option<Lanes>,
    slot: Option<u32>,
    /// One bit per block whose pages this mapping has already faulted in
    /// (see `Region::touch`).
    populated: Box<[AtomicU64]>,
}

impl Role for Client {}

impl sealed::Role for Client {
    const SERVES: bool = false;

    fn lanes(&self) -> Option<Lanes> {
        self.lanes
    }

    fn slot(&self) -> Option<u32> {
        self.slot
    }

    fn populated(&self) -> Option<&[AtomicU64]> {
        Some(&self.populated)
    }
}

impl Region<Client> {
    /// Maps a region received from a server, after checking everything:
    /// the header parses and is consistent, the granted `slot` (if any) is
    /// a client slot of this layout, the descriptor is a regular file (a
    /// memfd, sealed against shrinking by a volatile server, or the file of
    /// a persistent one) at least as long as the header says, the header
    /// inside the mapping matches the one received, and the server has not
    /// stopped.
    ///
    /// Writes use the lanes of `slot`; without one the mapping is read
    /// only ([`Region::write`] fails with `Unavailable`).
    pub fn open(fd: OwnedFd, header: &[u8], slot: Option<u32>) -> io::Result<ClientRegion> {
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
        let layout = Layout::decode(header).map_err(|e| invalid(e.to_string()))?;
        if let Some(s) = slot.filter(|&s| !layout.is_client_slot(s)) {
            return Err(invalid(format!(
                "slot {s} is not a client slot (the server keeps slots 0 to {}, the region has {})",
                layout.server_slots - 1,
                layout.slots
            )));
        }
        let file = File::from(fd);
        // A sealed memfd (a volatile server), or a regular file (a
        // persistent server's region: a file cannot be sealed, and only
        // its owner, the same user the hand-over already requires, could
        // shrink it; see docs/shared-memory.md).
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(invalid(
                "the received descriptor is neither a memfd nor a regular file".into(),
            ));
        }
        // SAFETY: plain fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        let sealed = seals >= 0 && seals & libc::F_SEAL_SHRINK != 0;
        if meta.len() < layout.total_len {
            return Err(invalid(format!(
                "the received {} has {} bytes, the header describes {}",
                if sealed { "memfd" } else { "file" },
                meta.len(),
                layout.total_len
            )));
        }
        let map = MmapOptions::new()
            .len(layout.total_len as usize)
            .map_raw(&file)?;
        let words = layout.num_blocks.div_ceil(64) as usize;
        let role = Client {
            lanes: slot.map(|s| slot_lanes(&layout, s)),
            slot,
            populated: (0..words).map(|_| AtomicU64::new(0)).collect(),
        };
        let region = Region::mapped(file, layout, map, role);
        let mut mapped = [0u8; crate::HEADER_LEN];
        // SAFETY: the mapping holds at least HEADER_LEN bytes; the header is
        // written once before the region is shared and never again.
        unsafe {
            std::ptr::copy_nonoverlapping(
                region.map.as_ptr(),
                mapped.as_mut_ptr(),
                crate::HEADER_LEN,
            );
        }
        if mapped[..] != *header {
            return Err(invalid(
                "the header in the memfd differs from the one received".into(),
            ));
        }
        if region.is_closed() {
            return Err(invalid("the storage server has stopped".into()));
        }
        Ok(region)
    }

    /// The client slot this mapping writes with (`None` for a read-only
    /// mapping).
    pub fn slot(&self) -> Option<u32> {
        self.role.slot
    }

    /// Whether this mapping may write (it has lanes).
    pub fn can_write(&self) -> bool {
        self.role.lanes.is_some()
    }
}

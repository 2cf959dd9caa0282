//! Persistent storage servers: the state file, the keep-or-discard rule,
//! and the file of block generations.
//!
//! A server with [`StoreConfig::persistent`](crate::StoreConfig::persistent)
//! keeps its blocks across a restart of its process. What it needs is in
//! its data directory (see [`datadir`](crate::datadir) for the whole
//! layout):
//!
//! * [`STATE_FILE`] (`store-state`): 64 bytes, little-endian, rewritten
//!   whole (temporary name, `fsync`, `rename`, `fsync` of the directory):
//!
//!   | offset | size | field |
//!   |---:|---:|---|
//!   | 0 | 8 | magic `"NKSTATE1"` |
//!   | 8 | 4 | format version (1) |
//!   | 12 | 1 | medium: 1 DRAM, 2 file |
//!   | 13 | 1 | clean: 1 when the last stop synced everything, else 0 |
//!   | 14 | 2 | reserved, 0 |
//!   | 16 | 4 | block size |
//!   | 20 | 4 | number of blocks |
//!   | 24 | 8 | incarnation |
//!   | 32 | 16 | boot id of the machine that wrote it (zeros if unknown) |
//!   | 48 | 12 | reserved, 0 |
//!   | 60 | 4 | CRC-32 (IEEE) of bytes 0..60 |
//!
//! * [`GENS_FILE`] (`gens`, file medium): one `u64` little-endian per block,
//!   its generation, mapped shared: every claim is in the page cache the
//!   instant it happens (a DRAM region keeps its generations in its own
//!   file, [`DRAM_FILE`]);
//! * [`DRAM_FILE`] (`dram`, DRAM medium): the shared region
//!   ([`nodekernel_shm::Region::open_file`]);
//! * [`ADDRESS_FILE`] (`address`): the data port's last bound address, tried
//!   first at the next start when the configured port is 0.
//!
//! # Keep or discard
//!
//! At start the blocks are kept if and only if the state file
//! is valid (magic, version, CRC, reserved bytes), it names the configured
//! medium, block size and block count, the medium's files are present with
//! the right sizes (a DRAM file's header matches this build's layout), and
//! either the boot id is the current one (the process died but the machine
//! did not: the page cache holds every write) or the last stop was clean
//! (data and generations were synced before `clean` was written). The
//! server then registers with the stored incarnation, and the metadata
//! server keeps every block mapped. Otherwise it starts empty under a new
//! random incarnation and logs why ([`Discarded`]); the metadata server
//! turns exactly this server's blocks into `DataLost`.
//!
//! Order of writes, so that a crash at any point is safe:
//! 1. discarding: the state file is removed (and the directory synced)
//!    *before* any medium file is emptied, so a crash while re-creating
//!    them can never be taken for kept blocks;
//! 2. before serving (so before any block can change), the state file is
//!    written with `clean = false` and the current boot id;
//! 3. a clean stop waits for writes in flight, syncs the block data and
//!    generations, then writes `clean = true`.

use crate::datadir::{sync_dir, write_durably};
use crate::StoreError;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

/// The state file of a persistent server's data directory.
pub const STATE_FILE: &str = "store-state";
/// The block generations of a persistent file medium.
pub const GENS_FILE: &str = "gens";
/// The region of a persistent DRAM medium.
pub const DRAM_FILE: &str = "dram";
/// The data port's last bound address.
pub const ADDRESS_FILE: &str = "address";

const MAGIC: [u8; 8] = *b"NKSTATE1";
const VERSION: u32 = 1;
const STATE_LEN: usize = 64;
const MEDIUM_DRAM: u8 = 1;
const MEDIUM_FILE: u8 = 2;
const FILE_MODE: u32 = 0o600;

/// Why a persistent server started empty instead of keeping its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discarded {
    /// No state file: the first start in this directory, or the last
    /// start was discarding and did not finish.
    NoState,
    /// The state file is unreadable or damaged.
    Damaged { path: PathBuf, reason: String },
    /// The configured medium, block size or block count is not the one
    /// the blocks were written with.
    SettingsChanged(String),
    /// The machine restarted (another boot id) after a stop that was not
    /// clean: writes may have been lost with the page cache.
    UncleanMachineRestart,
    /// A medium file is missing, of the wrong size, or has another header.
    MediumFiles(String),
}

impl fmt::Display for Discarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Discarded::NoState => write!(f, "no {STATE_FILE} file (first start here)"),
            Discarded::Damaged { path, reason } => {
                write!(f, "{} is damaged: {reason}", path.display())
            }
            Discarded::SettingsChanged(what) => write!(f, "the settings changed: {what}"),
            Discarded::UncleanMachineRestart => write!(
                f,
                "the machine restarted after a stop that was not clean (writes may have been lost with the page cache)"
            ),
            Discarded::MediumFiles(why) => write!(f, "{why}"),
        }
    }
}

/// The contents of the state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreState {
    pub dram: bool,
    pub clean: bool,
    pub block_size: u32,
    pub num_blocks: u32,
    pub incarnation: u64,
    pub boot_id: [u8; 16],
}

/// CRC-32 (IEEE, reflected), bit by bit: the state file is 60 bytes.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

impl StoreState {
    pub(crate) fn encode(&self) -> [u8; STATE_LEN] {
        let mut b = [0u8; STATE_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12] = if self.dram { MEDIUM_DRAM } else { MEDIUM_FILE };
        b[13] = u8::from(self.clean);
        b[16..20].copy_from_slice(&self.block_size.to_le_bytes());
        b[20..24].copy_from_slice(&self.num_blocks.to_le_bytes());
        b[24..32].copy_from_slice(&self.incarnation.to_le_bytes());
        b[32..48].copy_from_slice(&self.boot_id);
        let crc = crc32(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses a state file's bytes; `Err` says what is wrong. Never panics.
    pub(crate) fn decode(b: &[u8]) -> Result<StoreState, String> {
        if b.len() != STATE_LEN {
            return Err(format!("{} bytes, expected {STATE_LEN}", b.len()));
        }
        if b[0..8] != MAGIC {
            return Err("wrong magic".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let crc = u32_at(60);
        if crc != crc32(&b[..60]) {
            return Err("checksum mismatch".into());
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(format!(
                "format version {version}, this build reads {VERSION}"
            ));
        }
        let dram = match b[12] {
            MEDIUM_DRAM => true,
            MEDIUM_FILE => false,
            m => return Err(format!("unknown medium {m}")),
        };
        let clean = match b[13] {
            0 => false,
            1 => true,
            c => return Err(format!("clean flag {c}")),
        };
        if b[14..16] != [0, 0] || b[48..60].iter().any(|&x| x != 0) {
            return Err("reserved bytes are not zero".into());
        }
        let mut inc = [0u8; 8];
        inc.copy_from_slice(&b[24..32]);
        let mut boot_id = [0u8; 16];
        boot_id.copy_from_slice(&b[32..48]);
        Ok(StoreState {
            dram,
            clean,
            block_size: u32_at(16),
            num_blocks: u32_at(20),
            incarnation: u64::from_le_bytes(inc),
            boot_id,
        })
    }

    /// Reads the state file of `dir`: `Ok(None)` if there is none.
    pub(crate) fn read(dir: &Path) -> Result<Option<StoreState>, Discarded> {
        let path = dir.join(STATE_FILE);
        let damaged = |reason: String| Discarded::Damaged {
            path: path.clone(),
            reason,
        };
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(damaged(format!("cannot read it: {e}"))),
        };
        let mut bytes = Vec::new();
        f.take(STATE_LEN as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| damaged(format!("cannot read it: {e}")))?;
        StoreState::decode(&bytes).map(Some).map_err(damaged)
    }

    /// Replaces the state file of `dir` atomically and durably.
    pub(crate) fn write(&self, dir: &Path) -> io::Result<()> {
        write_durably(dir, STATE_FILE, &self.encode())
    }
}

/// Removes the state file (durably), before a discarding start empties
/// the medium's files. Missing is fine.
pub(crate) fn remove_state(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(dir.join(STATE_FILE)) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// This machine's boot id (`/proc/sys/kernel/random/boot_id`, a UUID that
/// changes at every boot), or `None` where it cannot be read: then only a
/// clean stop keeps blocks.
pub(crate) fn boot_id() -> Option<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    parse_boot_id(text.trim())
}

fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        id[i] = u8::from_str_radix(s, 16).ok()?;
    }
    (id != [0; 16]).then_some(id)
}

/// The settings a persistent server runs with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub dram: bool,
    pub block_size: u32,
    pub num_blocks: u32,
}

/// The keep-or-discard rule (see the [module docs](self)), as far as the
/// state file decides it: the incarnation to keep, or why not. The medium
/// files are checked by the caller.
pub(crate) fn decide(dir: &Path, want: Settings, boot: Option<[u8; 16]>) -> Result<u64, Discarded> {
    let s = StoreState::read(dir)?.ok_or(Discarded::NoState)?;
    let kind = |dram: bool| if dram { "dram" } else { "file" };
    if s.dram != want.dram {
        return Err(Discarded::SettingsChanged(format!(
            "the blocks were kept on a {} medium, the server now has a {} medium",
            kind(s.dram),
            kind(want.dram)
        )));
    }
    if s.block_size != want.block_size || s.num_blocks != want.num_blocks {
        return Err(Discarded::SettingsChanged(format!(
            "the blocks were kept as {} blocks of {} bytes, the server now has {} blocks of {} bytes",
            s.num_blocks, s.block_size, want.num_blocks, want.block_size
        )));
    }
    if s.incarnation == 0 {
        return Err(Discarded::Damaged {
            path: dir.join(STATE_FILE),
            reason: "incarnation 0".into(),
        });
    }
    let same_boot = boot.is_some_and(|b| b == s.boot_id);
    if !same_boot && !s.clean {
        return Err(Discarded::UncleanMachineRestart);
    }
    Ok(s.incarnation)
}

/// Checks that `path` is a regular file of exactly `len` bytes.
pub(crate) fn check_size(path: &Path, len: u64) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == len => Ok(()),
        Ok(m) if m.is_file() => Err(format!(
            "{} has {} bytes, expected {len}",
            path.display(),
            m.len()
        )),
        Ok(_) => Err(format!("{} is not a regular file", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(format!("{} is missing", path.display()))
        }
        Err(e) => Err(format!("cannot inspect {}: {e}", path.display())),
    }
}

/// The remembered address of the data port, if any (and well formed).
pub(crate) fn read_address(dir: &Path) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(dir.join(ADDRESS_FILE)).ok()?;
    text.trim().parse().ok()
}

/// Remembers the data port's bound address.
pub(crate) fn write_address(dir: &Path, addr: SocketAddr) -> io::Result<()> {
    write_durably(dir, ADDRESS_FILE, format!("{addr}\n").as_bytes())
}

/// One generation word per block in a file mapped shared (the file
/// medium's [`GENS_FILE`]): a store to a word is in the page cache at once,
/// so it survives the death of the process.
pub(crate) struct GenFile {
    ptr: *mut AtomicU64,
    len: usize,
    file: File,
}

// SAFETY: the mapping is only accessed through `AtomicU64`s, which are
// Send and Sync; the pointer stays valid until drop.
unsafe impl Send for GenFile {}
// SAFETY: as above.
unsafe impl Sync for GenFile {}

impl GenFile {
    /// Opens (keeping its words) or creates (every word 0) the generation
    /// file at `path` for `n` blocks, and maps it. With `keep`, the file
    /// must already hold exactly `n` words.
    pub(crate) fn open(path: &Path, n: u32, keep: bool) -> Result<GenFile, StoreError> {
        let len = u64::from(n) * 8;
        let io_err = |what: &'static str, e: io::Error| StoreError::io(what, path, e);
        if keep {
            check_size(path, len)
                .map_err(|why| io_err("reuse", io::Error::new(io::ErrorKind::InvalidData, why)))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(!keep)
            .mode(FILE_MODE)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| io_err("open", e))?;
        let _ = file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE));
        if !keep {
            file.set_len(0)
                .and_then(|()| file.set_len(len))
                .map_err(|e| io_err("size", e))?;
        }
        let map_len = usize::try_from(len)
            .map_err(|_| io_err("map", io::Error::other("larger than the address space")))?;
        // SAFETY: a fresh shared mapping of `map_len` bytes of a file we
        // opened read-write and sized to at least that; the kernel picks
        // the address. Checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io_err("map", io::Error::last_os_error()));
        }
        Ok(GenFile {
            ptr: ptr.cast(),
            len: n as usize,
            file,
        })
    }

    /// The generation word of every block.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping holds `len` u64 words, page aligned (so
        // 8-aligned), lives as long as `self`, and is only ever accessed
        // as atomics (by this process: the data directory is locked).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Writes the words back to the file and waits for the device.
    pub(crate) fn sync(&self) -> io::Result<()> {
        // SAFETY: the whole mapping, alive as long as `self`; msync changes
        // no byte.
        let rc = unsafe { libc::msync(self.ptr.cast(), self.len * 8, libc::MS_SYNC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.file.sync_all()
    }
}

impl Drop for GenFile {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; nothing
        // borrows it any more (`words` borrows `self`).
        unsafe { libc::munmap(self.ptr.cast(), self.len * 8) };
    }
}

#[cfg(test)]
mod tests;

//! The operation log: an append-only sequence of checksummed records in
//! segment files, written before a change is acknowledged.
//!
//! The journal knows nothing of what a record means: the metadata server
//! writes one record per decision (the effects it applied, see
//! `nodekernel-meta`), in the order it applied them, and replays them at
//! start. Records are numbered from 1 without gaps.
//!
//! # Files
//!
//! A directory holds segments named `journal-<first seq, 20 digits>.log`,
//! and `LOCK`, which an open journal holds (`flock`), so a second process
//! on the same directory is refused instead of interleaving records.
//! A segment starts with a 24-byte header (`NKJOURNL`, format version u32,
//! reserved u32, first seq u64); records follow, each 8-byte aligned:
//!
//! ```text
//! len u32 | crc32 u32 | seq u64 | payload (len bytes) | zero padding to 8
//! ```
//!
//! The CRC (IEEE, `crc32fast`) covers `len`, `seq` and the payload. All
//! integers are little-endian.
//!
//! # Durability
//!
//! [`Journal::append`] writes the record to the file (`write(2)`) before it
//! returns, so once it has, the record survives the *process* dying.
//! [`Journal::durable`] waits until it also survives the *machine* dying,
//! as far as the [`Fsync`] policy promises: with [`Fsync::Always`] it
//! waits for an `fdatasync` that covers it (one `fdatasync` covers every
//! record written before it started: group commit), with
//! [`Fsync::Interval`] a background thread syncs every interval and
//! nobody waits (a machine crash loses at most the last interval), with
//! [`Fsync::Never`] the kernel writes back when it likes.
//!
//! # Recovery
//!
//! [`Journal::open`] replays every record in order. A damaged record at the
//! end of the last segment — a torn write (the file ends inside it), a
//! zeroed or garbled tail (a machine crash before write-back) — is cut off
//! with a warning that says how many bytes went. A damaged record that
//! valid records follow is not a torn tail but damage in the middle of the
//! log: cutting it would silently drop acknowledged changes, so the open
//! fails with an error naming the file and offset, as does any damage in
//! an earlier segment. A log that ends before a record it is known to have
//! held on stable storage (the caller's `floor`) lost records no crash
//! tears: its segment was emptied, cut to its header or removed. The open
//! fails ([`JournalError::Lost`]) without changing any file.
//!
//! Every file is created with mode 0600 ([`FILE_MODE`]), whatever the
//! umask, and one found open to others is set to it at open.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// First bytes of every segment.
pub const MAGIC: [u8; 8] = *b"NKJOURNL";
/// The segment format written and read.
pub const FORMAT_VERSION: u32 = 1;
/// Size of a segment's header.
pub const SEGMENT_HEADER: usize = 24;
/// Size of a record's header (len, crc, seq).
pub const RECORD_HEADER: usize = 16;
/// Largest payload of one record.
pub const MAX_RECORD: usize = 1 << 28;

/// When records reach stable storage (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// Every acknowledged record survives a machine crash.
    Always,
    /// Synced in the background every interval: a machine crash loses at
    /// most the records of the last interval; a process crash loses none.
    Interval(Duration),
    /// Never synced by the journal: a machine crash may lose any record not
    /// yet written back by the kernel; a process crash loses none.
    Never,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The OS error is part of the message (not a `source`), so a printed
    /// chain names it once.
    #[error("operation log {}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("operation log {} is damaged at byte {offset}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The replay callback refused a record.
    #[error("operation log {}: record {seq} cannot be replayed: {reason}", path.display())]
    Rejected {
        path: PathBuf,
        seq: u64,
        reason: String,
    },
    /// An earlier write or sync failed; nothing is written any more.
    #[error("the operation log stopped after a failed write: {0}")]
    Failed(String),
    #[error("a record of {0} bytes is over the limit of {MAX_RECORD}")]
    TooLarge(usize),
    #[error("operation log {} is in use by another process (its LOCK is held)", path.display())]
    Locked { path: PathBuf },
    /// The log ends before a record it is known to have held on stable
    /// storage (the `floor` of [`Journal::open`]): records were lost, not
    /// torn by a crash. Nothing was changed.
    #[error("operation log {} {damage}: the log ends at record {ends}, but records up to {floor} were on stable storage before; records were lost, not torn by a crash", path.display())]
    Lost {
        path: PathBuf,
        damage: String,
        ends: u64,
        floor: u64,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> JournalError + '_ {
    move |error| JournalError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// What [`Journal::open`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Records replayed.
    pub records: u64,
    /// A damaged tail that was cut: the segment, where, and how many bytes.
    pub cut: Option<Cut>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub path: PathBuf,
    pub offset: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Synced {
    /// Every record up to this seq is on stable storage.
    upto: u64,
    failed: bool,
}

struct Writer {
    /// The segment written now (shared with the sync thread).
    file: Arc<File>,
    /// Where the current segment starts, and the bytes written to it.
    first_seq: u64,
    bytes: u64,
    path: PathBuf,
    next_seq: u64,
    buf: Vec<u8>,
    /// [`Journal::close`] was called: nothing more is written.
    closed: bool,
}

struct Inner {
    policy: Fsync,
    dir: PathBuf,
    writer: Mutex<Writer>,
    /// The last seq whose record is in the file.
    written: AtomicU64,
    synced: watch::Sender<Synced>,
    failure: Mutex<Option<String>>,
    /// Set with `failure`: the check every append and reply makes.
    failed: AtomicBool,
    /// Wakes the sync thread; `true` asks it to stop.
    wake: (Mutex<bool>, Condvar),
}

/// An open operation log (see the crate docs).
pub struct Journal {
    inner: Arc<Inner>,
    syncer: Option<std::thread::JoinHandle<()>>,
    /// Holds the directory's `LOCK` while open.
    lock_file: File,
}

/// The mode of every file the journal creates: the log holds the whole
/// namespace (and the storage servers' capability keys), for its owner
/// only. Given at creation (so no umask can widen it) and set again on
/// files found wider.
pub const FILE_MODE: u32 = 0o600;

/// Sets [`FILE_MODE`] on the file at `path` if others may read or write
/// it, with a warning: a file created by an older build under a lax umask,
/// or changed by hand. One that cannot be changed is only warned about.
pub fn make_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 == 0 {
        return;
    }
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(FILE_MODE)) {
        Ok(()) => tracing::warn!(
            "{}: its mode was {mode:o}, open to others; set it to {FILE_MODE:o}",
            path.display()
        ),
        Err(e) => tracing::warn!(
            "{}: its mode is {mode:o}, open to others, and cannot be set to {FILE_MODE:o}: {e}",
            path.display()
        ),
    }
}

/// Takes `dir/LOCK` for this process, or says who has it.
fn lock_dir(dir: &Path) -> Result<File, JournalError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("LOCK");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(FILE_MODE)
        .open(&path)
        .map_err(io_err(&path))?;
    make_private(&path);
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            JournalError::Locked {
                path: dir.to_path_buf(),
            }
        } else {
            JournalError::Io { path, error: e }
        });
    }
    Ok(f)
}

/// Locks `m`, also when a thread panicked while holding it: the
/// workspace's one policy for a poisoned lock (`nodekernel_proto::sync`,
/// ARCHITECTURE.md), here in a crate that depends on no other of ours.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn segment_name(first_seq: u64) -> String {
    format!("journal-{first_seq:020}.log")
}

/// The segments in `dir`, by first seq.
fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, JournalError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(seq) = name
            .strip_prefix("journal-")
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((seq, entry.path()));
    }
    out.sort();
    Ok(out)
}

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

fn checksum(len: u32, seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends one record to `buf`.
fn encode_record(buf: &mut Vec<u8>, seq: u64, payload: &[u8]) {
    let len = payload.len() as u32;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&checksum(len, seq, payload).to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + align8(payload.len()) - payload.len(), 0);
}

/// The record at `off` of `data`, if it is whole and its checksum holds:
/// (seq, payload, where the next record starts).
fn record_at(data: &[u8], off: usize) -> Option<(u64, &[u8], usize)> {
    let head = data.get(off..off.checked_add(RECORD_HEADER)?)?;
    let len = u32::from_le_bytes(head[0..4].try_into().ok()?);
    let crc = u32::from_le_bytes(head[4..8].try_into().ok()?);
    let seq = u64::from_le_bytes(head[8..16].try_into().ok()?);
    if len as usize > MAX_RECORD {
        return None;
    }
    let start = off + RECORD_HEADER;
    let payload = data.get(start..start.checked_add(len as usize)?)?;
    if checksum(len, seq, payload) != crc {
        return None;
    }
    Some((seq, payload, off + align8(RECORD_HEADER + len as usize)))
}

/// What replays one record (its seq and payload), or says why it cannot.
type Replay<'a> = dyn FnMut(u64, &[u8]) -> Result<(), String> + 'a;

/// How a segment's scan ended.
enum Scanned {
    /// Every byte was read as records; the last one's padding ends at
    /// `end` (past the file's end when a crash cut only padding).
    Clean { next_seq: u64, end: usize },
    /// A damaged record at `offset`, nothing valid after it.
    DamagedTail { next_seq: u64, offset: usize },
}

/// Replays the records of one segment, which must start with `first_seq`.
fn scan(
    path: &Path,
    data: &[u8],
    first_seq: u64,
    each: &mut Replay<'_>,
    replayed: &mut u64,
) -> Result<Scanned, JournalError> {
    let corrupt = |offset: usize, reason: String| JournalError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    if data.len() < SEGMENT_HEADER {
        // A segment whose header never got written whole (a crash right
        // after it was created) holds nothing.
        return Ok(Scanned::DamagedTail {
            next_seq: first_seq,
            offset: 0,
        });
    }
    if data[..8] != MAGIC {
        return Err(corrupt(
            0,
            "not an operation log segment (bad magic)".into(),
        ));
    }
    let version = u32::from_le_bytes(data[8..12].try_into().unwrap_or_default());
    if version != FORMAT_VERSION {
        return Err(corrupt(
            8,
            format!("format version {version}; this build reads version {FORMAT_VERSION}"),
        ));
    }
    let head_seq = u64::from_le_bytes(data[16..24].try_into().unwrap_or_default());
    if head_seq != first_seq {
        return Err(corrupt(
            16,
            format!("the header says it starts at record {head_seq}, its name says {first_seq}"),
        ));
    }
    let mut off = SEGMENT_HEADER;
    let mut next = first_seq;
    while off < data.len() {
        match record_at(data, off) {
            Some((seq, payload, end)) if seq == next => {
                each(seq, payload).map_err(|reason| JournalError::Rejected {
                    path: path.to_path_buf(),
                    seq,
                    reason,
                })?;
                *replayed += 1;
                next += 1;
                off = end;
            }
            _ => {
                // Damage. Is it the tail, or do valid records follow?
                let mut probe = off + 8;
                while probe + RECORD_HEADER <= data.len() {
                    // The seq first: garbage rarely passes it, and then
                    // no checksum is computed.
                    let seq = u64::from_le_bytes(
                        data[probe + 8..probe + 16].try_into().unwrap_or_default(),
                    );
                    if seq >= next && seq - next < 1 << 32 && record_at(data, probe).is_some() {
                        return Err(corrupt(
                            off,
                            format!(
                                "record {next} is damaged but valid records follow (record {seq} at byte {probe}); refusing to cut acknowledged changes: restore the file from a backup or move it away"
                            ),
                        ));
                    }
                    probe += 8;
                }
                return Ok(Scanned::DamagedTail {
                    next_seq: next,
                    offset: off,
                });
            }
        }
    }
    Ok(Scanned::Clean {
        next_seq: next,
        end: off,
    })
}

/// What is wrong with a segment `len` bytes long, first record `first`,
/// that ends too early.
fn damage(len: u64, scanned: &Scanned, first: u64) -> String {
    match *scanned {
        _ if len == 0 => "is empty".into(),
        _ if len < SEGMENT_HEADER as u64 => {
            format!("is {len} bytes long, shorter than a segment header ({SEGMENT_HEADER} bytes)")
        }
        Scanned::DamagedTail { next_seq, offset } => {
            format!("has a damaged record {next_seq} at byte {offset}")
        }
        Scanned::Clean { next_seq, .. } if next_seq == first => {
            "holds only its header, no record".into()
        }
        Scanned::Clean { next_seq, .. } => format!("ends after record {}", next_seq - 1),
    }
}

/// Creates segment `first_seq` in `dir` (header written and synced, and
/// the directory entry too).
fn create_segment(dir: &Path, first_seq: u64) -> Result<(File, PathBuf), JournalError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(segment_name(first_seq));
    let mut file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode(FILE_MODE)
        .open(&path)
        .map_err(io_err(&path))?;
    let mut head = Vec::with_capacity(SEGMENT_HEADER);
    head.extend_from_slice(&MAGIC);
    head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    head.extend_from_slice(&first_seq.to_le_bytes());
    file.write_all(&head).map_err(io_err(&path))?;
    file.sync_all().map_err(io_err(&path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok((file, path))
}

/// Reads the records after `after` up to `upto` (inclusive) from the
/// segments in `dir` that hold nothing later, without opening the log: a
/// checkpoint is built from them in the background while the open log goes
/// on in a newer segment (see [`Journal::rotate`]). Any damage, or a
/// missing record, is an error. Returns how many records were read.
pub fn read_records(
    dir: &Path,
    after: u64,
    upto: u64,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<u64, JournalError> {
    let segs = segments(dir)?;
    let mut read = 0;
    let mut next = after + 1;
    for (i, (first, path)) in segs.iter().enumerate() {
        let end = segs.get(i + 1).map(|(n, _)| *n);
        if end.is_some_and(|e| e <= next) || *first > upto {
            continue; // entirely before or after the range
        }
        let file = File::open(path).map_err(io_err(path))?;
        // SAFETY: a segment before the one being written: nothing writes
        // it any more.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(path))?;
        let mut keep = |seq: u64, payload: &[u8]| {
            if seq == next && seq <= upto {
                next += 1;
                read += 1;
                each(seq, payload)
            } else {
                Ok(())
            }
        };
        let mut scanned = 0;
        match scan(path, &map, *first, &mut keep, &mut scanned)? {
            Scanned::Clean { .. } => {}
            Scanned::DamagedTail { offset, .. } => {
                return Err(JournalError::Corrupt {
                    path: path.clone(),
                    offset: offset as u64,
                    reason: "damaged in a segment that is no longer written".into(),
                })
            }
        }
    }
    if next <= upto {
        return Err(JournalError::Corrupt {
            path: dir.to_path_buf(),
            offset: 0,
            reason: format!("records {next} to {upto} are missing"),
        });
    }
    Ok(read)
}

impl Journal {
    /// Opens the log in `dir` (created if missing), replaying every record
    /// after `after` through `each` in order, and cutting a damaged tail
    /// (see the crate docs). New records continue the numbering. `after`
    /// is what a checkpoint already holds (0: none): segments may still
    /// hold records up to it (a crash before they were removed), which are
    /// skipped, but the log must go on right after it. `floor` is a record
    /// the log is known to have held on stable storage (0: none, a new
    /// log; see [`Journal::synced`]): a log that ends before it lost
    /// records that no crash can tear (its only segment emptied, cut to its
    /// header or removed), and the open fails with [`JournalError::Lost`]
    /// before changing any file.
    pub fn open(
        dir: &Path,
        policy: Fsync,
        after: u64,
        floor: u64,
        mut each: impl FnMut(u64, &[u8]) -> Result<(), String>,
    ) -> Result<(Journal, Recovery), JournalError> {
        // Private (0700), like every directory NodeKernel creates.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .map_err(io_err(dir))?;
        let lock = lock_dir(dir)?;
        let segs = segments(dir)?;
        let mut rec = Recovery {
            records: 0,
            cut: None,
        };
        if segs.is_empty() && floor > after {
            return Err(JournalError::Lost {
                path: dir.to_path_buf(),
                damage: "holds no segment".into(),
                ends: after,
                floor,
            });
        }
        let mut next = segs.first().map_or(after + 1, |(s, _)| *s);
        if next > after + 1 {
            return Err(JournalError::Corrupt {
                path: segs[0].1.clone(),
                offset: 0,
                reason: format!(
                    "the log starts at record {next}, but the checkpoint holds records up to {after} only: records in between are missing"
                ),
            });
        }
        let mut each = |seq: u64, payload: &[u8]| {
            if seq > after {
                each(seq, payload)
            } else {
                Ok(())
            }
        };
        let mut tail: Option<(PathBuf, u64)> = None;
        for (i, (first, path)) in segs.iter().enumerate() {
            if *first != next {
                return Err(JournalError::Corrupt {
                    path: path.clone(),
                    offset: 0,
                    reason: format!(
                        "starts at record {first}, but the segments before it end at record {}",
                        next - 1
                    ),
                });
            }
            make_private(path);
            let file = File::open(path).map_err(io_err(path))?;
            let len = file.metadata().map_err(io_err(path))?.len();
            // SAFETY: the journal's own files, which nothing else writes
            // while it is open; the map is dropped before they are changed.
            let map = match len {
                0 => None,
                _ => Some(unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(path))?),
            };
            let data: &[u8] = map.as_deref().unwrap_or(&[]);
            let last = i + 1 == segs.len();
            let scanned = scan(path, data, *first, &mut each, &mut rec.records)?;
            if last {
                let (Scanned::Clean { next_seq, .. } | Scanned::DamagedTail { next_seq, .. }) =
                    scanned;
                if next_seq <= floor {
                    return Err(JournalError::Lost {
                        path: path.clone(),
                        damage: damage(len, &scanned, *first),
                        ends: next_seq - 1,
                        floor,
                    });
                }
            }
            match scanned {
                Scanned::Clean { next_seq, end } => {
                    next = next_seq;
                    if last && end as u64 != len {
                        // Only padding was cut: restore it, so the next
                        // record starts aligned.
                        drop(map);
                        let f = OpenOptions::new()
                            .write(true)
                            .open(path)
                            .map_err(io_err(path))?;
                        f.set_len(end as u64).map_err(io_err(path))?;
                    }
                }
                Scanned::DamagedTail { next_seq, offset } if last => {
                    next = next_seq;
                    let keep = offset as u64;
                    if offset < SEGMENT_HEADER {
                        // No whole header: start the segment again.
                        drop(map);
                        std::fs::remove_file(path).map_err(io_err(path))?;
                        tracing::warn!(
                            "operation log {}: cut a segment without a whole header ({len} bytes)",
                            path.display()
                        );
                        rec.cut = Some(Cut {
                            path: path.clone(),
                            offset: 0,
                            bytes: len,
                        });
                        continue;
                    }
                    drop(map);
                    let f = OpenOptions::new()
                        .write(true)
                        .open(path)
                        .map_err(io_err(path))?;
                    f.set_len(keep).map_err(io_err(path))?;
                    f.sync_all().map_err(io_err(path))?;
                    tracing::warn!(
                        "operation log {}: cut a damaged tail of {} bytes at byte {keep} (a write the crash tore; records 1 to {} are intact)",
                        path.display(),
                        len - keep,
                        next - 1
                    );
                    rec.cut = Some(Cut {
                        path: path.clone(),
                        offset: keep,
                        bytes: len - keep,
                    });
                }
                Scanned::DamagedTail { offset, .. } => {
                    return Err(JournalError::Corrupt {
                        path: path.clone(),
                        offset: offset as u64,
                        reason: format!(
                            "record {next} is damaged, and later segments follow; refusing to cut acknowledged changes"
                        ),
                    })
                }
            }
            tail = Some((path.clone(), *first));
        }
        if next <= after {
            return Err(JournalError::Corrupt {
                path: dir.to_path_buf(),
                offset: 0,
                reason: format!(
                    "the log ends at record {}, but the checkpoint holds records up to {after}: the log belongs to an older state",
                    next - 1
                ),
            });
        }
        let ((file, path), first_seq) = match tail {
            Some((path, first)) => {
                let f = OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .map_err(io_err(&path))?;
                f.sync_data().map_err(io_err(&path))?;
                ((f, path), first)
            }
            None => (create_segment(dir, next)?, next),
        };
        let bytes = file.metadata().map_err(io_err(&path))?.len();
        let inner = Arc::new(Inner {
            policy,
            dir: dir.to_path_buf(),
            writer: Mutex::new(Writer {
                file: Arc::new(file),
                first_seq,
                bytes,
                path,
                next_seq: next,
                buf: Vec::new(),
                closed: false,
            }),
            written: AtomicU64::new(next - 1),
            synced: watch::Sender::new(Synced {
                upto: next - 1,
                failed: false,
            }),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            wake: (Mutex::new(false), Condvar::new()),
        });
        let syncer = match policy {
            Fsync::Never => None,
            Fsync::Always | Fsync::Interval(_) => {
                let inner = inner.clone();
                Some(
                    std::thread::Builder::new()
                        .name("nk-journal-sync".into())
                        .spawn(move || sync_loop(&inner, next - 1))
                        .map_err(io_err(dir))?,
                )
            }
        };
        Ok((
            Journal {
                inner,
                syncer,
                lock_file: lock,
            },
            rec,
        ))
    }

    /// Writes one record and returns its seq. Callers that must keep an
    /// order (the state's) call this under the lock that orders them. After
    /// a failed write the journal takes nothing more.
    pub fn append(&self, payload: &[u8]) -> Result<u64, JournalError> {
        if payload.len() > MAX_RECORD {
            return Err(JournalError::TooLarge(payload.len()));
        }
        self.check()?;
        let mut w = lock(&self.inner.writer);
        if w.closed {
            return Err(JournalError::Failed("the log was closed".into()));
        }
        let seq = w.next_seq;
        let Writer {
            file, path, buf, ..
        } = &mut *w;
        buf.clear();
        encode_record(buf, seq, payload);
        if let Err(e) = (&**file).write_all(buf) {
            let msg = format!("writing record {seq} to {}: {e}", path.display());
            drop(w);
            self.inner.fail(msg.clone());
            return Err(JournalError::Failed(msg));
        }
        w.next_seq += 1;
        w.bytes += w.buf.len() as u64;
        self.inner.written.store(seq, Ordering::Release);
        drop(w);
        if self.inner.policy == Fsync::Always {
            // Under the lock, so the sync thread cannot miss it between
            // its check of `written` and its wait.
            let _g = lock(&self.inner.wake.0);
            self.inner.wake.1.notify_one();
        }
        Ok(seq)
    }

    /// Bytes in the segment written now.
    pub fn segment_bytes(&self) -> u64 {
        lock(&self.inner.writer).bytes
    }

    /// Starts a new segment with the next record, after syncing the
    /// current one, and returns the new segment's first seq. Callers keep
    /// their order lock, so every record up to `seq - 1` is in the older
    /// segments: once a checkpoint holds them, [`Journal::remove_before`]
    /// deletes those.
    pub fn rotate(&self) -> Result<u64, JournalError> {
        let mut w = lock(&self.inner.writer);
        if w.closed {
            return Err(JournalError::Failed("the log was closed".into()));
        }
        w.file.sync_data().map_err(io_err(&w.path))?;
        let first = w.next_seq;
        if w.first_seq == first {
            return Ok(first); // nothing written since the last rotation
        }
        let (file, path) = create_segment(&self.inner.dir, first)?;
        w.file = Arc::new(file);
        w.path = path;
        w.first_seq = first;
        w.bytes = SEGMENT_HEADER as u64;
        Ok(first)
    }

    /// Deletes the segments that hold only records before `seq` (which a
    /// checkpoint now holds). Returns how many went; none once the log is
    /// closed (a new opener may be reading them).
    pub fn remove_before(&self, seq: u64) -> Result<usize, JournalError> {
        if lock(&self.inner.writer).closed {
            return Ok(0);
        }
        let dir = &self.inner.dir;
        let segs = segments(dir)?;
        let mut removed = 0;
        for (i, (_, path)) in segs.iter().enumerate() {
            // A segment ends where the next one starts.
            let ends_before = segs.get(i + 1).is_some_and(|(next, _)| *next <= seq);
            if ends_before {
                std::fs::remove_file(path).map_err(io_err(path))?;
                removed += 1;
            }
        }
        if removed > 0 {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(dir))?;
        }
        Ok(removed)
    }

    /// The seq of the last record written (0 when none).
    pub fn last(&self) -> u64 {
        self.inner.written.load(Ordering::Acquire)
    }

    /// The seq of the last record known to be on stable storage (synced by
    /// the policy or by [`Journal::sync`]; 0 when none): what a later
    /// [`Journal::open`] may demand as its `floor`.
    pub fn synced(&self) -> u64 {
        self.inner.synced.borrow().upto
    }

    /// Waits until record `seq` is as durable as the policy promises: on
    /// stable storage with [`Fsync::Always`], written otherwise.
    pub async fn durable(&self, seq: u64) -> Result<(), JournalError> {
        if self.inner.policy != Fsync::Always {
            return self.check();
        }
        let mut rx = self.inner.synced.subscribe();
        let s = *rx
            .wait_for(|s| s.upto >= seq || s.failed)
            .await
            .map_err(|_| JournalError::Failed("the sync thread stopped".into()))?;
        if s.upto >= seq {
            Ok(())
        } else {
            self.check()
        }
    }

    /// `Err` once a write or sync failed.
    pub fn check(&self) -> Result<(), JournalError> {
        if !self.inner.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let why = lock(&self.inner.failure).clone().unwrap_or_default();
        Err(JournalError::Failed(why))
    }

    /// Syncs everything written so far, now (blocking).
    pub fn sync(&self) -> Result<(), JournalError> {
        self.check()?;
        let w = lock(&self.inner.writer);
        let upto = w.next_seq - 1;
        w.file.sync_data().map_err(io_err(&w.path))?;
        drop(w);
        self.inner.synced.send_modify(|s| s.upto = s.upto.max(upto));
        Ok(())
    }
}

impl Journal {
    /// Closes the log for good, even while others still hold it: later
    /// appends fail, everything written is synced, and the directory's
    /// `LOCK` is released, so a new journal (a restarted server in the
    /// same process) may open it at once.
    pub fn close(&self) -> Result<(), JournalError> {
        use std::os::fd::AsRawFd;
        let mut w = lock(&self.inner.writer);
        if w.closed {
            return Ok(());
        }
        w.closed = true;
        let synced = w.file.sync_data().map_err(io_err(&w.path));
        drop(w);
        self.inner.stop("the log was closed".into());
        // SAFETY: flock on a descriptor we own.
        unsafe { libc::flock(self.lock_file.as_raw_fd(), libc::LOCK_UN) };
        synced
    }
}

impl Inner {
    fn fail(&self, msg: String) {
        tracing::error!("operation log: {msg}; no more changes are accepted");
        self.stop(msg);
    }

    /// Refuses every later append and wakes the waiters.
    fn stop(&self, msg: String) {
        lock(&self.failure).get_or_insert(msg);
        self.failed.store(true, Ordering::Release);
        self.synced.send_modify(|s| s.failed = true);
    }
}

/// The sync thread: with `Always`, syncs whenever records were written
/// since the last sync (each sync covers all of them: group commit); with
/// `Interval`, once per interval.
/// `synced`: the last record synced at open (records written before the
/// thread first runs are not).
fn sync_loop(inner: &Inner, mut synced: u64) {
    loop {
        let stop = {
            let (m, cv) = &inner.wake;
            let mut stop = lock(m);
            match inner.policy {
                Fsync::Interval(d) => {
                    if !*stop {
                        stop = cv
                            .wait_timeout(stop, d)
                            .map_or_else(|p| p.into_inner().0, |r| r.0);
                    }
                }
                _ => {
                    while !*stop && inner.written.load(Ordering::Acquire) <= synced {
                        stop = cv.wait(stop).unwrap_or_else(|p| p.into_inner());
                    }
                }
            }
            *stop
        };
        // The segment and `written` read together: a rotation syncs the
        // old segment itself, so syncing the current one covers `target`.
        let (file, target) = {
            let w = lock(&inner.writer);
            (w.file.clone(), inner.written.load(Ordering::Acquire))
        };
        if target > synced {
            if let Err(e) = file.sync_data() {
                inner.fail(format!("syncing: {e}"));
                return;
            }
            synced = target;
            inner.synced.send_modify(|s| s.upto = s.upto.max(target));
        }
        if stop {
            return;
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        *lock(&self.inner.wake.0) = true;
        self.inner.wake.1.notify_all();
        if let Some(t) = self.syncer.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_aligned_and_checked() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 7, b"hello");
        assert_eq!(buf.len(), 24);
        assert_eq!(record_at(&buf, 0), Some((7, &b"hello"[..], 24)));
        for i in 0..buf.len() - 3 {
            // Padding is not covered: damage there is harmless.
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            assert_eq!(record_at(&bad, 0), None, "a flip at byte {i} went unseen");
        }
        assert_eq!(record_at(&buf[..20], 0), None);
    }

    #[test]
    fn an_oversized_length_is_refused_before_reading() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 1, b"x");
        buf[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(record_at(&buf, 0), None);
    }
}

//! Data directories, locks and identities: which bytes on disk belong to
//! which server.
//!
//! # Layout
//!
//! A storage server may have a *data directory*
//! ([`StoreConfig::data_dir`](crate::StoreConfig::data_dir)). It holds:
//!
//! * `LOCK`: an exclusive `flock` held for the life of the server, and the
//!   holder's pid (for the message a second server gets);
//! * `identity`: the server's stable identity, [`IDENTITY_LEN`] lowercase
//!   hexadecimal digits and a newline, made at the first start and read at
//!   every later one (a corrupt file refuses to start, naming it);
//! * `blocks`: the block file of a file medium, unless its path is absolute.
//!
//! A *persistent* server
//! ([`StoreConfig::persistent`](crate::StoreConfig::persistent)) also keeps
//! there (see [`persist`](crate::persist) for formats and the rule that
//! decides at start whether the blocks are kept):
//!
//! * `store-state`: 64 checksummed bytes: incarnation, boot id, medium,
//!   block size, block count, and whether the last stop was clean;
//! * `gens` (file medium): the block generations, one `u64` per block,
//!   mapped shared;
//! * `dram` (DRAM medium): the shared region (header, control words,
//!   generations, data) as a regular file mapped shared, instead of a memfd;
//! * `address`: the data port's last bound address.
//!
//! A server without a data directory gets a random identity per start.
//!
//! # Exclusive use
//!
//! Every data directory ([`DirLock`]) and every block file is locked with
//! `flock(LOCK_EX | LOCK_NB)` on an open descriptor. A data directory's lock
//! is held until the server shuts down (so a new server can take over the
//! directory at once); a block file's, until its medium is closed (the
//! server is dropped). The lock is taken before anything is truncated, resized or
//! written, so a second server on the same directory or file refuses to
//! start ([`StoreError::Locked`]) and changes nothing. After locking, the
//! path is checked to still name the locked file (a process that gave up may
//! have removed it in between), so removing a lock file while holding its
//! lock is safe.
//!
//! # Modes
//!
//! Directories are created 0700, files 0600. The mode is passed at creation
//! (the umask can only narrow it) and set again explicitly, so that a
//! restrictive umask cannot leave the owner locked out either. Block files
//! that existed before are set to 0600 too. Existing directories are left
//! as they are; what is created inside them is private.
//!
//! # Clean-up
//!
//! A failed start removes what that start created (block file, identity,
//! `LOCK`, the persistent files above, directories that did not exist
//! before) and nothing else: never a file that existed before, never a
//! file locked by another process (everything is removed while this process
//! still holds the lock).
//!
//! A stopped *volatile* server removes its block file if that start created
//! it or it lies in the data directory (a pre-existing block file elsewhere
//! is kept), keeps its data directory, `LOCK` and `identity`, and removes a
//! private directory ([`DirLock::private`]) entirely. A process that is
//! killed cleans up nothing: its private directory stays under
//! `<temp dir>/nodekernel-<uid>` until removed by hand, and a later
//! volatile server reuses (and truncates) a block file it left in a kept
//! data directory.
//!
//! A stopped *persistent* server removes nothing: it syncs its blocks and
//! generations and marks its stop clean in `store-state`. The next start
//! keeps the block file, `gens` and `dram` as they are when the rule allows
//! it, and otherwise removes `store-state` first, then empties them (a
//! persistent server needs a data directory of its own: `validate` refuses
//! a private one).

use crate::StoreError;
use nodekernel_proto::sync;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Name of the lock file in a data directory.
pub const LOCK_FILE: &str = "LOCK";
/// Name of the identity file in a storage server's data directory.
pub const IDENTITY_FILE: &str = "identity";
/// Default name of a file medium's block file in its data directory.
pub const BLOCK_FILE: &str = "blocks";
/// Length of an identity: lowercase hexadecimal digits (128 random bits).
pub const IDENTITY_LEN: usize = 32;

/// Mode of every directory NodeKernel creates.
const DIR_MODE: u32 = 0o700;
/// Mode of every file NodeKernel creates (block, lock and identity files).
const FILE_MODE: u32 = 0o600;

/// How often locking retries when the file keeps being replaced.
const LOCK_ATTEMPTS: usize = 16;

/// The hint a refused data directory gets.
const DIR_HINT: &str = "give each server its own --data-dir";
/// The hint a refused block file gets.
const FILE_HINT: &str = "give each file store its own block file (--path)";

use nodekernel_rpc::random_bytes;

/// A fresh random identity: [`IDENTITY_LEN`] lowercase hexadecimal digits.
pub(crate) fn random_identity() -> io::Result<String> {
    let mut b = [0u8; IDENTITY_LEN / 2];
    random_bytes(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// A random, nonzero incarnation number.
pub(crate) fn random_incarnation() -> io::Result<u64> {
    loop {
        let mut b = [0u8; 8];
        random_bytes(&mut b)?;
        let v = u64::from_le_bytes(b);
        if v != 0 {
            return Ok(v);
        }
    }
}

/// Sets the permission bits of something this process created or owns; a
/// file system that cannot (some FUSE or FAT mounts) only gets a warning.
fn restrict(file: &File, path: &Path, mode: u32) {
    if let Err(e) = file.set_permissions(std::fs::Permissions::from_mode(mode)) {
        tracing::warn!("cannot set the mode of {} to {mode:o}: {e}", path.display());
    }
}

fn restrict_path(path: &Path, mode: u32) {
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        tracing::warn!("cannot set the mode of {} to {mode:o}: {e}", path.display());
    }
}

/// Creates `dir` and its missing parents (mode 0700) and returns the ones
/// it created, outermost first. On error, removes them again.
pub(crate) fn create_dirs(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur.filter(|d| !d.as_os_str().is_empty()) {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(StoreError::io(
                    "use as a directory",
                    d,
                    io::Error::from_raw_os_error(libc::ENOTDIR),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(d);
                cur = d.parent();
            }
            Err(e) => return Err(StoreError::io("inspect", d, e)),
        }
    }
    let mut created = Vec::new();
    for d in missing.into_iter().rev() {
        match DirBuilder::new().mode(DIR_MODE).create(d) {
            Ok(()) => {
                restrict_path(d, DIR_MODE);
                created.push(d.to_path_buf());
            }
            // Made by someone else meanwhile: theirs, not ours to remove.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => {
                remove_dirs(&created);
                return Err(StoreError::io("create directory", d, e));
            }
        }
    }
    Ok(created)
}

/// Removes directories created by [`create_dirs`], innermost first, as far
/// as they are empty.
pub(crate) fn remove_dirs(created: &[PathBuf]) {
    for d in created.iter().rev() {
        if let Err(e) = std::fs::remove_dir(d) {
            tracing::debug!("leaving directory {}: {e}", d.display());
        }
    }
}

fn remove_file(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("cannot remove {}: {e}", path.display()),
    }
}

/// The outcome of [`lock_file`].
pub(crate) enum Lock {
    /// The file is ours; `created` says whether this call created it.
    Held { file: File, created: bool },
    /// Another open file description holds the lock.
    Busy { file: File },
}

/// Opens (creating it with mode 0600 if missing) and locks `path` with
/// `flock(LOCK_EX | LOCK_NB)`, without truncating or writing anything.
pub(crate) fn lock_file(path: &Path) -> Result<Lock, StoreError> {
    for _ in 0..LOCK_ATTEMPTS {
        let (file, created) = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(path)
        {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                match OpenOptions::new().read(true).write(true).open(path) {
                    Ok(f) => (f, false),
                    // Removed between the two opens: start over.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(StoreError::io("open", path, e)),
                }
            }
            Err(e) => return Err(StoreError::io("create", path, e)),
        };
        // SAFETY: flock on a descriptor this function owns; it touches no
        // memory.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => Ok(Lock::Busy { file }),
                _ => Err(StoreError::io("lock", path, e)),
            };
        }
        // The holder before us may have removed the file after we opened it
        // and before we locked it: then we locked an orphan. Check that the
        // path still names what we hold.
        let held = file
            .metadata()
            .map_err(|e| StoreError::io("inspect", path, e))?;
        match std::fs::metadata(path) {
            Ok(m) if m.dev() == held.dev() && m.ino() == held.ino() => {
                if created {
                    restrict(&file, path, FILE_MODE);
                }
                return Ok(Lock::Held { file, created });
            }
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(StoreError::io("inspect", path, e)),
        }
    }
    Err(StoreError::io(
        "lock",
        path,
        io::Error::other("the file was replaced again and again while locking it"),
    ))
}

/// The pid holding an `flock` on `file`'s inode, from `/proc/locks`.
pub(crate) fn lock_holder(file: &File) -> Option<u32> {
    let m = file.metadata().ok()?;
    let want = format!(
        "{:02x}:{:02x}:{}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    );
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; waiters have "->"
    // after the number and are skipped.
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() >= 6 && f[1] == "FLOCK" && f[5] == want)
            .then(|| f[4].parse().ok())
            .flatten()
    })
}

/// The pid recorded in a `LOCK` file.
fn recorded_pid(file: &File) -> Option<u32> {
    let mut buf = [0u8; 32];
    let n = file.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// Opens and locks a block file (creating it and its parent directories,
/// mode 0700/0600, if missing) without changing its contents.
pub(crate) fn lock_block_file(path: &Path) -> Result<BlockFile, StoreError> {
    let created_dirs = match path.parent() {
        Some(dir) => create_dirs(dir)?,
        None => Vec::new(),
    };
    match lock_file(path) {
        Ok(Lock::Held { file, created }) => {
            if !created {
                // Someone else's old file: it is about to hold our blocks.
                restrict(&file, path, FILE_MODE);
            }
            Ok(BlockFile {
                path: path.to_path_buf(),
                lock: Arc::new(file),
                created,
                created_dirs,
            })
        }
        Ok(Lock::Busy { file }) => {
            remove_dirs(&created_dirs);
            Err(StoreError::Locked {
                what: "block file",
                path: path.to_path_buf(),
                holder: lock_holder(&file),
                hint: FILE_HINT,
            })
        }
        Err(e) => {
            remove_dirs(&created_dirs);
            Err(e)
        }
    }
}

/// A locked block file and what locking it created.
#[derive(Clone)]
pub(crate) struct BlockFile {
    pub(crate) path: PathBuf,
    /// The descriptor holding the lock (shared with the medium).
    pub(crate) lock: Arc<File>,
    /// Whether the file did not exist before.
    pub(crate) created: bool,
    /// Parent directories created for it, outermost first.
    pub(crate) created_dirs: Vec<PathBuf>,
}

impl BlockFile {
    /// Removes what locking created (while the lock is still held).
    pub(crate) fn undo(&self) {
        if self.created {
            remove_file(&self.path);
        }
        remove_dirs(&self.created_dirs);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The start using it has not finished: dropping undoes it.
    Starting,
    /// In use by a running server.
    Running,
    /// Stopped or undone.
    Done,
}

/// A directory locked for this process's exclusive use: its `LOCK` file
/// holds an exclusive `flock` (and this process's pid) until it is
/// stopped, undone or dropped.
///
/// Until [`started`](Self::started) is called, dropping it (or
/// [`undo`](Self::undo)) removes what acquiring it created: the `LOCK` file
/// and directories that did not exist, or the whole directory if it is
/// [`private`](Self::private). After that, [`stop`](Self::stop) (or
/// dropping it) removes a private directory entirely and leaves any other
/// one in place.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    /// The open `LOCK` file holding the lock.
    file: File,
    /// Directories created by [`acquire`](Self::acquire), outermost first.
    created_dirs: Vec<PathBuf>,
    /// Files created inside by this start, in creation order.
    created_files: Mutex<Vec<PathBuf>>,
    private: bool,
    state: Mutex<State>,
}

impl DirLock {
    /// Locks `dir`, creating it (and missing parents, mode 0700) if needed,
    /// and records this process's pid in its `LOCK` file. Fails with
    /// [`StoreError::Locked`], having changed nothing, if another process
    /// (or another server of this one) holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, StoreError> {
        let created_dirs = create_dirs(dir)?;
        DirLock::lock(dir, created_dirs, false)
    }

    /// Makes and locks a fresh private directory for this process only,
    /// `<temp dir>/nodekernel-<uid>/<kind>-<pid>-<random>` (mode 0700; the
    /// temp dir is `$TMPDIR` or `/tmp`). It is removed entirely when this
    /// lock stops or is dropped. Refuses a `nodekernel-<uid>` that is a
    /// symbolic link, belongs to another user, or is writable by others.
    pub fn private(kind: &str) -> Result<DirLock, StoreError> {
        let base = private_base()?;
        for _ in 0..LOCK_ATTEMPTS {
            let mut r = [0u8; 8];
            random_bytes(&mut r).map_err(|e| StoreError::io("generate a name in", &base, e))?;
            let dir = base.join(format!(
                "{kind}-{}-{:016x}",
                std::process::id(),
                u64::from_le_bytes(r)
            ));
            match DirBuilder::new().mode(DIR_MODE).create(&dir) {
                Ok(()) => {
                    restrict_path(&dir, DIR_MODE);
                    return DirLock::lock(&dir, vec![dir.clone()], true);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(StoreError::io("create directory", &dir, e)),
            }
        }
        Err(StoreError::io(
            "create a private directory in",
            &base,
            io::Error::other("every name tried already exists"),
        ))
    }

    fn lock(dir: &Path, created_dirs: Vec<PathBuf>, private: bool) -> Result<DirLock, StoreError> {
        let path = dir.join(LOCK_FILE);
        let (file, created) = match lock_file(&path) {
            Ok(Lock::Held { file, created }) => (file, created),
            Ok(Lock::Busy { file }) => {
                remove_dirs(&created_dirs);
                return Err(StoreError::Locked {
                    what: "data directory",
                    path: dir.to_path_buf(),
                    holder: lock_holder(&file).or_else(|| recorded_pid(&file)),
                    hint: DIR_HINT,
                });
            }
            Err(e) => {
                remove_dirs(&created_dirs);
                return Err(e);
            }
        };
        // From here on, dropping `lock` undoes what was created.
        let lock = DirLock {
            path: dir.to_path_buf(),
            file,
            created_dirs,
            created_files: Mutex::new(if created { vec![path.clone()] } else { vec![] }),
            private,
            state: Mutex::new(State::Starting),
        };
        let pid = format!("{}\n", std::process::id());
        lock.file
            .set_len(0)
            .and_then(|()| lock.file.write_all_at(pid.as_bytes(), 0))
            .map_err(|e| StoreError::io("write", &path, e))?;
        Ok(lock)
    }

    /// The locked directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is a private directory, removed when it stops.
    pub fn is_private(&self) -> bool {
        self.private
    }

    /// Records that the start using this directory succeeded: from now on
    /// dropping it stops it instead of undoing it.
    pub fn started(&self) {
        let mut st = sync::lock(&self.state);
        if *st == State::Starting {
            *st = State::Running;
        }
    }

    /// Stops using the directory: a private one is removed entirely, any
    /// other one stays (with its `LOCK` file). Before
    /// [`started`](Self::started), the same as [`undo`](Self::undo). Then
    /// releases the lock, so another server may use the directory at once.
    /// Idempotent; also done on drop.
    pub fn stop(&self) {
        self.finish(false);
    }

    /// Removes what acquiring the directory (and the start using it)
    /// created: a private directory entirely; otherwise the files noted as
    /// created and the directories that did not exist before. Then releases
    /// the lock. After [`stop`](Self::stop), nothing. Idempotent.
    pub fn undo(&self) {
        self.finish(true);
    }

    fn finish(&self, undo: bool) {
        let mut st = sync::lock(&self.state);
        let undo = match *st {
            State::Done => return,
            State::Starting => true,
            State::Running => undo,
        };
        *st = State::Done;
        if self.private {
            match std::fs::remove_dir_all(&self.path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("cannot remove {}: {e}", self.path.display()),
            }
        } else if undo {
            let files = sync::lock(&self.created_files);
            for f in files.iter().rev() {
                remove_file(f);
            }
            remove_dirs(&self.created_dirs);
        }
        // Another server may use the directory from now on (what is left of
        // it: removals are done).
        // SAFETY: flock on the descriptor this lock owns; it touches no
        // memory.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }

    /// Notes a file created inside by the current start, for
    /// [`undo`](Self::undo).
    pub fn note_created(&self, path: PathBuf) {
        sync::lock(&self.created_files).push(path);
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        self.finish(false);
    }
}

/// `<temp dir>/nodekernel-<uid>`, created 0700 if missing and checked to be
/// private to this user otherwise.
fn private_base() -> Result<PathBuf, StoreError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let base = std::env::temp_dir().join(format!("nodekernel-{uid}"));
    match DirBuilder::new().mode(DIR_MODE).create(&base) {
        Ok(()) => restrict_path(&base, DIR_MODE),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StoreError::io("create directory", &base, e)),
    }
    let m = std::fs::symlink_metadata(&base).map_err(|e| StoreError::io("inspect", &base, e))?;
    let unsafe_dir = |reason: String| StoreError::Unsafe {
        path: base.clone(),
        reason,
    };
    if m.file_type().is_symlink() {
        return Err(unsafe_dir("it is a symbolic link".into()));
    }
    if !m.is_dir() {
        return Err(unsafe_dir("it is not a directory".into()));
    }
    if m.uid() != uid {
        return Err(unsafe_dir(format!(
            "it belongs to uid {}, not to this user (uid {uid})",
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "other users may write to it (mode {:o}); make it 0700",
            m.mode() & 0o7777
        )));
    }
    Ok(base)
}

/// A storage server's locked data directory and its identity.
#[derive(Debug)]
pub(crate) struct DataDir {
    lock: DirLock,
    identity: String,
}

impl DataDir {
    /// Locks `dir` (see [`DirLock::acquire`]) and reads or creates its
    /// identity.
    pub(crate) fn open(dir: &Path) -> Result<DataDir, StoreError> {
        DataDir::with_lock(DirLock::acquire(dir)?)
    }

    /// A fresh private data directory (see [`DirLock::private`]).
    pub(crate) fn private(kind: &str) -> Result<DataDir, StoreError> {
        DataDir::with_lock(DirLock::private(kind)?)
    }

    fn with_lock(lock: DirLock) -> Result<DataDir, StoreError> {
        let identity = load_or_create_identity(&lock)?;
        Ok(DataDir { lock, identity })
    }

    pub(crate) fn path(&self) -> &Path {
        self.lock.path()
    }

    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    pub(crate) fn lock(&self) -> &DirLock {
        &self.lock
    }
}

/// Checks the contents of an identity file; returns the identity or why it
/// is unusable.
fn parse_identity(bytes: &[u8]) -> Result<String, String> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if body.len() == IDENTITY_LEN && body.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        // All ASCII, checked above.
        return Ok(String::from_utf8_lossy(body).into_owned());
    }
    let shown: String = String::from_utf8_lossy(&bytes[..bytes.len().min(48)]).into_owned();
    Err(if bytes.is_empty() {
        "the file is empty".into()
    } else {
        format!(
            "expected {IDENTITY_LEN} lowercase hexadecimal digits and a newline, found {shown:?}{}",
            if bytes.len() > 48 { "..." } else { "" }
        )
    })
}

/// Reads the identity file of a locked data directory, or creates it
/// (mode 0600, written to a temporary name and renamed into place so it is
/// never seen half-written).
fn load_or_create_identity(lock: &DirLock) -> Result<String, StoreError> {
    let path = lock.path().join(IDENTITY_FILE);
    match File::open(&path) {
        Ok(f) => {
            let mut bytes = Vec::new();
            // An identity is 33 bytes; a larger file is corrupt either way.
            f.take(1024)
                .read_to_end(&mut bytes)
                .map_err(|e| StoreError::io("read", &path, e))?;
            return parse_identity(&bytes).map_err(|reason| StoreError::Identity {
                path: path.clone(),
                reason,
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::io("read", &path, e)),
    }
    let identity =
        random_identity().map_err(|e| StoreError::io("generate an identity for", &path, e))?;
    write_renamed(
        lock.path(),
        IDENTITY_FILE,
        format!("{identity}\n").as_bytes(),
    )
    .map_err(|e| StoreError::io("create", &path, e))?;
    lock.note_created(path);
    // Make the new name durable; losing it only costs a new identity.
    let _ = sync_dir(lock.path());
    Ok(identity)
}

/// Writes `name` in `dir` as `bytes`, so that it is never seen
/// half-written (a temporary file, mode 0600, synced and renamed into
/// place), then syncs the directory, so that the new version is the one a
/// machine crash leaves. On error the temporary file is removed.
pub(crate) fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    write_renamed(dir, name, bytes)?;
    sync_dir(dir)
}

/// [`write_durably`] without the directory sync.
fn write_renamed(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(FILE_MODE)
            .open(&tmp)?;
        restrict(&f, &tmp, FILE_MODE);
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))
    })();
    if result.is_err() {
        remove_file(&tmp);
    }
    result
}

/// Makes the directory's entries (a rename, a removal) durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Everything a storage server holds on disk: its data directory and the
/// block file of a file medium, with what their start created.
pub(crate) struct Footprint {
    data_dir: Option<DataDir>,
    block_file: Option<BlockFile>,
    /// A persistent server: a normal stop removes no file.
    persistent: bool,
    state: Mutex<State>,
}

impl Footprint {
    pub(crate) fn new(data_dir: Option<DataDir>, persistent: bool) -> Footprint {
        Footprint {
            data_dir,
            block_file: None,
            persistent,
            state: Mutex::new(State::Starting),
        }
    }

    pub(crate) fn set_block_file(&mut self, b: BlockFile) {
        self.block_file = Some(b);
    }

    pub(crate) fn data_dir(&self) -> Option<&DataDir> {
        self.data_dir.as_ref()
    }

    pub(crate) fn block_file(&self) -> Option<&Path> {
        self.block_file.as_ref().map(|b| b.path.as_path())
    }

    /// Releases the block file's lock now, rather than when the medium is
    /// dropped (which may be later: tasks of the stopped server may still
    /// hold it for a moment), so that a new server can take the file at
    /// once. Only once no write can reach the file any more.
    pub(crate) fn release_block_file(&self) {
        if let Some(b) = &self.block_file {
            // SAFETY: flock on a descriptor the block file owns; it touches
            // no memory.
            unsafe { libc::flock(b.lock.as_raw_fd(), libc::LOCK_UN) };
        }
    }

    /// Notes `path` in the data directory as created by this start (for
    /// [`finish`](Self::finish) with `undo`) if it does not exist yet:
    /// call it just before creating the file.
    pub(crate) fn note_new(&self, path: &Path) {
        if let Some(d) = &self.data_dir {
            if !path.exists() {
                d.lock().note_created(path.to_path_buf());
            }
        }
    }

    /// The start succeeded.
    pub(crate) fn started(&self) {
        let mut st = sync::lock(&self.state);
        if *st == State::Starting {
            *st = State::Running;
        }
        if let Some(d) = &self.data_dir {
            d.lock().started();
        }
    }

    /// Stops using what is on disk. With `undo` (or before
    /// [`started`](Self::started)): removes what the start created and
    /// nothing else. Otherwise a normal stop: a persistent server removes
    /// nothing; a volatile one removes its block file if this start
    /// created it or it lies in the data directory, a private data
    /// directory goes, any other data directory stays (with `LOCK` and
    /// `identity`). The lock is released. Idempotent.
    pub(crate) fn finish(&self, undo: bool) {
        let mut st = sync::lock(&self.state);
        let undo = match *st {
            State::Done => return,
            State::Starting => true,
            State::Running => undo,
        };
        *st = State::Done;
        // Every removal happens while this process still holds the locks.
        if let Some(b) = &self.block_file {
            let in_data_dir = self
                .data_dir
                .as_ref()
                .is_some_and(|d| b.path.starts_with(d.path()));
            if undo {
                b.undo();
            } else if !self.persistent && (b.created || in_data_dir) {
                remove_file(&b.path);
            }
        }
        if let Some(d) = &self.data_dir {
            d.lock().finish(undo);
        }
    }
}

impl Drop for Footprint {
    fn drop(&mut self) {
        self.finish(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn identity_parsing() {
        let good = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            parse_identity(format!("{good}\n").as_bytes()).unwrap(),
            good
        );
        assert_eq!(parse_identity(good.as_bytes()).unwrap(), good);
        for bad in [
            "",
            "\n",
            "0123456789ABCDEF0123456789abcdef\n",
            "0123456789abcdef0123456789abcde\n",
            "0123456789abcdef0123456789abcdef0\n",
            "0123456789abcdef0123456789abcdef\n\n",
            " 0123456789abcdef0123456789abcdef",
            "0123456789abcdef0123456789abcdeg\n",
        ] {
            assert!(parse_identity(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let e = parse_identity(&[0xff; 200]).unwrap_err();
        assert!(e.ends_with("..."), "long garbage is cut: {e}");
        let id = random_identity().unwrap();
        assert_eq!(parse_identity(id.as_bytes()).unwrap(), id);
        assert_ne!(id, random_identity().unwrap());
        assert_ne!(random_incarnation().unwrap(), 0);
    }

    #[test]
    fn dir_lock_is_exclusive_and_names_the_holder() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("a/b");
        let first = DirLock::acquire(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&t.path().join("a")), 0o700);
        assert_eq!(mode(&dir.join(LOCK_FILE)), 0o600);
        let pid = std::process::id();
        assert_eq!(
            std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(),
            format!("{pid}\n")
        );
        let e = DirLock::acquire(&dir).unwrap_err();
        match &e {
            StoreError::Locked { path, holder, .. } => {
                assert_eq!(path, &dir);
                assert_eq!(*holder, Some(pid));
            }
            other => panic!("expected Locked, got {other}"),
        }
        let text = e.to_string();
        assert!(
            text.contains(&dir.display().to_string())
                && text.contains(&format!("pid {pid}"))
                && text.contains("--data-dir"),
            "{text}"
        );
        // A refused start touched nothing.
        assert_eq!(
            std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(),
            format!("{pid}\n")
        );
        first.started();
        drop(first);
        assert!(dir.join(LOCK_FILE).exists(), "a kept directory keeps LOCK");
        let again = DirLock::acquire(&dir).unwrap();
        again.started();
    }

    #[test]
    fn undo_removes_only_what_was_created() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("new/dir");
        let lock = DirLock::acquire(&dir).unwrap();
        drop(lock); // never started
        assert!(!t.path().join("new").exists(), "created directories go");

        let existing = t.path().join("old");
        std::fs::create_dir(&existing).unwrap();
        std::fs::write(existing.join("keep"), b"x").unwrap();
        let lock = DirLock::acquire(&existing).unwrap();
        lock.undo();
        assert!(!existing.join(LOCK_FILE).exists(), "the new LOCK goes");
        assert!(existing.join("keep").exists(), "other files stay");
    }

    #[test]
    fn private_dirs_are_fresh_and_removed() {
        let a = DirLock::private("test").unwrap();
        let b = DirLock::private("test").unwrap();
        assert_ne!(a.path(), b.path());
        assert!(a.is_private());
        assert_eq!(mode(a.path()), 0o700);
        let base = a.path().parent().unwrap().to_path_buf();
        assert_eq!(mode(&base) & 0o022, 0);
        let p = a.path().to_path_buf();
        a.started();
        std::fs::write(p.join("x"), b"x").unwrap();
        a.stop();
        assert!(!p.exists(), "a private directory is removed at stop");
        let p = b.path().to_path_buf();
        drop(b);
        assert!(!p.exists(), "and when its start fails");
    }

    #[test]
    fn block_file_lock() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("x/blocks");
        let b = lock_block_file(&path).unwrap();
        assert!(b.created);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&t.path().join("x")), 0o700);
        let e = lock_block_file(&path).err().expect("second lock refused");
        match &e {
            StoreError::Locked { path: p, .. } => assert_eq!(p, &path),
            other => panic!("expected Locked, got {other}"),
        }
        assert!(e.to_string().contains("block file"), "{e}");
        b.undo();
        assert!(!t.path().join("x").exists());
    }
}

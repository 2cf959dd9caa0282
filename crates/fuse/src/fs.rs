//! The FUSE file system: kernel requests as client calls.

use crate::errno::errno_of;
use crate::inodes::{child_path, Inodes, ROOT_INO};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use nodekernel_client::{
    now_ns, Client, CreateOptions, Error, ErrorCode, Node, NodeInfo, NodeType,
};
use nodekernel_proto::path::partition_of;
use nodekernel_proto::sync;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Names the mount gives files unlinked while open (hidden from listings
/// and lookups; removed at the file's last close).
pub const HIDDEN_PREFIX: &str = ".nk-unlinked-";

/// How often the lease keeper renews, as a fraction of the lease: a mount
/// that stalls for up to two thirds of a lease keeps its files.
const RENEWS_PER_LEASE: u32 = 3;

/// The lease keeper's period until the metadata server told the lease.
const RENEW_FALLBACK: Duration = Duration::from_secs(1);

/// Longest name a component may have (as NodeKernel paths allow).
const NAME_MAX: usize = 255;

/// Largest read or write the kernel sends at once.
const MAX_IO: u32 = 1 << 20;

/// `st_blksize`: the I/O size programs should use.
const BLKSIZE: u32 = 1 << 17;

#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The NodeKernel directory (or Table, or Bag) shown at the mount point.
    pub root: String,
    /// Let users other than the one who mounted use the mount.
    pub allow_other: bool,
    /// FUSE worker threads.
    pub threads: usize,
    /// How long the kernel may cache attributes and names.
    pub attr_ttl: Duration,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            root: "/".into(),
            allow_other: false,
            threads: 4,
            attr_ttl: Duration::from_secs(1),
        }
    }
}

/// A live mount.
pub struct Mounted {
    session: fuser::BackgroundSession,
}

impl Mounted {
    /// Waits until the mount ends (unmounted by [`unmount`] or from
    /// outside): every file still open for writing is closed by then,
    /// publishing what was written.
    pub fn join(self) -> std::io::Result<()> {
        self.session.join()
    }
}

/// Unmounts the file system at `mountpoint`: as root directly, otherwise
/// through `fusermount3 -u`. With `lazy`, detaches it even while files are
/// open there (it ends when the last is closed); without, that is `EBUSY`.
pub fn unmount(mountpoint: &Path, lazy: bool) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: a valid C string.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    // Not root: the set-user-id helper of fuse3 may.
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg(mountpoint).output()?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    Err(if text.contains("busy") {
        std::io::Error::from_raw_os_error(libc::EBUSY)
    } else {
        std::io::Error::other(format!("fusermount3 -u: {}", text.trim()))
    })
}

pub(crate) fn mount(
    client: Client,
    rt: tokio::runtime::Handle,
    mountpoint: &Path,
    opts: MountOptions,
) -> std::io::Result<Mounted> {
    let partitions = client.config().metas.len();
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let fs = NkFs {
        inner: Arc::new(Inner {
            client,
            rt,
            uid,
            gid,
            ttl: opts.attr_ttl,
            partitions,
            mount_id: std::process::id() as u64 ^ now_ns().rotate_left(17),
            lease_ms: AtomicU64::new(0),
            names: Mutex::new(Inodes::new(&opts.root)),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("nodekernel".into()),
        MountOption::Subtype("nk".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    let inner = Arc::downgrade(&fs.inner);
    let rt = fs.inner.rt.clone();
    let session = fuser::Session::new(fs, mountpoint, &config)?.spawn()?;
    rt.spawn(keep_leases(inner.clone()));
    rt.spawn(remove_dead_hidden(inner, opts.root));
    Ok(Mounted { session })
}

struct NkFs {
    inner: Arc<Inner>,
}

impl NkFs {
    /// Runs a request on the runtime's worker threads, which reply to the
    /// kernel themselves: there the client's sockets and timers are at
    /// home (from a FUSE thread, a call's socket wait and timer wake a
    /// worker), and the FUSE thread goes back to reading requests at once.
    /// (Reads and writes stay on the FUSE thread: see `read`.)
    fn spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Inner>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.inner.rt.spawn(f(self.inner.clone()));
    }
}

struct Inner {
    client: Client,
    rt: tokio::runtime::Handle,
    uid: u32,
    gid: u32,
    ttl: Duration,
    partitions: usize,
    mount_id: u64,
    /// The metadata servers' write lease, in ms (0 until known).
    lease_ms: AtomicU64,
    names: Mutex<Inodes>,
    /// Files open through the mount, by inode: one state per file however
    /// many descriptors have it open.
    files: Mutex<HashMap<u64, Open>>,
    /// Listings of open directories, by handle.
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_fh: AtomicU64,
}

/// An open directory's entries: (inode, kind, name), `.` and `..` first.
type Listing = Vec<(u64, FileType, String)>;

struct Open {
    opens: usize,
    file: Arc<OpenFile>,
}

struct OpenFile {
    state: tokio::sync::RwLock<FileState>,
}

struct FileState {
    /// The node as last looked up, created or changed through the mount.
    info: NodeInfo,
    /// Its path now (the mount may rename it while it is open).
    path: String,
    reader: Option<Node>,
    /// The mount's write handle (the node's write lease), shared by every
    /// descriptor open for writing.
    writer: Option<Node>,
    /// The node's write lease, taken when it was unlinked while open and
    /// `writer` does not hold it (opened only for reading, or a KeyValue,
    /// whose writer is a new value): the lease keeper renews it, which is
    /// how other mounts tell this hidden file from one of a mount that died.
    hold: Option<Node>,
    /// When this mount last wrote it (not published yet).
    written_at: Option<u64>,
    /// Unlinked while open: `path` (a hidden name) is removed at the last
    /// close.
    hidden: bool,
    /// A write lease of it was taken over or its node removed: the lease
    /// keeper leaves it alone.
    lease_lost: bool,
    /// The last close is done.
    closed: bool,
}

impl FileState {
    /// A file just looked up at `path`, not written here yet.
    fn looked_up(reader: Node, path: String) -> FileState {
        FileState {
            info: reader.info().clone(),
            path,
            reader: Some(reader),
            writer: None,
            hold: None,
            written_at: None,
            hidden: false,
            lease_lost: false,
            closed: false,
        }
    }

    /// The handles holding the node's write lease (or a new value's).
    fn leases(&self) -> impl Iterator<Item = &Node> {
        self.writer.iter().chain(self.hold.iter())
    }

    /// Whether the mount holds the write lease of the node itself (a
    /// File's writer does; a KeyValue's writer is a new value).
    fn holds_lease(&self) -> bool {
        self.hold.is_some() || (self.writer.is_some() && self.info.ty == NodeType::File)
    }

    fn size(&self) -> u64 {
        match (&self.writer, &self.reader) {
            (Some(w), _) => w.size(),
            (None, Some(r)) => r.size(),
            (None, None) => self.info.size,
        }
    }
}

type Res<T> = std::result::Result<T, i32>;

fn err(e: Error) -> i32 {
    errno_of(&e)
}

fn reply_err(code: i32) -> Errno {
    Errno::from_i32(code)
}

fn name_str(name: &OsStr) -> Res<&str> {
    let s = name.to_str().ok_or(libc::EINVAL)?;
    if s.len() > NAME_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    Ok(s)
}

fn is_hidden(name: &str) -> bool {
    name.starts_with(HIDDEN_PREFIX)
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

fn kind(ty: NodeType) -> FileType {
    if ty.is_container() {
        FileType::Directory
    } else {
        FileType::RegularFile
    }
}

fn time_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Inner {
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn path(&self, ino: INodeNo) -> Res<String> {
        sync::lock(&self.names)
            .path(ino.0)
            .map(str::to_string)
            .ok_or(libc::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Res<String> {
        let name = name_str(name)?;
        Ok(child_path(&self.path(parent)?, name))
    }

    fn note_kind(&self, ino: u64, ty: NodeType) {
        sync::lock(&self.names).set_kind(ino, ty);
    }

    /// The type of the node at `path` (inode `ino`, if the kernel has one),
    /// without a lookup when the mount knows it already.
    async fn kind_of(&self, ino: Option<u64>, path: &str) -> Res<NodeType> {
        let known = ino.and_then(|i| sync::lock(&self.names).kind(i));
        match known {
            Some(t) => Ok(t),
            None => {
                let ty = self.client.lookup(path).await.map_err(err)?.info().ty;
                if let Some(i) = ino {
                    self.note_kind(i, ty);
                }
                Ok(ty)
            }
        }
    }

    fn open_file(&self, ino: u64) -> Option<Arc<OpenFile>> {
        sync::lock(&self.files).get(&ino).map(|o| o.file.clone())
    }

    fn attr(&self, ino: u64, info: &NodeInfo, size: u64, mtime: u64, unlinked: bool) -> FileAttr {
        let t = UNIX_EPOCH + Duration::from_nanos(mtime);
        let dir = info.ty.is_container();
        FileAttr {
            ino: INodeNo(ino),
            size: if dir { 0 } else { size },
            blocks: if dir { 0 } else { size.div_ceil(512) },
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: kind(info.ty),
            perm: (info.mode & 0o7777) as u16,
            nlink: match (dir, unlinked) {
                (true, _) => 2,
                (false, true) => 0,
                (false, false) => 1,
            },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        }
    }

    /// The attributes of `ino` at `path`: from its open state if it is
    /// open here (which knows what was written and not yet published),
    /// else from the metadata server.
    async fn stat(&self, ino: u64, path: &str) -> Res<FileAttr> {
        if let Some(f) = self.open_file(ino) {
            let st = f.state.read().await;
            // (A state whose last close is done knows less than the
            // metadata server.)
            if !st.closed {
                let mtime = st.written_at.unwrap_or(st.info.mtime);
                return Ok(self.attr(ino, &st.info, st.size(), mtime, st.hidden));
            }
        }
        let n = self.client.lookup(path).await.map_err(err)?;
        let info = n.info();
        Ok(self.attr(ino, info, info.size, info.mtime, false))
    }

    /// Looks `path` up and hands the kernel a number for it.
    async fn entry(&self, path: &str) -> Res<FileAttr> {
        // A file created here and still being written (a KeyValue put is
        // invisible until its close) is known only to this mount.
        let known = sync::lock(&self.names).ino(path);
        if let Some(ino) = known.filter(|i| self.open_file(*i).is_some()) {
            let a = self.stat(ino, path).await?;
            sync::lock(&self.names).intern(path, true);
            return Ok(a);
        }
        let n = self.client.lookup(path).await.map_err(err)?;
        let ino = sync::lock(&self.names).intern(path, true);
        let info = n.info();
        self.note_kind(ino, info.ty);
        Ok(self.attr(ino, info, info.size, info.mtime, false))
    }

    /// Counts one more open of `ino`, setting up its state from `make` if
    /// it is not open yet.
    async fn open_state<F>(&self, ino: u64, make: F) -> Res<Arc<OpenFile>>
    where
        F: std::future::Future<Output = Res<FileState>>,
    {
        if let Some(f) = self.bump(ino) {
            return Ok(f);
        }
        let st = make.await?;
        let mut files = sync::lock(&self.files);
        let o = files.entry(ino).or_insert_with(|| Open {
            opens: 0,
            file: Arc::new(OpenFile {
                state: tokio::sync::RwLock::new(st),
            }),
        });
        o.opens += 1;
        Ok(o.file.clone())
    }

    fn bump(&self, ino: u64) -> Option<Arc<OpenFile>> {
        let mut files = sync::lock(&self.files);
        let o = files.get_mut(&ino)?;
        o.opens += 1;
        Some(o.file.clone())
    }

    /// Opens of `ino` now (0 while its last close is under way).
    fn opens(&self, ino: u64, file: &Arc<OpenFile>) -> Option<usize> {
        sync::lock(&self.files)
            .get(&ino)
            .filter(|o| Arc::ptr_eq(&o.file, file))
            .map(|o| o.opens)
    }

    /// One open of `ino` ends; at the last, its writer closes (publishing
    /// what was written; a KeyValue's new value replaces the old one) and
    /// a file unlinked while open is removed. The state stays registered
    /// until that is done, so an open meanwhile waits for it (and then
    /// starts afresh) instead of finding the write lease still held.
    async fn release(&self, ino: u64) -> Res<()> {
        let file = {
            let mut files = sync::lock(&self.files);
            let Some(o) = files.get_mut(&ino) else {
                return Ok(());
            };
            o.opens = o.opens.saturating_sub(1);
            if o.opens > 0 {
                return Ok(());
            }
            o.file.clone()
        };
        let mut st = file.state.write().await;
        if st.closed || self.opens(ino, &file) != Some(0) {
            // Opened again meanwhile: the new open goes on with it.
            return Ok(());
        }
        let result = self.finish(&mut st).await;
        let mut files = sync::lock(&self.files);
        if files
            .get(&ino)
            .is_some_and(|o| o.opens == 0 && Arc::ptr_eq(&o.file, &file))
        {
            files.remove(&ino);
        }
        result
    }

    /// The end of a file's last open: its writer closes and, if it was
    /// unlinked while open, it is removed.
    async fn finish(&self, st: &mut FileState) -> Res<()> {
        st.closed = true;
        let mut result = Ok(());
        if let Some(w) = st.writer.take() {
            // A new value of a KeyValue unlinked meanwhile would be put
            // back under its name: it is dropped instead.
            let done = if st.hidden && st.info.ty == NodeType::KeyValue {
                w.abort().await
            } else {
                w.close().await
            };
            if let Err(e) = done {
                tracing::warn!("closing {}: {e}", st.path);
                result = Err(err(e));
            }
        }
        // (Removed below with the node, if hidden; otherwise none.)
        st.hold = None;
        if st.hidden {
            if let Err(e) = self.client.delete(&st.path, false).await {
                tracing::warn!("removing {} (unlinked while open): {e}", st.path);
            }
            sync::lock(&self.names).detach(&st.path);
        }
        result
    }

    /// A write handle for the file at `path`: its write lease for a File;
    /// for a KeyValue, a new value that replaces it at close, starting as
    /// a copy of the old one unless `truncate`.
    async fn writer(&self, st: &FileState, truncate: bool) -> Res<Node> {
        match st.info.ty {
            NodeType::KeyValue => {
                let old = if truncate {
                    Vec::new()
                } else {
                    match &st.reader {
                        Some(r) => r.read(0, r.size()).await.map_err(err)?,
                        None => self.client.get(&st.path).await.map_err(err)?,
                    }
                };
                let opts = CreateOptions {
                    mode: Some(st.info.mode),
                    ..CreateOptions::default()
                };
                let mut w = self
                    .client
                    .create(&st.path, NodeType::KeyValue, opts)
                    .await
                    .map_err(err)?;
                w.append(&old).await.map_err(err)?;
                Ok(w)
            }
            NodeType::File => {
                let mut w = self.client.open_write(&st.path).await.map_err(err)?;
                if truncate {
                    w.truncate(0).await.map_err(err)?;
                }
                Ok(w)
            }
            _ => Err(libc::EISDIR),
        }
    }

    /// Gives an open file its write handle if it has none: a File kept
    /// while hidden already holds its lease.
    async fn ensure_writer(&self, st: &mut FileState, truncate: bool) -> Res<()> {
        if st.writer.is_some() {
            return Ok(());
        }
        if st.info.ty == NodeType::File {
            if let Some(mut w) = st.hold.take() {
                if truncate {
                    w.truncate(0).await.map_err(err)?;
                }
                st.writer = Some(w);
                return Ok(());
            }
        }
        st.writer = Some(self.writer(st, truncate).await?);
        Ok(())
    }

    /// A hidden name for `path` in its directory and metadata partition.
    fn hidden_path(&self, path: &str, ino: u64) -> Res<String> {
        let parent = parent_of(path);
        let part = partition_of(path, self.partitions);
        (0..10_000u32)
            .map(|i| {
                child_path(
                    parent,
                    &format!("{HIDDEN_PREFIX}{:016x}-{ino}-{i}", self.mount_id),
                )
            })
            .find(|p| partition_of(p, self.partitions) == part)
            .ok_or(libc::EIO)
    }

    /// Unlinks the file `ino` at `path` if it is open here: it moves out
    /// of sight and stays readable and writable through its open
    /// descriptors until the last closes, which removes it. Returns false
    /// when it is not open (any more): the caller removes it.
    async fn hide_if_open(&self, ino: u64, path: &str) -> Res<bool> {
        let Some(file) = self.open_file(ino) else {
            return Ok(false);
        };
        let mut st = file.state.write().await;
        let deadline = std::time::Instant::now() + self.client.config().timeout;
        loop {
            if st.closed {
                return Ok(false);
            }
            let registered = self.opens(ino, &file).is_some_and(|n| n > 0);
            if registered {
                break;
            }
            // Its last close is under way (the kernel closes a file
            // after its last descriptor went, without waiting): let it
            // finish first (a KeyValue's close would otherwise put the
            // value back after the removal).
            if std::time::Instant::now() > deadline {
                return Err(libc::EBUSY);
            }
            drop(st);
            tokio::time::sleep(Duration::from_millis(1)).await;
            st = file.state.write().await;
        }
        let hidden = self.hidden_path(path, ino)?;
        // The lease goes first: a hidden file nobody keeps a lease on is
        // one a dead mount left, which others remove.
        if !st.holds_lease() {
            st.hold = self.try_hold(path).await;
        }
        self.client.rename(path, &hidden).await.map_err(err)?;
        sync::lock(&self.names).rename(path, &hidden);
        st.path = hidden;
        st.hidden = true;
        Ok(true)
    }

    async fn do_open(&self, ino: u64, flags: OpenFlags) -> Res<()> {
        let path = self.path(INodeNo(ino))?;
        let file = self
            .open_state(ino, async {
                let reader = self.client.lookup(&path).await.map_err(err)?;
                if reader.info().ty.is_container() {
                    return Err(libc::EISDIR);
                }
                Ok(FileState::looked_up(reader, path.clone()))
            })
            .await?;
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let mut st = file.state.write().await;
        let r = async {
            if st.closed {
                // Its last close finished while this open waited: start
                // afresh.
                let reader = self.client.lookup(&path).await.map_err(err)?;
                *st = FileState::looked_up(reader, path.clone());
            }
            if !write && !truncate {
                return Ok(());
            }
            if st.writer.is_none() {
                self.ensure_writer(&mut st, truncate).await?;
            } else if truncate {
                st.writer
                    .as_mut()
                    .expect("checked")
                    .truncate(0)
                    .await
                    .map_err(err)?;
            }
            if truncate {
                st.written_at = Some(now_ns());
            }
            Ok(())
        }
        .await;
        drop(st);
        if r.is_err() {
            let _ = self.release(ino).await;
        }
        r
    }

    async fn do_create(&self, parent: INodeNo, name: &OsStr, mode: u32) -> Res<(u64, FileAttr)> {
        let path = self.child(parent, name)?;
        if is_hidden(name_str(name)?) {
            return Err(libc::EINVAL);
        }
        let parent_ty = self.kind_of(Some(parent.0), parent_of(&path)).await?;
        let ty = match parent_ty {
            NodeType::Table => NodeType::KeyValue,
            NodeType::Directory | NodeType::Bag => NodeType::File,
            _ => return Err(libc::ENOTDIR),
        };
        if ty == NodeType::KeyValue && self.client.lookup(&path).await.is_ok() {
            // A KeyValue create replaces; a POSIX create of an existing
            // name must not.
            return Err(libc::EEXIST);
        }
        let opts = CreateOptions {
            mode: Some(mode & 0o7777),
            ..CreateOptions::default()
        };
        let w = self.client.create(&path, ty, opts).await.map_err(err)?;
        let info = w.info().clone();
        let ino = sync::lock(&self.names).intern(&path, true);
        self.note_kind(ino, ty);
        let attr = self.attr(ino, &info, 0, info.mtime, false);
        let fresh = FileState {
            info,
            path: path.clone(),
            reader: None,
            writer: Some(w),
            hold: None,
            written_at: None,
            hidden: false,
            lease_lost: false,
            closed: false,
        };
        match self.bump(ino) {
            // A state of an earlier file at this path, its last close
            // under way: the new file takes its place.
            Some(file) => *file.state.write().await = fresh,
            None => {
                self.open_state(ino, async { Ok(fresh) }).await?;
            }
        }
        Ok((ino, attr))
    }

    async fn do_read(&self, ino: u64, offset: u64, size: u32) -> Res<Vec<u8>> {
        let file = self.open_file(ino).ok_or(libc::EBADF)?;
        let st = file.state.read().await;
        let node = st
            .writer
            .as_ref()
            .or(st.reader.as_ref())
            .ok_or(libc::EBADF)?;
        let mut end = offset.saturating_add(size as u64);
        if st.writer.is_none() && end > node.size() {
            // Another client may have grown it since it was opened.
            node.refresh().await.map_err(err)?;
        }
        end = end.min(node.size());
        if end <= offset {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        node.read_at(offset, &mut buf).await.map_err(err)?;
        Ok(buf)
    }

    async fn do_write(&self, ino: u64, offset: u64, data: &[u8]) -> Res<u32> {
        let file = self.open_file(ino).ok_or(libc::EBADF)?;
        let mut st = file.state.write().await;
        let w = st.writer.as_mut().ok_or(libc::EBADF)?;
        write_at(w, offset, data).await.map_err(err)?;
        st.written_at = Some(now_ns());
        Ok(data.len() as u32)
    }

    async fn do_setattr(
        &self,
        ino: u64,
        mode: Option<u32>,
        size: Option<u64>,
        mtime: Option<TimeOrNow>,
    ) -> Res<FileAttr> {
        let path = self.path(INodeNo(ino))?;
        let open = self.open_file(ino);
        if let Some(size) = size {
            match &open {
                Some(f) => {
                    let mut st = f.state.write().await;
                    self.ensure_writer(&mut st, false).await?;
                    let w = st.writer.as_mut().expect("set above");
                    w.truncate(size).await.map_err(err)?;
                    st.written_at = Some(now_ns());
                }
                None => {
                    let n = self.client.lookup(&path).await.map_err(err)?;
                    let st = FileState::looked_up(n, path.clone());
                    let mut w = self.writer(&st, false).await?;
                    w.truncate(size).await.map_err(err)?;
                    w.close().await.map_err(err)?;
                }
            }
        }
        let mtime = mtime.map(|t| match t {
            TimeOrNow::Now => now_ns(),
            TimeOrNow::SpecificTime(t) => time_ns(t),
        });
        if mode.is_some() || mtime.is_some() {
            let (hidden, at) = match &open {
                Some(f) => {
                    let st = f.state.read().await;
                    (st.hidden, st.path.clone())
                }
                None => (false, path.clone()),
            };
            // A put not closed yet has no path to change; it is given its
            // mode when it is created, and its time when it closes.
            let info = match self
                .client
                .set_attrs(&at, mode.map(|m| m & 0o7777), mtime)
                .await
            {
                Ok(i) => Some(i),
                Err(e) if e.code == ErrorCode::NotFound && open.is_some() && !hidden => None,
                Err(e) => return Err(err(e)),
            };
            if let Some(f) = &open {
                let mut st = f.state.write().await;
                if let Some(i) = info {
                    st.info.mode = i.mode;
                    st.info.mtime = i.mtime;
                } else if let Some(m) = mode {
                    st.info.mode = m & 0o7777;
                }
                if mtime.is_some() {
                    st.written_at = mtime;
                }
            }
        }
        self.stat(ino, &path).await
    }

    async fn do_unlink(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Res<()> {
        let name = name_str(name)?;
        if is_hidden(name) {
            return Err(libc::ENOENT);
        }
        let path = child_path(&self.path(parent)?, name);
        let ino = sync::lock(&self.names).ino(&path);
        match (self.kind_of(ino, &path).await?.is_container(), dir) {
            (true, false) => return Err(libc::EISDIR),
            (false, true) => return Err(libc::ENOTDIR),
            _ => {}
        }
        if let Some(ino) = ino {
            if self.hide_if_open(ino, &path).await? {
                return Ok(());
            }
        }
        match self.client.delete(&path, false).await {
            Ok(()) => {}
            // What keeps it from being empty may be hidden files of mounts
            // that died: those go, and it is removed after all.
            Err(e) if dir && e.code == ErrorCode::NotEmpty => {
                if !self.remove_dead_hidden_in(&path).await {
                    return Err(libc::ENOTEMPTY);
                }
                self.client.delete(&path, false).await.map_err(err)?;
            }
            Err(e) => return Err(err(e)),
        }
        sync::lock(&self.names).detach(&path);
        Ok(())
    }

    /// The write lease of the file at `path`, for keeping a hidden file:
    /// `None` while another client writes it, or if it cannot be had now
    /// (the lease keeper tries again).
    async fn try_hold(&self, path: &str) -> Option<Node> {
        match self.client.open_write(path).await {
            Ok(n) => Some(n),
            Err(e) => {
                if e.code != ErrorCode::Busy {
                    tracing::warn!("taking the write lease of {path} (unlinked while open): {e}");
                }
                None
            }
        }
    }

    /// Whether the file at `path` is open here.
    fn open_here(&self, path: &str) -> bool {
        let ino = sync::lock(&self.names).ino(path);
        ino.is_some_and(|i| self.open_file(i).is_some())
    }

    /// Removes the hidden file at `path` if the mount that hid it is gone:
    /// nobody keeps its write lease (a live mount renews it), so this
    /// mount can take it. False when it stays (a live mount's, or open
    /// here).
    async fn remove_if_dead(&self, path: &str) -> bool {
        if self.open_here(path) {
            return false;
        }
        let taken = match self.client.open_write(path).await {
            Ok(n) => n,
            Err(e) if e.code == ErrorCode::NotFound => return true,
            Err(e) => {
                if e.code != ErrorCode::Busy {
                    tracing::warn!("checking {path} (a file unlinked while open): {e}");
                }
                return false;
            }
        };
        let r = self.client.delete(path, false).await;
        drop(taken);
        match r {
            Ok(()) => {
                tracing::info!("removed {path}, left unlinked while open by a mount that is gone");
                true
            }
            Err(e) if e.code == ErrorCode::NotFound => true,
            Err(e) => {
                tracing::warn!("removing {path} (left by a mount that is gone): {e}");
                false
            }
        }
    }

    /// Removes the hidden files of dead mounts in directory `dir`; true
    /// if it holds nothing else any more (no visible name, no hidden file
    /// still kept).
    async fn remove_dead_hidden_in(&self, dir: &str) -> bool {
        let Ok(list) = self.client.enumerate_typed(dir).await else {
            return false;
        };
        if list.iter().any(|(name, _)| !is_hidden(name)) {
            return false;
        }
        let mut empty = true;
        for (name, _) in list {
            empty &= self.remove_if_dead(&child_path(dir, &name)).await;
        }
        empty
    }

    /// How long the metadata servers' write leases last (the shortest), as
    /// their status says; `None` if none answers.
    async fn lease(&self) -> Option<Duration> {
        let mut ms = self.lease_ms.load(Ordering::Relaxed);
        if ms == 0 {
            ms = self.client.status().await.ok()?.lease_ms;
            self.lease_ms.store(ms, Ordering::Relaxed);
        }
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Walks the subtree at `root`, removing the hidden files of dead
    /// mounts; returns those that stay (their lease is held).
    async fn walk_hidden(&self, root: &str) -> Vec<String> {
        let mut dirs = vec![root.to_string()];
        let (mut kept, mut removed) = (Vec::new(), 0usize);
        while let Some(dir) = dirs.pop() {
            let Ok(list) = self.client.enumerate_typed(&dir).await else {
                continue; // removed meanwhile, or unreachable
            };
            for (name, ty) in list {
                let p = child_path(&dir, &name);
                if ty.is_container() {
                    dirs.push(p);
                } else if is_hidden(&name) {
                    if self.remove_if_dead(&p).await {
                        removed += 1;
                    } else {
                        kept.push(p);
                    }
                }
            }
        }
        if removed > 0 {
            tracing::info!(
                "removed {removed} file(s) left unlinked while open by mounts that are gone"
            );
        }
        kept
    }

    /// Renews every write lease the mount holds: its open files' and its
    /// hidden files'. A hidden file whose lease another client held gets
    /// it now, if that one is done.
    async fn renew_leases(&self) {
        let files: Vec<Arc<OpenFile>> = sync::lock(&self.files)
            .values()
            .map(|o| o.file.clone())
            .collect();
        for f in files {
            let (lost, missing) = {
                let st = f.state.read().await;
                if st.closed || st.lease_lost {
                    continue;
                }
                let mut lost = false;
                for w in st.leases() {
                    if let Err(e) = w.renew().await {
                        // Taken over or removed: renewing is over (its
                        // writes fail from now on); anything else may pass.
                        lost |= matches!(e.code, ErrorCode::LeaseExpired | ErrorCode::Stale);
                        tracing::warn!("renewing the write lease of {}: {e}", st.path);
                    }
                }
                (lost, st.hidden && !st.holds_lease())
            };
            if lost || missing {
                let mut st = f.state.write().await;
                st.lease_lost |= lost;
                if !lost && !st.closed && !st.holds_lease() {
                    st.hold = self.try_hold(&st.path).await;
                }
            }
        }
    }

    async fn do_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Res<()> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return Err(libc::EINVAL);
        }
        let (from_name, to_name) = (name_str(name)?, name_str(newname)?);
        if is_hidden(from_name) || is_hidden(to_name) {
            return Err(libc::ENOENT);
        }
        let from = child_path(&self.path(parent)?, from_name);
        let to = child_path(&self.path(newparent)?, to_name);
        if partition_of(&from, self.partitions) != partition_of(&to, self.partitions) {
            return Err(libc::EXDEV);
        }
        let replace = !flags.contains(RenameFlags::RENAME_NOREPLACE);
        // A target open here stays usable by its descriptors: it is moved
        // out of sight first, as an unlink would.
        let target = sync::lock(&self.names).ino(&to);
        if let Some(ino) = target.filter(|i| self.open_file(*i).is_some()) {
            if from != to && replace {
                let src = self.client.lookup(&from).await.map_err(err)?;
                let dst = self.client.lookup(&to).await.map_err(err)?;
                if src.info().ty != dst.info().ty {
                    return Err(if dst.info().ty.is_container() {
                        libc::EISDIR
                    } else {
                        libc::ENOTDIR
                    });
                }
                self.hide_if_open(ino, &to).await?;
            }
        }
        match self.client.rename_with(&from, &to, replace).await {
            Ok(()) => {}
            Err(e) => {
                return Err(match e.code {
                    ErrorCode::TypeMismatch => {
                        match self.client.lookup(&to).await.map(|n| n.info().ty) {
                            Ok(t) if t.is_container() => libc::EISDIR,
                            Ok(_) => libc::ENOTDIR,
                            // A File cannot go into a Table, nor a directory into a Bag.
                            Err(_) => libc::EPERM,
                        }
                    }
                    ErrorCode::InvalidArgument => libc::EINVAL,
                    _ => err(e),
                });
            }
        }
        sync::lock(&self.names).rename(&from, &to);
        // An open file keeps its path current.
        let moved = sync::lock(&self.names).ino(&to);
        if let Some(f) = moved.and_then(|i| self.open_file(i)) {
            f.state.write().await.path = to.clone();
        }
        Ok(())
    }

    async fn do_mkdir(&self, parent: INodeNo, name: &OsStr, mode: u32) -> Res<FileAttr> {
        let n = name_str(name)?;
        if is_hidden(n) {
            return Err(libc::EINVAL);
        }
        let path = self.child(parent, name)?;
        let opts = CreateOptions {
            mode: Some(mode & 0o7777),
            ..CreateOptions::default()
        };
        match self.client.create(&path, NodeType::Directory, opts).await {
            Ok(_) => {}
            // Tables hold only KeyValues and Bags only Files.
            Err(e) if e.code == ErrorCode::TypeMismatch => return Err(libc::EPERM),
            Err(e) => return Err(err(e)),
        }
        self.entry(&path).await
    }

    async fn do_opendir(&self, ino: u64) -> Res<u64> {
        let path = self.path(INodeNo(ino))?;
        let list = self.client.enumerate_typed(&path).await.map_err(err)?;
        let mut entries = Vec::with_capacity(list.len() + 2);
        let parent = sync::lock(&self.names)
            .ino(parent_of(&path))
            .unwrap_or(ROOT_INO);
        entries.push((ino, FileType::Directory, ".".to_string()));
        entries.push((parent, FileType::Directory, "..".to_string()));
        {
            let mut names = sync::lock(&self.names);
            for (name, ty) in list {
                if is_hidden(&name) {
                    continue;
                }
                let i = names.intern(&child_path(&path, &name), false);
                names.set_kind(i, ty);
                entries.push((i, kind(ty), name));
            }
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        sync::lock(&self.dirs).insert(fh, Arc::new(entries));
        Ok(fh)
    }

    async fn do_statfs(&self) -> Res<(u64, u64)> {
        let s = self.client.status().await.map_err(err)?;
        let (mut cap, mut used) = (0u64, 0u64);
        for srv in s.servers.iter().filter(|s| s.alive) {
            cap += srv.capacity_blocks * srv.block_size as u64;
            used += srv.used_blocks * srv.block_size as u64;
        }
        Ok((cap, used.min(cap)))
    }

    /// Closes every file still open for writing (at unmount).
    fn close_all(&self) {
        let files: Vec<Arc<OpenFile>> = sync::lock(&self.files)
            .drain()
            .map(|(_, o)| o.file)
            .collect();
        for f in files {
            // (`finish` logs what fails; nobody waits for an answer here.)
            let _ = self.block_on(async {
                let mut st = f.state.write().await;
                if st.closed {
                    return Ok(());
                }
                self.finish(&mut st).await
            });
        }
    }
}

/// Renews the mount's write leases while it runs ([`Inner::renew_leases`]),
/// a few times per lease (as long as the metadata servers say it lasts).
async fn keep_leases(fs: Weak<Inner>) {
    loop {
        let Some(inner) = fs.upgrade() else {
            return;
        };
        inner.renew_leases().await;
        let period = match inner.lease().await {
            Some(lease) => lease / RENEWS_PER_LEASE,
            None => RENEW_FALLBACK,
        };
        drop(inner);
        tokio::time::sleep(period.max(Duration::from_millis(10))).await;
    }
}

/// At the start of a mount: removes the files that mounts which died left
/// unlinked while open under `root` (hidden, so no listing shows them and
/// no `rmdir` could remove their directory). One whose lease is still
/// held is tried again once that lease would have run out: a mount
/// killed just now leaves it held for up to a lease.
async fn remove_dead_hidden(fs: Weak<Inner>, root: String) {
    let Some(inner) = fs.upgrade() else {
        return;
    };
    let kept = inner.walk_hidden(&root).await;
    if kept.is_empty() {
        return;
    }
    let wait = inner.lease().await.unwrap_or(RENEW_FALLBACK);
    drop(inner);
    tokio::time::sleep(wait + wait / RENEWS_PER_LEASE).await;
    let Some(inner) = fs.upgrade() else {
        return;
    };
    for p in kept {
        inner.remove_if_dead(&p).await;
    }
}

/// Writes `data` at `offset` of a writer, wherever that is: bytes past the
/// end are appended (zeros first up to `offset`: files have no holes).
async fn write_at(w: &mut Node, offset: u64, data: &[u8]) -> nodekernel_client::Result<()> {
    w.zero_fill_to(offset).await?;
    let size = w.size();
    let inside = if offset < size {
        ((size - offset) as usize).min(data.len())
    } else {
        0
    };
    if inside > 0 {
        w.write_at(offset, &data[..inside]).await?;
    }
    if inside < data.len() {
        w.append(&data[inside..]).await?;
    }
    Ok(())
}

impl Filesystem for NkFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // O_TRUNC arrives with the open (so a KeyValue is replaced in one
        // step, not emptied first).
        let _ =
            config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC | InitFlags::FUSE_BIG_WRITES);
        let _ = config.add_capabilities(InitFlags::FUSE_MAX_PAGES);
        let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        Ok(())
    }

    fn destroy(&mut self) {
        self.inner.close_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = match name_str(name) {
            Ok(n) if is_hidden(n) => Err(libc::ENOENT),
            // A name that is not UTF-8 cannot exist.
            Err(libc::EINVAL) => Err(libc::ENOENT),
            Err(e) => Err(e),
            Ok(_) => self.inner.child(parent, name),
        };
        self.spawn(|fs| async move {
            let r = match path {
                Ok(p) => fs.entry(&p).await,
                Err(e) => Err(e),
            };
            match r {
                Ok(a) => reply.entry(&fs.ttl, &a, Generation(0)),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        sync::lock(&self.inner.names).forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.spawn(|fs| async move {
            let r = match fs.path(ino) {
                Ok(p) => fs.stat(ino.0, &p).await,
                Err(e) => Err(e),
            };
            match r {
                Ok(a) => reply.attr(&fs.ttl, &a),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Every file belongs to the user who mounted; owners do not change.
        if uid.is_some_and(|u| u != self.inner.uid) || gid.is_some_and(|g| g != self.inner.gid) {
            return reply.error(Errno::EPERM);
        }
        self.spawn(|fs| async move {
            match fs.do_setattr(ino.0, mode, size, mtime).await {
                Ok(a) => reply.attr(&fs.ttl, &a),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Only regular files; device nodes, FIFOs and sockets have no
        // NodeKernel type.
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let name = name.to_os_string();
        self.spawn(|fs| async move {
            let r = async {
                let (ino, attr) = fs.do_create(parent, &name, mode & !umask).await?;
                fs.release(ino).await?;
                Ok(attr)
            };
            match r.await {
                Ok(a) => reply.entry(&fs.ttl, &a, Generation(0)),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name.to_os_string();
        self.spawn(|fs| async move {
            match fs.do_mkdir(parent, &name, mode & !umask).await {
                Ok(a) => reply.entry(&fs.ttl, &a, Generation(0)),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_os_string();
        self.spawn(|fs| async move {
            match fs.do_unlink(parent, &name, false).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_os_string();
        self.spawn(|fs| async move {
            match fs.do_unlink(parent, &name, true).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn readlink(&self, _req: &Request, _ino: INodeNo, reply: ReplyData) {
        // Nothing here is a symbolic link.
        reply.error(Errno::EINVAL);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (name.to_os_string(), newname.to_os_string());
        self.spawn(|fs| async move {
            match fs
                .do_rename(parent, &name, newparent, &newname, flags)
                .await
            {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // A node has exactly one path.
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(|fs| async move {
            match fs.do_open(ino.0, flags).await {
                Ok(()) => reply.opened(FileHandle(ino.0), FopenFlags::empty()),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Reads and writes run on this thread: on the shared-memory path
        // they are memory copies that finish without waiting, and a
        // hand-over to a worker would cost more than they do.
        let fs = &self.inner;
        match fs.block_on(fs.do_read(ino.0, offset, size)) {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(reply_err(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let fs = &self.inner;
        match fs.block_on(fs.do_write(ino.0, offset, data)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(reply_err(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.fsync(_req, ino, _fh, false, reply);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(|fs| async move {
            match fs.release(ino.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Publishes what was written: other clients see it from now on (a
        // KeyValue only at its last close).
        self.spawn(|fs| async move {
            let r = async {
                let Some(f) = fs.open_file(ino.0) else {
                    return Ok(());
                };
                let mut st = f.state.write().await;
                if let Some(w) = st.writer.as_mut() {
                    w.sync().await.map_err(err)?;
                }
                Ok(())
            };
            match r.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(|fs| async move {
            match fs.do_opendir(ino.0).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(list) = sync::lock(&self.inner.dirs).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        sync::lock(&self.inner.dirs).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are durable (as the cluster's persistence
        // setting makes them) once their call returned.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(|fs| async move {
            match fs.do_statfs().await {
                Ok((cap, used)) => {
                    let unit = 4096u64;
                    let (blocks, free) = (cap / unit, (cap - used) / unit);
                    let files = u64::MAX >> 1;
                    reply.statfs(
                        blocks,
                        free,
                        free,
                        files,
                        files,
                        unit as u32,
                        NAME_MAX as u32,
                        unit as u32,
                    )
                }
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOTSUP);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOTSUP);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOTSUP);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOTSUP);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name.to_os_string();
        self.spawn(|fs| async move {
            match fs.do_create(parent, &name, mode & !umask).await {
                Ok((ino, a)) => reply.created(
                    &fs.ttl,
                    &a,
                    Generation(0),
                    FileHandle(ino),
                    FopenFlags::empty(),
                ),
                Err(e) => reply.error(reply_err(e)),
            }
        });
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Not a terminal, nor anything else ioctls speak to.
        reply.error(Errno::ENOTTY);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        // SEEK_DATA / SEEK_HOLE: files have no holes; the kernel answers
        // them itself (all data) after this.
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // The kernel falls back to reads and writes.
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        // Files have no holes and no reserved space (posix_fallocate falls
        // back to writing zeros).
        reply.error(Errno::EOPNOTSUPP);
    }
}

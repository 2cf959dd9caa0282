//! The FUSE file system's state and its operations, as client calls:
//! inode numbers to paths, open files with the one writer each holds,
//! files unlinked while open, write leases. `kernel.rs` answers the
//! kernel's requests with these operations; `mount.rs` starts the mount.

use crate::errno::errno_of;
use crate::inodes::{child_path, Inodes, ROOT_INO};
use fuser::{Errno, FileAttr, FileType, INodeNo, OpenAccMode, OpenFlags, RenameFlags, TimeOrNow};
use nodekernel_client::{
    now_ns, Client, CreateOptions, Error, ErrorCode, Node, NodeInfo, NodeType,
};
use nodekernel_proto::path::partition_of;
use nodekernel_proto::sync;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Names the mount gives files unlinked while open (hidden from listings
/// and lookups; removed at the file's last close).
pub const HIDDEN_PREFIX: &str = ".nk-unlinked-";

/// Longest name a component may have (as NodeKernel paths allow).
pub(crate) const NAME_MAX: usize = 255;

/// Largest read or write the kernel sends at once.
pub(crate) const MAX_IO: u32 = 1 << 20;

/// `st_blksize`: the I/O size programs should use.
pub(crate) const BLKSIZE: u32 = 1 << 17;

pub(crate) struct NkFs {
    pub(crate) inner: Arc<Inner>,
}

impl NkFs {
    /// Runs a request on the runtime's worker threads, which reply to the
    /// kernel themselves: there the client's sockets and timers are at
    /// home (from a FUSE thread, a call's socket wait and timer wake a
    /// worker), and the FUSE thread goes back to reading requests at once.
    /// (Reads and writes stay on the FUSE thread: see `read`.)
    pub(crate) fn spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Inner>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.inner.rt.spawn(f(self.inner.clone()));
    }
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) ttl: Duration,
    pub(crate) partitions: usize,
    pub(crate) mount_id: u64,
    /// The metadata servers' write lease, in ms (0 until known).
    pub(crate) lease_ms: AtomicU64,
    /// The session hidden files are bound to, if one could be opened.
    pub(crate) session: Option<nodekernel_client::Session>,
    pub(crate) names: Mutex<Inodes>,
    /// Files open through the mount, by inode: one state per file however
    /// many descriptors have it open.
    pub(crate) files: Mutex<HashMap<u64, Open>>,
    /// Listings of open directories, by handle.
    pub(crate) dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    pub(crate) next_fh: AtomicU64,
}

/// An open directory's entries: (inode, kind, name), `.` and `..` first.
pub(crate) type Listing = Vec<(u64, FileType, String)>;

pub(crate) struct Open {
    opens: usize,
    /// Of them, opens for writing: when the last of these closes, a
    /// KeyValue's new value replaces the old one even if it stays open
    /// for reading.
    writers: usize,
    file: Arc<OpenFile>,
}

pub(crate) struct OpenFile {
    pub(crate) state: tokio::sync::RwLock<FileState>,
}

pub(crate) struct FileState {
    /// The node as last looked up, created or changed through the mount.
    info: NodeInfo,
    /// Its path now (the mount may rename it while it is open).
    path: String,
    reader: Option<Node>,
    /// The mount's write handle (the node's write lease), shared by every
    /// descriptor open for writing.
    pub(crate) writer: Option<Node>,
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

pub(crate) type Res<T> = std::result::Result<T, i32>;

pub(crate) fn err(e: Error) -> i32 {
    errno_of(&e)
}

pub(crate) fn reply_err(code: i32) -> Errno {
    Errno::from_i32(code)
}

pub(crate) fn name_str(name: &OsStr) -> Res<&str> {
    let s = name.to_str().ok_or(libc::EINVAL)?;
    if s.len() > NAME_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    Ok(s)
}

pub(crate) fn is_hidden(name: &str) -> bool {
    name.starts_with(HIDDEN_PREFIX)
}

pub(crate) fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

pub(crate) fn kind(ty: NodeType) -> FileType {
    if ty.is_container() {
        FileType::Directory
    } else {
        FileType::RegularFile
    }
}

pub(crate) fn time_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Inner {
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub(crate) fn path(&self, ino: INodeNo) -> Res<String> {
        sync::lock(&self.names)
            .path(ino.0)
            .map(str::to_string)
            .ok_or(libc::ENOENT)
    }

    pub(crate) fn child(&self, parent: INodeNo, name: &OsStr) -> Res<String> {
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

    pub(crate) fn open_file(&self, ino: u64) -> Option<Arc<OpenFile>> {
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
    pub(crate) async fn stat(&self, ino: u64, path: &str) -> Res<FileAttr> {
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
    pub(crate) async fn entry(&self, path: &str) -> Res<FileAttr> {
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
    async fn open_state<F>(&self, ino: u64, write: bool, make: F) -> Res<Arc<OpenFile>>
    where
        F: std::future::Future<Output = Res<FileState>>,
    {
        if let Some(f) = self.bump(ino, write) {
            return Ok(f);
        }
        let st = make.await?;
        let mut files = sync::lock(&self.files);
        let o = files.entry(ino).or_insert_with(|| Open {
            opens: 0,
            writers: 0,
            file: Arc::new(OpenFile {
                state: tokio::sync::RwLock::new(st),
            }),
        });
        o.opens += 1;
        o.writers += usize::from(write);
        Ok(o.file.clone())
    }

    fn bump(&self, ino: u64, write: bool) -> Option<Arc<OpenFile>> {
        let mut files = sync::lock(&self.files);
        let o = files.get_mut(&ino)?;
        o.opens += 1;
        o.writers += usize::from(write);
        Some(o.file.clone())
    }

    /// Opens of `ino` now (0 while its last close is under way), and of
    /// them, opens for writing.
    fn opens(&self, ino: u64, file: &Arc<OpenFile>) -> Option<(usize, usize)> {
        sync::lock(&self.files)
            .get(&ino)
            .filter(|o| Arc::ptr_eq(&o.file, file))
            .map(|o| (o.opens, o.writers))
    }

    /// One open of `ino` ends (`write`: one for writing); at the last, its
    /// writer closes (publishing what was written; a KeyValue's new value
    /// replaces the old one) and a file unlinked while open is removed.
    /// The state stays registered until that is done, so an open
    /// meanwhile waits for it (and then starts afresh) instead of finding
    /// the write lease still held. At the last open for writing, a
    /// KeyValue's new value replaces the old one even while the file stays
    /// open for reading (or was opened again meanwhile, as a reader does
    /// just after a writer closed).
    pub(crate) async fn release(&self, ino: u64, write: bool) -> Res<()> {
        let file = {
            let mut files = sync::lock(&self.files);
            let Some(o) = files.get_mut(&ino) else {
                return Ok(());
            };
            o.opens = o.opens.saturating_sub(1);
            if write {
                o.writers = o.writers.saturating_sub(1);
            }
            if o.opens > 0 && !(write && o.writers == 0) {
                return Ok(());
            }
            o.file.clone()
        };
        let mut st = file.state.write().await;
        if st.closed {
            return Ok(());
        }
        match self.opens(ino, &file) {
            Some((0, _)) => {}
            // Still open only for reading: what was written is published.
            Some((_, 0)) => return self.publish_value(&mut st).await,
            // Opened again for writing meanwhile: the new open goes on
            // with it.
            _ => return Ok(()),
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

    /// Publishes the new value of a KeyValue (not unlinked) that nobody
    /// writes any more, as its last close would, and reads it from then
    /// on; a later write starts a newer value.
    async fn publish_value(&self, st: &mut FileState) -> Res<()> {
        if st.info.ty != NodeType::KeyValue || st.hidden {
            return Ok(());
        }
        let Some(w) = st.writer.take() else {
            return Ok(());
        };
        if let Err(e) = w.close().await {
            tracing::warn!("closing {}: {e}", st.path);
            return Err(err(e));
        }
        st.written_at = None;
        match self.client.lookup(&st.path).await {
            Ok(r) => {
                st.info = r.info().clone();
                st.reader = Some(r);
            }
            // Replaced or removed by another client just now: reads go on
            // with what they had.
            Err(e) => tracing::debug!("looking up {} after its close: {e}", st.path),
        }
        Ok(())
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
            match self.client.delete(&st.path, false).await {
                // (A KeyValue whose first value was never published has
                // nothing at its hidden name.)
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => tracing::warn!("removing {} (unlinked while open): {e}", st.path),
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
            let registered = self.opens(ino, &file).is_some_and(|(n, _)| n > 0);
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
        match self.client.rename(path, &hidden).await {
            Ok(()) => {
                // Bound to the mount's session, it goes if the mount dies
                // (else the next mount of its directory, or an rmdir of
                // it, removes it: see above).
                if let Some(s) = &self.session {
                    if let Err(e) = s.bind_existing(&hidden).await {
                        tracing::debug!("{hidden}: not bound to the mount's session: {e}");
                    }
                }
            }
            // A new KeyValue whose first value is still being written
            // here: nothing is at its name yet, and its value, dropped at
            // its close, never will be.
            Err(e)
                if e.code == ErrorCode::NotFound
                    && st.info.ty == NodeType::KeyValue
                    && st.writer.is_some() => {}
            Err(e) => return Err(err(e)),
        }
        sync::lock(&self.names).rename(path, &hidden);
        st.path = hidden;
        st.hidden = true;
        Ok(true)
    }

    pub(crate) async fn do_open(&self, ino: u64, flags: OpenFlags) -> Res<()> {
        let path = self.path(INodeNo(ino))?;
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let file = self
            .open_state(ino, write, async {
                let reader = self.client.lookup(&path).await.map_err(err)?;
                if reader.info().ty.is_container() {
                    return Err(libc::EISDIR);
                }
                Ok(FileState::looked_up(reader, path.clone()))
            })
            .await?;
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
            let _ = self.release(ino, write).await;
        }
        r
    }

    pub(crate) async fn do_create(
        &self,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        write: bool,
    ) -> Res<(u64, FileAttr)> {
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
        match self.bump(ino, write) {
            // A state of an earlier file at this path, its last close
            // under way: the new file takes its place.
            Some(file) => *file.state.write().await = fresh,
            None => {
                self.open_state(ino, write, async { Ok(fresh) }).await?;
            }
        }
        Ok((ino, attr))
    }

    pub(crate) async fn do_read(&self, ino: u64, offset: u64, size: u32) -> Res<Vec<u8>> {
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

    pub(crate) async fn do_write(&self, ino: u64, offset: u64, data: &[u8]) -> Res<u32> {
        let file = self.open_file(ino).ok_or(libc::EBADF)?;
        let mut st = file.state.write().await;
        // (The kernel refuses writes to descriptors not open for writing;
        // a KeyValue's value published while it stays open gets a newer
        // one here.)
        self.ensure_writer(&mut st, false).await?;
        let w = st.writer.as_mut().expect("set above");
        write_at(w, offset, data).await.map_err(err)?;
        st.written_at = Some(now_ns());
        Ok(data.len() as u32)
    }

    pub(crate) async fn do_setattr(
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

    pub(crate) async fn do_unlink(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Res<()> {
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
                if e.code != ErrorCode::Busy && e.code != ErrorCode::NotFound {
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
    pub(crate) async fn remove_if_dead(&self, path: &str) -> bool {
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
    pub(crate) async fn lease(&self) -> Option<Duration> {
        let mut ms = self.lease_ms.load(Ordering::Relaxed);
        if ms == 0 {
            ms = self.client.status().await.ok()?.lease_ms;
            self.lease_ms.store(ms, Ordering::Relaxed);
        }
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Walks the subtree at `root`, removing the hidden files of dead
    /// mounts; returns those that stay (their lease is held).
    pub(crate) async fn walk_hidden(&self, root: &str) -> Vec<String> {
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
    pub(crate) async fn renew_leases(&self) {
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

    pub(crate) async fn do_rename(
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

    pub(crate) async fn do_mkdir(&self, parent: INodeNo, name: &OsStr, mode: u32) -> Res<FileAttr> {
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

    pub(crate) async fn do_opendir(&self, ino: u64) -> Res<u64> {
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

    pub(crate) async fn do_statfs(&self) -> Res<(u64, u64)> {
        let s = self.client.status().await.map_err(err)?;
        let (mut cap, mut used) = (0u64, 0u64);
        for srv in s.servers.iter().filter(|s| s.alive) {
            cap += srv.capacity_blocks * srv.block_size as u64;
            used += srv.used_blocks * srv.block_size as u64;
        }
        Ok((cap, used.min(cap)))
    }

    /// Closes every file still open for writing (at unmount).
    pub(crate) fn close_all(&self) {
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

/// Writes `data` at `offset` of a writer, wherever that is: bytes past the
/// end are appended (zeros first up to `offset`: files have no holes).
pub(crate) async fn write_at(
    w: &mut Node,
    offset: u64,
    data: &[u8],
) -> nodekernel_client::Result<()> {
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

//! The kernel's requests (`fuser::Filesystem`), each answered by the
//! operation of [`Inner`] that serves it.

use crate::fs::err;
use crate::fs::is_hidden;
use crate::fs::name_str;
use crate::fs::reply_err;
use crate::fs::NkFs;
use crate::fs::MAX_IO;
use crate::fs::NAME_MAX;
use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use nodekernel_proto::sync;
use std::ffi::OsStr;
use std::path::Path;
use std::time::SystemTime;

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
                let (ino, attr) = fs.do_create(parent, &name, mode & !umask, true).await?;
                fs.release(ino, true).await?;
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
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        self.spawn(|fs| async move {
            match fs.release(ino.0, write).await {
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
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name.to_os_string();
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.spawn(|fs| async move {
            match fs.do_create(parent, &name, mode & !umask, write).await {
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

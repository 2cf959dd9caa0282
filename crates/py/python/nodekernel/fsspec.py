"""fsspec filesystem for NodeKernel: `nk://host:port/path` or `nk:///path`.

    import fsspec
    fs = fsspec.filesystem("nk")                     # NK_META, config, default
    fs = fsspec.filesystem("nk", meta="10.0.0.5:9060")
    with fs.open("/jobs/job1/out.bin", "wb") as f:
        f.write(b"...")
    pandas.read_parquet("nk:///jobs/job1/input.parquet")

`nk://host:port/path` connects to the metadata server `host:port`;
`nk:///path` (no host) uses `NK_META`, then the config file, then
127.0.0.1:9060, like `nodekernel.connect()`. The client connects on first
use; fsspec caches one filesystem instance per thread, and the instances with
the same settings share one client per process (a forked or unpickled copy in
another process connects again).

Paths: `/jobs/a` is absolute; a path without the leading `/` is relative
to the root (NodeKernel has no working directory), so `jobs/a` names the
same node, and "" (or ".") is the root. Every name the filesystem returns
(`ls`, `info`, `find`, `glob`, `walk`, ...) has the form of the path it was
asked about: `fs.ls("/jobs")` gives `["/jobs/a", ...]` and `fs.ls("jobs")`
gives `["jobs/a", ...]`, the same entries with the same details. A URL's
path (`nk:///jobs`, `nk://host:port/jobs`) is absolute. Arrow's own
filesystems answer the same way, and PyArrow needs it:
`pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))` reads a dataset by
listing its base directory and requires every name found to start with the
base directory as given, so a relative one works too. (fsspec's memory and
local filesystems make every name absolute: there, PyArrow cannot read a
dataset by a relative path.)

NodeKernel's Directories, Tables and Bags appear as directories; Files and
KeyValues as files. Writing a file under a Table stores a KeyValue; writing
under a missing directory creates the directories first. `info` gives each
node's permission bits (`mode`) and modification time (`mtime`, seconds
since the epoch; `modified` as a UTC datetime); no creation time is kept,
so `created` raises NotImplementedError.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import posixpath
import threading
import uuid
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import stringify_path

from . import Client, connect
from .errors import AlreadyExists, CrossPartition, Error, NotFound, TypeMismatch

PROTOCOL = "nk"
_PREFIX = PROTOCOL + "://"
_CONTAINERS = frozenset(("dir", "table", "bag"))
_COPY_CHUNK = 4 << 20


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


def _split_url(path: str) -> tuple[str | None, str]:
    """`nk://host:port/a/b` -> ("host:port", "/a/b"); `nk:///a` -> (None, "/a")."""
    if path.startswith(_PREFIX):
        rest = path[len(_PREFIX) :]
        netloc, _, tail = rest.partition("/")
        return (netloc or None), "/" + tail
    return None, path


def _normalize(path: str) -> str:
    """An absolute NodeKernel path: leading `/`, no empty, `.` or `..` parts."""
    if not path.startswith("/"):
        path = "/" + path
    path = posixpath.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


def _clean(path: str) -> str:
    """`path` normalized in its own form: an absolute path as `_normalize`
    makes it, a relative one (relative to the root) the same without the
    leading `/` ("" for the root itself)."""
    full = _normalize(path)
    return full if path.startswith("/") else full[1:]


def _abs(path: str) -> str:
    """The absolute NodeKernel path of a path `_clean` made, of either form."""
    return path if path.startswith("/") else "/" + path


def _in_form(name: str, like: str) -> str:
    """The absolute `name` from the cluster in the form of the path `like`
    that was asked about: relative names stay relative."""
    return name if like.startswith("/") else name[1:]


_clients: dict[tuple[Any, ...], Client] = {}
_clients_lock = threading.Lock()


def _shared_client(meta: str | None, config: str | None) -> Client:
    """One client per process and settings: fsspec caches a filesystem
    instance per thread, and they all share it."""
    key = (
        os.getpid(),
        meta,
        config,
        None if meta else os.environ.get("NK_META"),
        None if config else os.environ.get("NK_CONFIG"),
    )
    c = _clients.get(key)
    if c is None:
        with _clients_lock:
            c = _clients.get(key)
            if c is None:
                c = _clients[key] = connect(meta, config)
    return c


def _child(parent: str, name: str) -> str:
    """`name` in the directory `parent` (either form; "" is the root)."""
    return parent.rstrip("/") + "/" + name if parent else name


class NodeKernelFileSystem(AbstractFileSystem):
    """fsspec filesystem over a NodeKernel cluster (protocol `nk`).

    Parameters
    ----------
    meta: "host:port" of the metadata server (several comma separated), else
        taken from `NK_META`, the config file, or 127.0.0.1:9060.
    config: path of a NodeKernel config file (else `NK_CONFIG`).
    """

    protocol = (PROTOCOL,)
    root_marker = "/"
    sep = "/"
    blocksize = 4 << 20

    def __init__(self, meta: str | None = None, config: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.meta = meta
        self.config = config

    @property
    def client(self) -> Client:
        """The NodeKernel client, shared by the instances with the same
        settings in this process (connected on first use, again after a
        fork)."""
        return _shared_client(self.meta, self.config)

    # -- paths --------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        while path.startswith(PROTOCOL + "::"):
            path = path[len(PROTOCOL) + 2 :]
        _, path = _split_url(path)  # a URL's path is absolute
        return _clean(path)

    @classmethod
    def _parent(cls, path):
        """The parent directory, in the form of `path` (the root's is itself)."""
        path = cls._strip_protocol(path)
        return posixpath.dirname(path) if path not in ("", "/") else path

    @staticmethod
    def _get_kwargs_from_urls(path):
        meta, _ = _split_url(stringify_path(path))
        return {"meta": meta} if meta else {}

    def unstrip_protocol(self, name: str) -> str:
        if name.startswith(_PREFIX):
            return name
        return f"{_PREFIX}{self.meta or ''}{_normalize(name)}"

    @property
    def fsid(self) -> str:
        return f"nk_{self.meta or os.environ.get('NK_META', '')}"

    # -- metadata -----------------------------------------------------------

    @staticmethod
    def _to_info(st: dict, like: str) -> dict:
        """fsspec's info of the stat dict `st`, named in the form of `like`."""
        nk_type = st["type"]
        is_dir = nk_type in _CONTAINERS
        out = {
            "name": _in_form(st["name"], like),
            "size": 0 if is_dir else st["size"],
            "type": "directory" if is_dir else "file",
            "nk_type": nk_type,
            "id": st.get("id"),
            "block_size": st.get("block_size"),
            "enumerable": st.get("enumerable", True),
            "mode": st.get("mode"),
            "mtime": st.get("mtime"),
            # When it expires (seconds since the Unix epoch, or None) and a
            # container's TTL for new children (seconds, or None).
            "expires": st.get("expires"),
            "child_ttl": st.get("child_ttl"),
        }
        if is_dir:
            out["children"] = st["size"]
        return out

    def _stat(self, path: str) -> dict:
        try:
            return self.client.stat(_abs(path))
        except TypeMismatch as e:
            # An ancestor is a File or KeyValue: nothing can exist below it.
            raise FileNotFoundError(path) from e

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._to_info(self._stat(path), path)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        try:
            if not detail:
                return [_child(path, n) for n in self.client.ls(_abs(path))]
            entries = self.client.ls(_abs(path), detail=True)
        except TypeMismatch:
            # `ls` of a file lists the file itself, as fsspec expects.
            st = self._stat(path)
            if st["type"] in _CONTAINERS:
                raise
            return [self._to_info(st, path)] if detail else [path]
        return [self._to_info(st, path) for st in entries]

    def exists(self, path, **kwargs):
        try:
            return self.client.exists(_abs(self._strip_protocol(path)))
        except (TypeMismatch, ValueError):
            # Below a File, or not a valid NodeKernel path: nothing there.
            return False

    def du(self, path, total=True, maxdepth=None, withdirs=False, **kwargs):
        """Bytes of the files at and below `path`, as fsspec's `du`. The
        total of a whole subtree (`total=True`, no `maxdepth`) comes from
        the metadata servers' accounting, with no walk, so it is instant
        whatever the subtree's size (and counts the keys of non-enumerable
        Tables too); otherwise fsspec walks (`total=False` maps each path
        to its size). A path that does not exist holds 0 bytes, as
        fsspec's walk finds."""
        if not total or maxdepth is not None:
            return super().du(path, total=total, maxdepth=maxdepth, withdirs=withdirs, **kwargs)
        path = self._strip_protocol(path)
        try:
            return self.client.du(_abs(path))["bytes"]
        except (NotFound, TypeMismatch):
            return 0

    def isdir(self, path):
        try:
            return self.info(path)["type"] == "directory"
        except (OSError, ValueError):
            return False

    def isfile(self, path):
        try:
            return self.info(path)["type"] == "file"
        except (OSError, ValueError):
            return False

    def ukey(self, path):
        st = self.info(path)
        key = f"{_abs(st['name'])}:{st['nk_type']}:{st['id']}:{st['size']}"
        return hashlib.sha256(key.encode()).hexdigest()

    def created(self, path):
        raise NotImplementedError("NodeKernel keeps no creation time (see modified)")

    def modified(self, path):
        """The last modification time (UTC), as the writer's clock said."""
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    # -- directories --------------------------------------------------------

    def mkdir(
        self,
        path,
        create_parents=True,
        type="dir",
        enumerable=True,
        ttl=None,
        child_ttl=None,
        session=None,
        **kwargs,
    ):
        """Makes a Directory (or `type="table"` / `"bag"`) at `path`; with
        `ttl` (seconds, a timedelta, or "never") it expires with its subtree
        that long from now, with `child_ttl` the children made in it that
        name no TTL get that one (docs/lifecycle.md); with `session` (from
        `session()`) it is removed with its subtree when that session ends.

        Raises FileExistsError if `path` exists; with `create_parents`
        (the default) missing parents are made first, else their absence
        raises FileNotFoundError."""
        path = _abs(self._strip_protocol(path))
        if path == "/":
            raise FileExistsError(path)
        c = self.client
        life = {"ttl": ttl, "child_ttl": child_ttl, "session": session}
        try:
            c.mkdir(path, type=type, parents=False, enumerable=enumerable, **life)
        except NotFound:
            if not create_parents:
                raise
            c.mkdir(self._parent(path), parents=True)
            c.mkdir(path, type=type, parents=False, enumerable=enumerable, **life)

    def session(self, lease=None):
        """Opens a session (docs/lifecycle.md, *Sessions*) with a lease of
        `lease` seconds (default 10), renewed in the background while this
        process lives: what `mkdir`, `open` or `pipe_file` make with
        `session=` it is removed, with its subtree, when the session is
        closed (`close()`, or the end of a `with` block) or, if the process
        dies, once the lease lapses."""
        return self.client.session(lease)

    def expire(self, path, ttl):
        """The node at `path` (with its subtree) expires `ttl` (seconds, a
        timedelta) from now, or never (`"never"`): then it is gone as if
        deleted. Returns its info."""
        path = self._strip_protocol(path)
        return self._to_info(self.client.expire(_abs(path), ttl), path)

    def makedirs(self, path, exist_ok=False):
        path = _abs(self._strip_protocol(path))
        if not exist_ok:
            return self.mkdir(path, create_parents=True)
        if path == "/":
            return
        try:
            self.client.mkdir(path, parents=True)
        except AlreadyExists:
            if not self.isdir(path):
                raise
        except TypeMismatch as e:
            # `path` or one of its parents is a File (or a Table cannot
            # hold Directories).
            if self.isdir(path):
                return
            raise FileExistsError(path) from e

    def rmdir(self, path):
        path = _abs(self._strip_protocol(path))
        if self.info(path)["type"] != "directory":
            raise NotADirectoryError(path)
        self.client.delete(path, recursive=False)

    # -- deletion -----------------------------------------------------------

    def rm_file(self, path):
        self.client.delete(_abs(self._strip_protocol(path)), recursive=False)

    def _rm(self, path):
        self.rm_file(path)

    def rm(self, path, recursive=False, maxdepth=None):
        """Deletes files and directories (globs allowed); a non-empty
        directory needs `recursive=True` (else NotEmpty, an OSError)."""
        if maxdepth is None:
            paths = self.expand_path(path, recursive=False)
        else:
            paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        paths = [_abs(p) for p in paths]
        # Children sort after their parents: delete them first.
        for p in sorted(paths, reverse=True):
            try:
                self.client.delete(p, recursive=recursive)
            except NotFound:
                if not any(p.startswith(q + "/") for q in paths if q != p):
                    raise

    # -- reading ------------------------------------------------------------

    def _open_reader(self, path: str):
        try:
            return self.client.open(_abs(path), "rb")
        except TypeMismatch as e:
            if self.isdir(path):
                raise IsADirectoryError(path) from e
            raise FileNotFoundError(path) from e

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        f = self._open_reader(path)
        try:
            size = f.size
            start = 0 if start is None else (max(0, size + start) if start < 0 else start)
            end = size if end is None else (size + end if end < 0 else min(end, size))
            if start >= end:
                return b""
            if start:
                f.seek(start)
            return f.read(end - start)
        finally:
            f.close()

    # -- writing ------------------------------------------------------------

    def _open_writer(self, path: str, mode: str = "wb", kind: str = "file", ttl=None, session=None):
        """A native writer for `path`: "wb" replaces, "xb" fails with
        FileExistsError if `path` exists, "ab" appends. Missing parent
        directories are made; under a Table the node is a KeyValue. With
        `ttl`, the node written expires that long from now; with `session`,
        it goes when that session ends."""
        path = _abs(path)
        c = self.client
        made_parents = False
        while True:
            try:
                if kind == "kv":
                    if mode == "ab":
                        raise TypeMismatch(f"{path}: a KeyValue cannot be appended to", path)
                    if mode == "xb" and c.exists(path):
                        raise AlreadyExists(f"{path} already exists", path)
                    return c.create(path, "kv", ttl=ttl, session=session)
                if mode == "xb":
                    return c.create(path, "file", ttl=ttl, session=session)
                return c.open(path, "ab" if mode == "ab" else "wb", ttl=ttl, session=session)
            except NotFound:
                parent = self._parent(path)
                if made_parents or self.exists(parent):
                    raise
                self.makedirs(parent, exist_ok=True)
                made_parents = True
            except TypeMismatch as e:
                if kind == "file":
                    parent = self._stat(self._parent(path))
                    if parent["type"] == "table":
                        kind = "kv"
                        continue
                    if parent["type"] not in _CONTAINERS:
                        raise NotADirectoryError(self._parent(path)) from e
                if self.isdir(path):
                    raise IsADirectoryError(path) from e
                raise

    def pipe_file(self, path, value, mode="overwrite", ttl=None, session=None, **kwargs):
        """Writes `value` to `path`; with `ttl` the file expires that long
        from now."""
        path = self._strip_protocol(path)
        w = self._open_writer(path, "xb" if mode == "create" else "wb", ttl=ttl, session=session)
        try:
            w.write(value)
        except BaseException:
            # Leave no partial file behind.
            w.close()
            with contextlib.suppress(Error):
                self.client.delete(_abs(path))
            raise
        w.close()

    def touch(self, path, truncate=True, **kwargs):
        """Makes an empty file (replacing one, with `truncate`). Without
        `truncate` an existing file is left as it is (no timestamps)."""
        if truncate or not self.exists(path):
            self.pipe_file(path, b"")

    def cp_file(self, path1, path2, **kwargs):
        """Copies a file's bytes (or makes the directory, for a directory)."""
        src = _abs(self._strip_protocol(path1))
        dst = _abs(self._strip_protocol(path2))
        st = self._stat(src)
        if st["type"] in _CONTAINERS:
            self.makedirs(dst, exist_ok=True)
            return
        if src == dst:
            return
        r = self._open_reader(src)
        try:
            w = self._open_writer(dst, "wb")
            try:
                while True:
                    chunk = r.read(_COPY_CHUNK)
                    if not chunk:
                        break
                    w.write(chunk)
            finally:
                w.close()
        finally:
            r.close()

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """Moves with one rename when `path1` is a single path (file or whole
        directory); globs and lists move by copy and delete."""
        if not (
            isinstance(path1, str)
            and isinstance(path2, str)
            and not _has_magic(path1)
            and maxdepth is None
        ):
            return super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
        src = _abs(self._strip_protocol(path1))
        dst = _abs(self._strip_protocol(path2))
        if src == dst:
            return
        st = self._stat(src)
        into_dir = path2.endswith("/")
        if not into_dir:
            try:
                into_dir = self._stat(dst)["type"] in _CONTAINERS
            except FileNotFoundError:
                pass
        if into_dir:
            dst = _child(dst, posixpath.basename(src))
        c = self.client
        if st["type"] not in _CONTAINERS:
            try:
                old = self._stat(dst)
            except FileNotFoundError:
                pass
            else:
                if old["type"] in _CONTAINERS:
                    raise IsADirectoryError(dst)
                c.delete(dst)  # a file replaces a file, as rename(2) does
        parent = self._parent(dst)
        if not c.exists(parent):
            self.makedirs(parent, exist_ok=True)
        try:
            c.move(src, dst)
        except (CrossPartition, TypeMismatch):
            # Another metadata partition, or a File into a Table (a KeyValue
            # there): copy, then delete.
            self.copy(src, dst, recursive=True, on_error="raise")
            self.rm(src, recursive=True)

    def _open(
        self,
        path,
        mode="rb",
        block_size=None,
        autocommit=True,
        cache_options=None,
        **kwargs,
    ):
        return NodeKernelFile(
            self,
            self._strip_protocol(path),
            mode=mode,
            block_size=block_size,
            autocommit=autocommit,
            cache_options=cache_options,
            **kwargs,
        )


class NodeKernelFile(AbstractBufferedFile):
    """A buffered file on NodeKernel. Reading fetches byte ranges from the
    handle opened at `open` time (a replaced or deleted file raises Stale);
    writing creates the file at `open` time ("wb" replaces, "xb" fails if
    it exists, "ab" appends) and publishes its size on close."""

    DEFAULT_BLOCK_SIZE = 4 << 20

    def __init__(
        self,
        fs: NodeKernelFileSystem,
        path: str,
        mode: str = "rb",
        block_size="default",
        autocommit: bool = True,
        cache_type: str = "readahead",
        cache_options=None,
        ttl=None,
        session=None,
        **kwargs,
    ):
        self._handle: Any = None  # the native File, once opened
        self._lock = threading.Lock()
        self._temp: str | None = None
        if mode == "rb":
            if ttl is not None or session is not None:
                raise ValueError("ttl and session are for writing: mode 'wb', 'xb' or 'ab'")
            self._handle = fs._open_reader(path)
            kwargs["size"] = self._handle.size
        elif mode in ("wb", "xb", "ab"):
            target = path
            if not autocommit:
                if mode == "ab":
                    raise NotImplementedError("append inside a transaction")
                if mode == "xb" and fs.exists(path):
                    raise FileExistsError(path)
                name = f".{posixpath.basename(path)}.nk-{uuid.uuid4().hex[:12]}"
                self._temp = target = _child(fs._parent(path), name)
            self._handle = fs._open_writer(target, mode, ttl=ttl, session=session)
        super().__init__(
            fs,
            path,
            mode=mode,
            block_size=block_size,
            autocommit=autocommit,
            cache_type=cache_type,
            cache_options=cache_options,
            **kwargs,
        )

    def read(self, length=-1):
        """Reads of at least a block that the cache does not hold go
        straight to the handle: one copy, into the returned `bytes`.
        (fsspec's read-ahead cache would fetch a block more and join the
        pieces: two more full copies.) Smaller reads use the cache."""
        if self.mode != "rb" or self.closed or self._cached(self.loc):
            return super().read(length)
        left = max(self.size - self.loc, 0)
        length = left if length is None or length < 0 else min(length, left)
        if length < self.blocksize:
            return super().read(length)
        data = self._fetch_range(self.loc, self.loc + length)
        self.loc += len(data)
        return data

    def readinto(self, b):
        """Large reads fill `b` straight from the handle (no extra copy)."""
        if self.mode != "rb" or self.closed or self._cached(self.loc):
            return super().readinto(b)
        out = memoryview(b).cast("B")
        n = min(len(out), max(self.size - self.loc, 0))
        if n < self.blocksize:
            return super().readinto(b)
        with self._lock:
            self._handle.seek(self.loc)
            got = self._handle.readinto(out[:n])
        self.loc += got
        return got

    def _cached(self, loc: int) -> bool:
        """Whether the read-ahead cache holds the byte at `loc`."""
        c = self.cache
        start, end = getattr(c, "start", 0), getattr(c, "end", 0)
        return start <= loc < end

    def _fetch_range(self, start, end):
        end = min(end, self.size)
        if start >= end:
            return b""
        with self._lock:
            self._handle.seek(start)
            return self._handle.read(end - start)

    def _initiate_upload(self):
        pass  # the writer was opened with the file

    def _upload_chunk(self, final=False):
        buf = self.buffer.getbuffer()
        try:
            if len(buf):
                self._handle.write(buf)
        finally:
            buf.release()
        if final:
            self._handle.close()
        return True

    def commit(self):
        if self._temp is None:
            return
        c = self.fs.client
        path = _abs(self.path)
        if self.mode == "wb" and c.exists(path):
            c.delete(path)
        c.move(_abs(self._temp), path)
        self._temp = None

    def discard(self):
        if self._temp is None:
            return
        try:
            self.fs.client.delete(_abs(self._temp))
        except NotFound:
            pass
        self._temp = None

    def close(self):
        if self.closed:
            return
        try:
            super().close()
        finally:
            # Normally closed already (writers on the final chunk). After a
            # failed write this releases the write lease: what was written
            # stays, as with a local file.
            h = self._handle
            if h is not None and not h.closed:
                try:
                    h.close()
                except Exception:
                    if self.mode == "rb":
                        raise

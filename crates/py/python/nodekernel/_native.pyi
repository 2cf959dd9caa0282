"""Types of the native module (the Rust client, built with PyO3).

Paths are absolute (`/a/b`). Node types are named "dir", "file", "table",
"kv" and "bag". Every method that does I/O releases the GIL. Errors are
`nodekernel.errors.Error` subclasses (see `nodekernel/errors.py`).
"""

from collections.abc import Awaitable, Iterable, Mapping
from datetime import timedelta
from typing import Any, Literal, Optional, Union, final, overload

__all__ = [
    "connect",
    "connect_async",
    "error_codes",
    "Client",
    "AsyncClient",
    "File",
    "AsyncFile",
    "Session",
    "DEFAULT_META",
]

# Aliases for these stubs only (not in the module).
_Buffer = Any  # any object with the buffer protocol (bytes, bytearray, memoryview, numpy)
_ContainerTypeName = Literal["dir", "table", "bag"]
_DataTypeName = Literal["file", "kv"]
_OpenMode = Literal["rb", "wb", "ab"]
_Items = Union[Mapping[str, _Buffer], Iterable[tuple[str, _Buffer]]]
# A TTL (docs/lifecycle.md): seconds above 0, a timedelta, or "never" (not
# even under a parent with a child TTL). A child TTL: seconds or a timedelta.
_Ttl = Union[float, timedelta, Literal["never"]]
_ChildTtl = Union[float, timedelta]

DEFAULT_META: str
"""The metadata server a client uses when nothing else names one."""

def connect(meta: Optional[str] = None, config: Optional[str] = None) -> Client:
    """Connects a synchronous client.

    `meta`: "host:port" (or several, comma separated); else `NK_META`;
    else the `[client]` section of the config file `config` (or
    `NK_CONFIG`); else 127.0.0.1:9060 — the same order as `nk`.
    """

def connect_async(
    meta: Optional[str] = None, config: Optional[str] = None
) -> Awaitable[AsyncClient]: ...
def error_codes() -> list[tuple[int, str]]:
    """The wire error codes as (number, name)."""

@final
class Client:
    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
    def mkdir(
        self,
        path: str,
        type: _ContainerTypeName = "dir",
        parents: bool = False,
        enumerable: bool = True,
        *,
        ttl: Optional[_Ttl] = None,
        child_ttl: Optional[_ChildTtl] = None,
        session: Optional[Session] = None,
    ) -> None:
        """Makes a Directory, Table or Bag. `ttl`: it expires with its
        subtree this long from now; `child_ttl`: the TTL of the children
        created in it that name none; `session`: it is removed with its
        subtree when that session ends (docs/lifecycle.md)."""
    def session(self, lease: Optional[Union[float, timedelta]] = None) -> Session:
        """Opens a session with a lease of `lease` seconds (default 10),
        renewed in the background: nodes made with `session=` go when it
        is closed, or when this process dies and the lease lapses."""
    def create(
        self,
        path: str,
        type: _DataTypeName = "file",
        *,
        ttl: Optional[_Ttl] = None,
        session: Optional[Session] = None,
    ) -> File:
        """Creates a File (or a KeyValue: a put in steps) open for writing;
        with `ttl`, it expires this long after the create; with `session`,
        it goes when that session ends."""
    def expire(self, path: str, ttl: _Ttl) -> dict[str, Any]:
        """The node at `path` (with its subtree) expires `ttl` from now, or
        never ("never"); returns its stat. An expired node is gone as if
        deleted."""
    def set_child_ttl(self, path: str, child_ttl: Optional[_ChildTtl]) -> dict[str, Any]:
        """The container at `path` gives the children created in it from
        now on that name no TTL this one (None: none); returns its stat."""
    def lookup(self, path: str) -> File:
        """Opens an existing data node for reading (a handle: if the node is
        replaced or deleted, its next read raises Stale)."""
    def stat(self, path: str) -> dict[str, Any]:
        """A node's attributes: name (the path), type ("dir", "file",
        "table", "kv" or "bag"), size (bytes for data nodes, the number of
        children for containers), id, block_size, stored (bytes of the
        cluster it takes: its blocks or piece, a container's child records),
        enumerable (bool), encrypted (bool: its clients encrypt its data,
        docs/encryption.md), mode (permission bits), mtime (seconds
        since the Unix epoch), expires (when it expires, seconds since the
        Unix epoch, or None) and child_ttl (a container's TTL for new
        children, in seconds, or None)."""
    @overload
    def ls(self, path: str = "/", detail: Literal[False] = False) -> list[str]:
        """Child names of a container (sorted), or with detail=True the
        stat dict of each child (name = full path)."""
    @overload
    def ls(self, path: str, detail: Literal[True]) -> list[dict[str, Any]]: ...
    @overload
    def ls(self, path: str = "/", *, detail: Literal[True]) -> list[dict[str, Any]]: ...
    @overload
    def ls(
        self, path: str = "/", detail: bool = False
    ) -> Union[list[str], list[dict[str, Any]]]: ...
    def delete(self, path: str, recursive: bool = False) -> None: ...
    def move(self, src: str, dst: str) -> None: ...
    def exists(self, path: str) -> bool: ...
    def status(self) -> dict[str, Any]: ...
    def set_quota(
        self, path: str, bytes: Optional[int] = None, nodes: Optional[int] = None
    ) -> dict[str, Any]:
        """Sets the quota of the Directory, Table or Bag at `path`: at most
        `bytes` of storage held below it (blocks and small values' pieces)
        and at most `nodes` nodes below it; None for no limit (both None
        clears it). A write or create past a limit then raises
        QuotaExceeded (an OSError with errno EDQUOT) naming the quota root,
        and changes nothing. Returns the usage dict (see `du`)."""
    def quota(self, path: str) -> Optional[dict[str, Optional[int]]]:
        """The quota of the container at `path` ({"bytes", "nodes"}, each
        None for no limit), or None."""
    def quotas(self) -> list[dict[str, Any]]:
        """Every quota root of the cluster with its usage (see `du`), in
        path order."""
    def du(self, path: str = "/") -> dict[str, Any]:
        """The disk usage of the subtree at `path`, from the metadata
        servers' accounting (instant whatever its size): path, type, nodes
        (below a container; a data node: 1), bytes (of data: published
        sizes), stored (storage held: blocks and pieces), classes (per
        storage class: class, blocks, piece_bytes) and quota (None, or
        {"bytes", "nodes"})."""
    def put(
        self,
        path: str,
        value: _Buffer,
        *,
        ttl: Optional[_Ttl] = None,
        session: Optional[Session] = None,
    ) -> None:
        """Stores a KeyValue (replacing any old value); with `ttl`, it
        expires this long from now."""
    def get(self, path: str) -> bytes: ...
    def put_many(self, items: _Items, in_flight: int = 64) -> None:
        """Puts many values, each as `put`, with up to `in_flight` (1 to
        4096) puts outstanding: a loader limited by the network, not by
        round trips. `items`: a mapping of key to value or an iterable of
        (key, value) pairs, at most 65,536; values are any bytes-like
        objects (bytes, bytearray, memoryview, NumPy array), read in place
        (a read-only non-bytes buffer is copied once). Every item is tried:
        if any fail, raises `nodekernel.errors.BatchError` once all have
        ended, whose `errors` maps each failed key to its exception (the
        class of its error code); every other item is stored. A key given
        twice keeps its last value. Bad arguments (a non-str key, a value
        without the buffer protocol, too many items) raise before anything
        is put. A value is never stored in part: an item whose put fails
        or is cancelled leaves its key as it was."""
    def get_many(self, keys: Iterable[str], in_flight: int = 64) -> list[Optional[bytes]]:
        """The values of `keys` (at most 65,536), in the order given, each
        as `get` would return it (bytes, allocated once and filled in
        place), with up to `in_flight` gets outstanding; None for a
        missing key (as Java's getMany gives null). Any other failure
        (TypeMismatch for a container, ...) is raised: the first in the
        order given."""
    def delete_many(
        self, keys: Iterable[str], recursive: bool = False, in_flight: int = 64
    ) -> None:
        """Deletes each of `keys` (at most 65,536), each as `delete`, with up
        to `in_flight` deletes outstanding. Every key is tried: if any fail
        (a missing key is `NotFound`, as with `delete`), raises `BatchError`
        listing them once all have ended; every other key is gone."""
    def get_into(self, path: str, buffer: _Buffer) -> int:
        """Reads a whole value into a writable buffer; returns its length.
        Raises ValueError if the buffer is too small."""
    def open(
        self,
        path: str,
        mode: _OpenMode = "rb",
        *,
        ttl: Optional[_Ttl] = None,
        session: Optional[Session] = None,
    ) -> File:
        """ "rb": read a File, KeyValue or Bag; "wb": write a new File,
        replacing one (in a Table: a KeyValue, a put in steps); "ab":
        append to a File (created if missing). `ttl` (writing only): the
        node written expires this long from now; `session` (a node it
        creates only): it goes when that session ends."""
    def close(self) -> None:
        """Closes the client; later calls raise ValueError. Open files keep
        working until closed."""
    def __enter__(self) -> Client: ...
    def __exit__(self, *exc: object) -> None: ...

@final
class File:
    """A node open for reading ("rb") or writing ("wb": new File, "ab":
    append to an existing File). Bags open for reading as one stream."""

    @property
    def name(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def size(self) -> int:
        """Reading: the size when opened; writing: the bytes written so far."""
    @property
    def files(self) -> list[tuple[str, int, int]]:
        """A Bag's Files as (path, offset in the stream, size); else []."""
    def read(self, size: int = -1) -> bytes: ...
    def readinto(self, buffer: _Buffer) -> int: ...
    def readall(self) -> bytes: ...
    def write(self, data: _Buffer) -> int: ...
    def seek(self, offset: int, whence: int = 0) -> int: ...
    def tell(self) -> int: ...
    def flush(self) -> None:
        """Writers: sends buffered bytes and publishes the size (readers
        see the data from then on)."""
    def close(self) -> None: ...
    def abort(self) -> None:
        """Writers: gives up without publishing anything since the last
        flush (a put in steps leaves no value). Leaving a `with` block on
        an exception aborts a KeyValue and closes a File; a writer that is
        garbage collected unclosed is closed (a KeyValue: aborted)."""
    def readable(self) -> bool: ...
    def writable(self) -> bool: ...
    def seekable(self) -> bool: ...
    def __enter__(self) -> File: ...
    def __exit__(self, exc_type: object, exc: object = None, tb: object = None) -> None: ...

@final
class AsyncClient:
    """Same methods as Client, each returning an awaitable. A cancelled
    call has stopped when CancelledError reaches the caller: it no longer
    touches the caller's buffers, and a cancelled put (or put_many)
    leaves nothing."""

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
    def mkdir(
        self,
        path: str,
        type: _ContainerTypeName = "dir",
        parents: bool = False,
        enumerable: bool = True,
        *,
        ttl: Optional[_Ttl] = None,
        child_ttl: Optional[_ChildTtl] = None,
        session: Optional[Session] = None,
    ) -> Awaitable[None]: ...
    def session(self, lease: Optional[Union[float, timedelta]] = None) -> Awaitable[Session]: ...
    def create(
        self,
        path: str,
        type: _DataTypeName = "file",
        *,
        ttl: Optional[_Ttl] = None,
        session: Optional[Session] = None,
    ) -> Awaitable[AsyncFile]: ...
    def expire(self, path: str, ttl: _Ttl) -> Awaitable[dict[str, Any]]: ...
    def set_child_ttl(
        self, path: str, child_ttl: Optional[_ChildTtl]
    ) -> Awaitable[dict[str, Any]]: ...
    def lookup(self, path: str) -> Awaitable[AsyncFile]: ...
    def stat(self, path: str) -> Awaitable[dict[str, Any]]: ...
    @overload
    def ls(self, path: str = "/", detail: Literal[False] = False) -> Awaitable[list[str]]: ...
    @overload
    def ls(self, path: str, detail: Literal[True]) -> Awaitable[list[dict[str, Any]]]: ...
    @overload
    def ls(self, path: str = "/", *, detail: Literal[True]) -> Awaitable[list[dict[str, Any]]]: ...
    @overload
    def ls(
        self, path: str = "/", detail: bool = False
    ) -> Awaitable[Union[list[str], list[dict[str, Any]]]]: ...
    def delete(self, path: str, recursive: bool = False) -> Awaitable[None]: ...
    def move(self, src: str, dst: str) -> Awaitable[None]: ...
    def exists(self, path: str) -> Awaitable[bool]: ...
    def status(self) -> Awaitable[dict[str, Any]]: ...
    def set_quota(
        self, path: str, bytes: Optional[int] = None, nodes: Optional[int] = None
    ) -> Awaitable[dict[str, Any]]: ...
    def quota(self, path: str) -> Awaitable[Optional[dict[str, Optional[int]]]]: ...
    def quotas(self) -> Awaitable[list[dict[str, Any]]]: ...
    def du(self, path: str = "/") -> Awaitable[dict[str, Any]]: ...
    def put(
        self,
        path: str,
        value: _Buffer,
        *,
        ttl: Optional[_Ttl] = None,
        session: Optional[Session] = None,
    ) -> Awaitable[None]: ...
    def get(self, path: str) -> Awaitable[bytes]: ...
    def put_many(self, items: _Items, in_flight: int = 64) -> Awaitable[None]:
        """As Client.put_many. Cancelled, it aborts every put it had started
        and not finished (none leaves anything, nor holds space) and starts
        no other; items already stored stay."""
    def get_many(
        self, keys: Iterable[str], in_flight: int = 64
    ) -> Awaitable[list[Optional[bytes]]]: ...
    def delete_many(
        self, keys: Iterable[str], recursive: bool = False, in_flight: int = 64
    ) -> Awaitable[None]:
        """As Client.delete_many. Cancelled, it starts no further delete;
        one already sent may still happen."""
    def get_into(self, path: str, buffer: _Buffer) -> Awaitable[int]: ...
    def open(
        self,
        path: str,
        mode: _OpenMode = "rb",
        *,
        ttl: Optional[_Ttl] = None,
        session: Optional[Session] = None,
    ) -> Awaitable[AsyncFile]: ...
    def close(self) -> Awaitable[None]: ...
    def __aenter__(self) -> Awaitable[AsyncClient]: ...
    def __aexit__(self, *exc: object) -> Awaitable[None]: ...

@final
class Session:
    """A client's session (docs/lifecycle.md, *Sessions*), renewed in the
    background while open. Nodes made with `session=` are removed, with
    their subtree, when it is closed (`close`, or the end of a `with` /
    `async with` block) or when its lease lapses because this process
    died, hung or was cut off."""

    @property
    def lease(self) -> float:
        """The lease the metadata servers gave, in seconds."""
    @property
    def ended(self) -> bool:
        """Whether it has ended (closed, or its lease lapsed)."""
    def close(self) -> None:
        """Ends it: everything bound to it is removed. Again: nothing."""
    def aclose(self) -> Awaitable[None]: ...
    def __enter__(self) -> Session: ...
    def __exit__(self, *exc: object) -> bool: ...
    def __aenter__(self) -> Awaitable[Session]: ...
    def __aexit__(self, *exc: object) -> Awaitable[None]: ...

@final
class AsyncFile:
    """A File's methods, those that do I/O returning awaitables."""

    @property
    def name(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def size(self) -> int: ...
    @property
    def files(self) -> list[tuple[str, int, int]]: ...
    def read(self, size: int = -1) -> Awaitable[bytes]: ...
    def readinto(self, buffer: _Buffer) -> Awaitable[int]: ...
    def write(self, data: _Buffer) -> Awaitable[int]:
        """A cancelled write poisons the file: its writer is aborted at once
        (nothing since the last flush is published; a put in steps leaves
        no value), later writes, flushes and `close` raise OSError
        (ECANCELED); `abort` does not."""
    def seek(self, offset: int, whence: int = 0) -> int: ...
    def tell(self) -> int: ...
    def flush(self) -> Awaitable[None]: ...
    def close(self) -> Awaitable[None]:
        """Runs to its end even if cancelled."""
    def abort(self) -> Awaitable[None]: ...
    def readable(self) -> bool: ...
    def writable(self) -> bool: ...
    def seekable(self) -> bool: ...
    def __aenter__(self) -> Awaitable[AsyncFile]: ...
    def __aexit__(
        self, exc_type: object, exc: object = None, tb: object = None
    ) -> Awaitable[None]: ...

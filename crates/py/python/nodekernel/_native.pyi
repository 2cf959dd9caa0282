"""Types of the native module (the Rust client, built with PyO3).

Paths are absolute (`/a/b`). Node types are named "dir", "file", "table",
"kv" and "bag". Every method that does I/O releases the GIL. Errors are
`nodekernel.errors.Error` subclasses (see `nodekernel/errors.py`).
"""

from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Literal, Optional, Union

Buffer = Any  # any object with the buffer protocol (bytes, bytearray, memoryview, numpy)
NodeTypeName = Literal["dir", "file", "table", "kv", "bag"]
Items = Union[Mapping[str, Buffer], Iterable[tuple[str, Buffer]]]

def connect(meta: Optional[str] = None, config: Optional[str] = None) -> Client:
    """Connects a synchronous client.

    `meta`: "host:port" (or several, comma separated); else `NK_META`;
    else the `[client]` section of the config file `config` (or
    `NK_CONFIG`); else 127.0.0.1:9060 — the same order as `nk`.
    """

def connect_async(
    meta: Optional[str] = None, config: Optional[str] = None
) -> Awaitable[AsyncClient]: ...

class Stat(dict):
    """A node's attributes, a dict with the keys: name (the path), type
    (NodeTypeName), size (bytes for data nodes, number of children for
    containers), id, block_size, enumerable (bool), encrypted (bool: its
    clients encrypt its data, docs/encryption.md)."""

class Client:
    def mkdir(
        self,
        path: str,
        type: Literal["dir", "table", "bag"] = "dir",
        parents: bool = False,
        enumerable: bool = True,
    ) -> None: ...
    def create(self, path: str, type: Literal["file", "kv"] = "file") -> File:
        """Creates a File (or a KeyValue: a put in steps) open for writing."""
    def lookup(self, path: str) -> File:
        """Opens an existing data node for reading (a handle: if the node is
        replaced or deleted, its next read raises Stale)."""
    def stat(self, path: str) -> dict:
        """name, type, size, id, block_size, enumerable, encrypted, mode
        (permission bits) and mtime (seconds since the Unix epoch)."""
    def ls(self, path: str, detail: bool = False) -> Union[list[str], list[dict]]:
        """Child names of a container (sorted), or with detail=True the
        stat dict of each child (name = full path)."""
    def delete(self, path: str, recursive: bool = False) -> None: ...
    def move(self, src: str, dst: str) -> None: ...
    def exists(self, path: str) -> bool: ...
    def status(self) -> dict: ...
    def put(self, path: str, value: Buffer) -> None:
        """Stores a KeyValue (replacing any old value)."""
    def get(self, path: str) -> bytes: ...
    def put_many(self, items: Items, in_flight: int = 64) -> None:
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
    def get_into(self, path: str, buffer: Buffer) -> int:
        """Reads a whole value into a writable buffer; returns its length.
        Raises ValueError if the buffer is too small."""
    def open(self, path: str, mode: Literal["rb", "wb", "ab"] = "rb") -> File:
        """ "rb": read a File, KeyValue or Bag; "wb": write a new File,
        replacing one (in a Table: a KeyValue, a put in steps); "ab":
        append to a File (created if missing)."""
    def close(self) -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(self, *exc: Any) -> None: ...

class File:
    """A node open for reading ("rb") or writing ("wb": new File, "ab":
    append to an existing File). Bags open for reading as one stream."""

    name: str
    mode: str
    closed: bool
    size: int  # reading: the size when opened; writing: bytes written so far
    files: list[tuple[str, int, int]]  # a Bag: (path, offset, size) of each File; else []
    def read(self, size: int = -1) -> bytes: ...
    def readinto(self, buffer: Buffer) -> int: ...
    def readall(self) -> bytes: ...
    def write(self, data: Buffer) -> int: ...
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
    def __exit__(self, *exc: Any) -> None: ...

class AsyncClient:
    """Same methods as Client, each returning an awaitable. A cancelled
    call has stopped when CancelledError reaches the caller: it no longer
    touches the caller's buffers, and a cancelled put (or put_many)
    leaves nothing."""
    def mkdir(
        self, path: str, type: str = "dir", parents: bool = False, enumerable: bool = True
    ) -> Awaitable[None]: ...
    def create(self, path: str, type: str = "file") -> Awaitable[AsyncFile]: ...
    def lookup(self, path: str) -> Awaitable[AsyncFile]: ...
    def stat(self, path: str) -> Awaitable[dict]: ...
    def ls(self, path: str, detail: bool = False) -> Awaitable[list]: ...
    def delete(self, path: str, recursive: bool = False) -> Awaitable[None]: ...
    def move(self, src: str, dst: str) -> Awaitable[None]: ...
    def exists(self, path: str) -> Awaitable[bool]: ...
    def status(self) -> Awaitable[dict]: ...
    def put(self, path: str, value: Buffer) -> Awaitable[None]: ...
    def get(self, path: str) -> Awaitable[bytes]: ...
    def put_many(self, items: Items, in_flight: int = 64) -> Awaitable[None]:
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
    def get_into(self, path: str, buffer: Buffer) -> Awaitable[int]: ...
    def open(self, path: str, mode: str = "rb") -> Awaitable[AsyncFile]: ...
    def close(self) -> Awaitable[None]: ...
    async def __aenter__(self) -> AsyncClient: ...
    async def __aexit__(self, *exc: Any) -> None: ...

class AsyncFile:
    name: str
    mode: str
    closed: bool
    size: int
    files: list[tuple[str, int, int]]
    def read(self, size: int = -1) -> Awaitable[bytes]: ...
    def readinto(self, buffer: Buffer) -> Awaitable[int]: ...
    def write(self, data: Buffer) -> Awaitable[int]:
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
    async def __aenter__(self) -> AsyncFile: ...
    async def __aexit__(self, *exc: Any) -> None: ...

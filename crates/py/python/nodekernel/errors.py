"""Exceptions: one class per wire error code, each a subclass of `Error`
and, where Python has a matching builtin, of that builtin too (so
`except FileNotFoundError` catches `NotFound`). Every instance carries
`code` (the wire code's name), `path` (the path of the call, or None) and
`message`."""

from __future__ import annotations

import errno as _errno
from typing import Optional


class Error(Exception):
    """Base of every NodeKernel error."""

    code: str = "Error"

    def __init__(self, message: str, path: Optional[str] = None):
        self.message = message
        self.path = path
        super().__init__(message)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class _OSErrorBase(Error, OSError):
    """A NodeKernel error that is also an OSError with an errno."""

    errno_value: int = _errno.EIO

    def __init__(self, message: str, path: Optional[str] = None):
        OSError.__init__(self, self.errno_value, message, path)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


def _os(name: str, errno_value: int, *bases: type, doc: str) -> type:
    return type(
        name,
        (_OSErrorBase, *bases),
        {"code": name, "errno_value": errno_value, "__doc__": doc, "__module__": __name__},
    )


def _plain(name: str, *bases: type, doc: str) -> type:
    return type(name, (Error, *bases), {"code": name, "__doc__": doc, "__module__": __name__})


NotFound = _os("NotFound", _errno.ENOENT, FileNotFoundError, doc="No node at the path.")
AlreadyExists = _os("AlreadyExists", _errno.EEXIST, FileExistsError, doc="The path exists.")
NotEmpty = _os("NotEmpty", _errno.ENOTEMPTY, doc="The container has children.")
TypeMismatch = _os(
    "TypeMismatch", _errno.EINVAL, doc="The node has another type than the operation needs."
)
InvalidPath = _plain("InvalidPath", ValueError, doc="The path is malformed.")
Busy = _os("Busy", _errno.EBUSY, doc="Another writer holds the node.")
Stale = _os(
    "Stale", _errno.ESTALE, doc="The handle's node was replaced or deleted since it was opened."
)
NoSpace = _os("NoSpace", _errno.ENOSPC, doc="No storage server has room.")
OutOfRange = _plain("OutOfRange", ValueError, doc="Offset or length beyond the data.")
CrossPartition = _os("CrossPartition", _errno.EXDEV, doc="A move across metadata partitions.")
Unavailable = _os(
    "Unavailable", _errno.ECONNREFUSED, ConnectionError, doc="A server cannot be reached."
)
DataLost = _os("DataLost", _errno.EIO, doc="The data's storage server is gone.")
Protocol = _os("Protocol", _errno.EPROTO, doc="A malformed message on the wire.")
Timeout = _os("Timeout", _errno.ETIMEDOUT, TimeoutError, doc="No reply in time.")
InvalidArgument = _plain("InvalidArgument", ValueError, doc="A bad argument.")
Internal = _plain("Internal", doc="A bug in NodeKernel.")
LeaseExpired = _os(
    "LeaseExpired", _errno.ESTALE, doc="The write lease lapsed; the writer lost the node."
)
UnknownServer = _os(
    "UnknownServer", _errno.ECONNREFUSED, ConnectionError, doc="A server the cluster dropped."
)
TryAgain = _os("TryAgain", _errno.EAGAIN, BlockingIOError, doc="Retry after a short pause.")
WrongPartition = _plain("WrongPartition", doc="The path belongs to another metadata partition.")
VersionMismatch = _os(
    "VersionMismatch",
    _errno.EPROTO,
    ConnectionError,
    doc="The two ends speak different wire versions.",
)
Unauthenticated = _os(
    "Unauthenticated",
    _errno.EACCES,
    PermissionError,
    doc="The peer could not prove the cluster token, runs as a refused local user, "
    "or held no valid capability; or an encrypted node was read or written without "
    "an encryption key.",
)
Integrity = _os(
    "Integrity",
    _errno.EIO,
    doc="Encrypted data failed its authentication check: its stored bytes were "
    "changed, or written with another encryption key. No bytes are returned.",
)

BY_CODE: dict[str, type] = {
    c.code: c
    for c in (
        NotFound,
        AlreadyExists,
        NotEmpty,
        TypeMismatch,
        InvalidPath,
        Busy,
        Stale,
        NoSpace,
        OutOfRange,
        CrossPartition,
        Unavailable,
        DataLost,
        Protocol,
        Timeout,
        InvalidArgument,
        Internal,
        LeaseExpired,
        UnknownServer,
        TryAgain,
        WrongPartition,
        VersionMismatch,
        Unauthenticated,
        Integrity,
    )
}


class BatchError(Error):
    """Some items of a batched call (`put_many`, `delete_many`) failed; every
    other item succeeded (was stored, was deleted). `errors` maps each
    failed key, in the order given, to its exception: the class of its wire
    code (`NotFound`, `NoSpace`, ...), with the key as its `path`; a key
    given twice maps to its last failure. `total` is the number of items
    in the call. `path` is None."""

    code = "Batch"

    def __init__(self, errors: dict[str, Error], total: int):
        self.errors = errors
        self.total = total
        shown = "; ".join(f"{k}: {type(e).__name__}" for k, e in list(errors.items())[:8])
        more = f"; and {len(errors) - 8} more" if len(errors) > 8 else ""
        super().__init__(f"{len(errors)} of {total} items failed: {shown}{more}")


def _batch(errors: list[tuple[str, Error]], total: int) -> BatchError:
    """Builds a BatchError from (key, exception) pairs (called by the native module)."""
    return BatchError(dict(errors), total)


def _from_code(code: str, message: str, path: Optional[str]) -> Error:
    """Builds the exception for a wire error (called by the native module)."""
    cls = BY_CODE.get(code)
    if cls is None:
        err = Error(message, path)
        err.code = code
        return err
    return cls(message, path)


__all__ = ["Error", "BatchError", "BY_CODE", *BY_CODE]

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


class NotFound(_OSErrorBase, FileNotFoundError):
    """No node at the path."""

    code = "NotFound"
    errno_value = _errno.ENOENT


class AlreadyExists(_OSErrorBase, FileExistsError):
    """The path exists."""

    code = "AlreadyExists"
    errno_value = _errno.EEXIST


class NotEmpty(_OSErrorBase):
    """The container has children."""

    code = "NotEmpty"
    errno_value = _errno.ENOTEMPTY


class TypeMismatch(_OSErrorBase):
    """The node has another type than the operation needs."""

    code = "TypeMismatch"
    errno_value = _errno.EINVAL


class InvalidPath(Error, ValueError):
    """The path is malformed."""

    code = "InvalidPath"


class Busy(_OSErrorBase):
    """Another writer holds the node."""

    code = "Busy"
    errno_value = _errno.EBUSY


class Stale(_OSErrorBase):
    """The handle's node was replaced or deleted since it was opened."""

    code = "Stale"
    errno_value = _errno.ESTALE


class NoSpace(_OSErrorBase):
    """No storage server has room."""

    code = "NoSpace"
    errno_value = _errno.ENOSPC


class OutOfRange(Error, ValueError):
    """Offset or length beyond the data."""

    code = "OutOfRange"


class CrossPartition(_OSErrorBase):
    """A move across metadata partitions."""

    code = "CrossPartition"
    errno_value = _errno.EXDEV


class Unavailable(_OSErrorBase, ConnectionError):
    """A server cannot be reached."""

    code = "Unavailable"
    errno_value = _errno.ECONNREFUSED


class DataLost(_OSErrorBase):
    """The data's storage server is gone."""

    code = "DataLost"
    errno_value = _errno.EIO


class Protocol(_OSErrorBase):
    """A malformed message on the wire."""

    code = "Protocol"
    errno_value = _errno.EPROTO


class Timeout(_OSErrorBase, TimeoutError):
    """No reply in time."""

    code = "Timeout"
    errno_value = _errno.ETIMEDOUT


class InvalidArgument(Error, ValueError):
    """A bad argument."""

    code = "InvalidArgument"


class Internal(Error):
    """A bug in NodeKernel."""

    code = "Internal"


class LeaseExpired(_OSErrorBase):
    """The write lease lapsed; the writer lost the node."""

    code = "LeaseExpired"
    errno_value = _errno.ESTALE


class UnknownServer(_OSErrorBase, ConnectionError):
    """A server the cluster dropped."""

    code = "UnknownServer"
    errno_value = _errno.ECONNREFUSED


class TryAgain(_OSErrorBase, BlockingIOError):
    """Retry after a short pause."""

    code = "TryAgain"
    errno_value = _errno.EAGAIN


class WrongPartition(Error):
    """The path belongs to another metadata partition."""

    code = "WrongPartition"


class VersionMismatch(_OSErrorBase, ConnectionError):
    """The two ends speak different wire versions."""

    code = "VersionMismatch"
    errno_value = _errno.EPROTO


class Unauthenticated(_OSErrorBase, PermissionError):
    """The peer could not prove the cluster token, runs as a refused
    local user, or held no valid capability; or an encrypted node was
    read or written without an encryption key."""

    code = "Unauthenticated"
    errno_value = _errno.EACCES


class Integrity(_OSErrorBase):
    """Encrypted data failed its authentication check: its stored bytes
    were changed, or written with another encryption key. No bytes are
    returned."""

    code = "Integrity"
    errno_value = _errno.EIO


class QuotaExceeded(_OSErrorBase):
    """A write or create would take a subtree past its quota of bytes or
    nodes (`nk quota`); the message names the path whose quota it hit.
    Nothing was changed."""

    code = "QuotaExceeded"
    errno_value = _errno.EDQUOT


BY_CODE: dict[str, type[Error]] = {
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
        QuotaExceeded,
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


__all__ = [
    "Error",
    "BatchError",
    "BY_CODE",
    "NotFound",
    "AlreadyExists",
    "NotEmpty",
    "TypeMismatch",
    "InvalidPath",
    "Busy",
    "Stale",
    "NoSpace",
    "OutOfRange",
    "CrossPartition",
    "Unavailable",
    "DataLost",
    "Protocol",
    "Timeout",
    "InvalidArgument",
    "Internal",
    "LeaseExpired",
    "UnknownServer",
    "TryAgain",
    "WrongPartition",
    "VersionMismatch",
    "Unauthenticated",
    "Integrity",
    "QuotaExceeded",
]

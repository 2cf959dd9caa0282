"""NodeKernel from Python: key-value and file storage for temporary data.

    import nodekernel
    with nodekernel.connect() as nk:          # argument, NK_META, config, default
        nk.put("/cache/a", b"value")
        assert nk.get("/cache/a") == b"value"

`nodekernel.aio.connect()` gives the asyncio client with the same methods
(`nodekernel.aio` comes with `import nodekernel`); `fsspec.filesystem("nk")`
(or `nk://host:port/path` URLs) the fsspec filesystem that pandas, PyArrow
and Dask use. `nodekernel.__version__` is the installed package's version.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Optional

from . import aio, errors
from ._native import DEFAULT_META, AsyncClient, AsyncFile, Client, File, Session
from ._native import connect as _connect
from .errors import *  # noqa: F403
from .errors import NotFound

__all__ = [
    "aio",
    "connect",
    "Client",
    "File",
    "AsyncClient",
    "AsyncFile",
    "Session",
    "Table",
    "errors",
    "DEFAULT_META",
]
__all__ += errors.__all__  # Error, BatchError, BY_CODE and a class per wire code


def _version() -> str:
    """The installed distribution's version; "0+unknown" where there is
    no metadata (the package imported from a source tree, not installed)."""
    from importlib import metadata

    try:
        return metadata.version("nodekernel")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__: str = _version()


def connect(meta: Optional[str] = None, config: Optional[str] = None) -> Client:
    """Connects a synchronous client.

    The metadata server is `meta` ("host:port", or several comma
    separated), else `NK_META`, else the `[client]` section of the config
    file `config` (or `NK_CONFIG`), else 127.0.0.1:9060.
    """
    return _connect(meta, config)


class Table(MutableMapping[str, bytes]):
    """A Table as a mapping of keys to values (`t[key] = b"..."`).

    `Table(client, "/path", create=True)` makes the Table if it does not
    exist. Iteration, `len` and `keys()` need an enumerable Table.
    """

    def __init__(self, client: Client, path: str, create: bool = False, enumerable: bool = True):
        self.client = client
        self.path = path.rstrip("/") or "/"
        if create and not client.exists(self.path):
            client.mkdir(self.path, type="table", parents=True, enumerable=enumerable)

    def _key(self, key: str) -> str:
        if not isinstance(key, str):
            raise TypeError(f"Table keys are str, not {type(key).__name__}")
        if not key or "/" in key:
            raise KeyError(key)
        return f"{self.path}/{key}"

    def __getitem__(self, key: str) -> bytes:
        try:
            return self.client.get(self._key(key))
        except NotFound:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        self.client.put(self._key(key), value)

    def __delitem__(self, key: str) -> None:
        try:
            self.client.delete(self._key(key))
        except NotFound:
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str) or not key or "/" in key:
            return False
        return self.client.exists(f"{self.path}/{key}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.client.ls(self.path))

    def __len__(self) -> int:
        return len(self.client.ls(self.path))

    def __repr__(self) -> str:
        return f"<nodekernel.Table {self.path!r}>"

"""The asyncio client: `client = await nodekernel.aio.connect()`.

Same methods as `nodekernel.Client`, each a coroutine (`await
client.get(path)`); any number of calls may be in flight from one event
loop. Cancelling a call (a timeout, a cancelled task) leaves the client
usable, and the call has stopped by the time CancelledError reaches the
caller: it no longer touches the caller's buffers (`get_into`,
`AsyncFile.readinto`), a cancelled put leaves nothing behind, and a
cancelled `AsyncFile.write` aborts the writer (see `AsyncFile.write`).
"""

from __future__ import annotations

from typing import Optional

from ._native import AsyncClient, AsyncFile
from ._native import connect_async as _connect_async

__all__ = ["connect", "AsyncClient", "AsyncFile"]


async def connect(meta: Optional[str] = None, config: Optional[str] = None) -> AsyncClient:
    """Connects an asyncio client; discovery as in `nodekernel.connect`."""
    return await _connect_async(meta, config)

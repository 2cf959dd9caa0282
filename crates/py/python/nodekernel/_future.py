"""The awaitable of every asyncio call of the native module.

A call runs as a task on the module's tokio runtime. Cancelling its future
(a task cancelled while awaiting it, a `wait_for` timeout) stops that task,
and the future only ends, cancelled, once the task has stopped: like
`asyncio.Task.cancel`, `cancel()` returns True at once and the awaiting
task sees CancelledError later. So once CancelledError reaches the caller
the call no longer touches the caller's memory (the buffer of `get_into` or
`AsyncFile.readinto`, the data of a put or write) and has let go of it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional


class NativeFuture(asyncio.Future[Any]):
    """An `asyncio.Future` resolved by the native module; `stop` stops its
    task, after which the module calls `_nk_resolve` once the task is gone."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None]):
        super().__init__(loop=loop)
        self._nk_stop: Optional[Callable[[], None]] = stop
        self._nk_cancel_msg: Any = None

    def cancel(self, msg: Any = None) -> bool:
        if self.done():
            return False
        if self._nk_stop is not None:
            stop, self._nk_stop = self._nk_stop, None
            self._nk_cancel_msg = msg
            stop()
        return True

    def _nk_resolve(self, ok: bool, value: Any) -> None:
        """The task has ended, with a result (`ok`) or an exception; a
        future whose cancellation was asked for ends cancelled either way."""
        if self.done():
            return
        if self._nk_stop is None:
            super().cancel(msg=self._nk_cancel_msg)
        elif ok:
            self.set_result(value)
        else:
            self.set_exception(value)
